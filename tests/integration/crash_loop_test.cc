// kill -9 of kvtierd under mixed load, cycle after cycle on the same NVMe
// file and index (`kvtier stress --crash-loop`, tools/stress/stress_crash.h):
// every restart opens the index without dropping entries, no read ever
// returns a wrong byte, and every block acknowledged durable on NVMe
// before a kill is there afterwards or reported missing (always there when
// nothing ran after the acknowledgment). KVTIER_CRASH_LOOP_CYCLES sets the
// cycles (default 20).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/testing/daemon_process.h"
#include "tests/testing/test_daemon.h"

namespace kvtier::testing {
namespace {

int Cycles() {
  const char* env = std::getenv("KVTIER_CRASH_LOOP_CYCLES");
  return env != nullptr && std::atoi(env) > 0 ? std::atoi(env) : 20;
}

// One `kvtier stress --crash-loop` of Cycles() kills in `dir`, with
// `extra` arguments; its JSON report (empty if none was written).
std::string RunLoop(const std::string& dir, const std::vector<std::string>& extra, CommandResult& run) {
  std::vector<std::string> argv = {KVTIER_TOOL_PATH, "stress", "--spawn", "--kvtierd", KVTIERD_PATH, "--crash-loop",
                                   std::to_string(Cycles()), "--clients", "4", "--cycle-seconds", "1",
                                   // Smaller than the key space, so regions are reclaimed between kills,
                                   // racing reinsertion's copies forward (at the daemon's default share).
                                   "--nvme-bytes", "24MiB", "--json", dir + "/crash.json"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  run = RunCommand(argv);
  return ReadFile(dir + "/crash.json");
}

// What every loop must end with: all kills done, no wrong byte under load
// or after a restart, no acknowledged block lost, no index repaired, no
// problem. Returns where the loop's part of the report starts (npos: none).
size_t ExpectACleanLoop(const std::string& json, const CommandResult& run) {
  EXPECT_FALSE(json.empty()) << run.output;
  const size_t crash = json.find("\"crash_loop\"");
  EXPECT_NE(crash, std::string::npos) << json;
  if (crash == std::string::npos) return crash;
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(JsonInt(json, "kills", crash), Cycles()) << run.output;
  EXPECT_EQ(JsonInt(json, "violations", json.find("\"operations\"")), 0) << run.output;
  EXPECT_EQ(JsonInt(json, "durability_violations", crash), 0) << run.output;
  EXPECT_EQ(JsonInt(json, "repairs", crash), 0) << run.output;
  EXPECT_EQ(JsonInt(json, "verify_violations", crash), 0) << run.output;
  EXPECT_NE(json.find("\"problems\": []"), std::string::npos) << run.output;
  return crash;
}

TEST(CrashLoop, KillNineUnderMixedLoadNeverServesAWrongByteNorLosesAnAcknowledgedBlock) {
  const std::string dir = MakeTempDir();
  CommandResult run;
  const std::string json = RunLoop(dir, {}, run);
  const size_t crash = ExpectACleanLoop(json, run);
  ASSERT_NE(crash, std::string::npos);
  // Blocks do survive kills, and acknowledged ones were checked.
  EXPECT_GT(JsonInt(json, "blocks_verified", crash), 0) << run.output;
  EXPECT_GT(JsonInt(json, "acked_survived", crash), 0) << run.output;
  EXPECT_GT(JsonInt(json, "operations"), 0) << run.output;
  RecordProperty("blocks_verified", static_cast<int>(JsonInt(json, "blocks_verified", crash)));
  RecordProperty("acked", static_cast<int>(JsonInt(json, "acked", crash)));
  RecordProperty("lost_but_reported", static_cast<int>(JsonInt(json, "lost_but_reported", crash)));
  RemoveTree(dir);
}

// The same loop with kvtierd under a descriptor store (as systemd's fd
// store): its host tier survives every kill. Every block the host tier held
// at a strict checkpoint (killed with no load after it) is a host hit after
// the restart, byte-exact (every read is checked), and no kept block fails
// its checksum.
TEST(CrashLoop, KillNineKeepsTheHostTierWithEveryCommittedBlockAndNoWrongByte) {
  const std::string dir = MakeTempDir();
  CommandResult run;
  const std::string json = RunLoop(dir, {"--keep-host"}, run);
  const size_t crash = ExpectACleanLoop(json, run);
  ASSERT_NE(crash, std::string::npos);
  EXPECT_EQ(JsonInt(json, "host_violations", crash), 0) << run.output;
  EXPECT_EQ(JsonInt(json, "host_adopt_corrupt", crash), 0) << run.output;
  // The host tier did hold blocks at checkpoints, and they came back.
  EXPECT_GT(JsonInt(json, "host_acked", crash), 0) << run.output;
  EXPECT_GT(JsonInt(json, "host_survived", crash), 0) << run.output;
  RecordProperty("host_acked", static_cast<int>(JsonInt(json, "host_acked", crash)));
  RecordProperty("host_survived", static_cast<int>(JsonInt(json, "host_survived", crash)));
  RemoveTree(dir);
}

}  // namespace
}  // namespace kvtier::testing

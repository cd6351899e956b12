// `kvtier bench|replay|stress|trace` run their sibling executables
// (tools/cli/sibling.h): arguments pass through unchanged, the sibling's exit
// status comes back, and a kvtier without its siblings says which one is
// missing and exits 127.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "tests/testing/daemon_process.h"
#include "tests/testing/test_daemon.h"

namespace kvtier::testing {
namespace {

TEST(ToolDispatch, EachCommandRunsItsSiblingWithTheArgumentsUnchanged) {
  for (const std::string command : {"bench", "replay", "stress", "trace"}) {
    const CommandResult help = RunCommand({KVTIER_TOOL_PATH, command, "--help"});
    EXPECT_EQ(help.exit_code, 0) << command << ": " << help.output;
    EXPECT_NE(help.output.find("kvtier " + command), std::string::npos) << help.output;
  }
  // A nested subcommand and its options reach the sibling as given.
  const CommandResult gen = RunCommand({KVTIER_TOOL_PATH, "trace", "gen", "multi-round-qa", "--help"});
  EXPECT_EQ(gen.exit_code, 0) << gen.output;
  EXPECT_NE(gen.output.find("multi-round-qa"), std::string::npos) << gen.output;
  const CommandResult nvme = RunCommand({KVTIER_TOOL_PATH, "bench", "nvme", "--help"});
  EXPECT_EQ(nvme.exit_code, 0) << nvme.output;
  EXPECT_NE(nvme.output.find("nvme"), std::string::npos) << nvme.output;
}

TEST(ToolDispatch, TheSiblingsExitStatusComesBack) {
  EXPECT_EQ(RunCommand({KVTIER_TOOL_PATH, "trace", "gen", "no-such-trace"}).exit_code, 2);
  EXPECT_EQ(RunCommand({KVTIER_TOOL_PATH, "replay", "--no-such-option"}).exit_code, 2);
  EXPECT_NE(RunCommand({KVTIER_TOOL_PATH, "bench", "no-such-bench"}).exit_code, 0);
}

TEST(ToolDispatch, AMissingSiblingIsNamedAndExits127) {
  const std::string dir = MakeTempDir();
  const std::string lone = dir + "/kvtier";
  std::filesystem::copy_file(KVTIER_TOOL_PATH, lone);
  const CommandResult r = RunCommand({lone, "trace", "--help"});
  EXPECT_EQ(r.exit_code, 127) << r.output;
  EXPECT_NE(r.output.find("kvtier-trace"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(dir + "/kvtier-trace"), std::string::npos) << r.output;  // where it looked
  // The admin commands need no sibling.
  const CommandResult admin = RunCommand({lone, "stats", "--help"});
  EXPECT_EQ(admin.exit_code, 0) << admin.output;
  RemoveTree(dir);
}

}  // namespace
}  // namespace kvtier::testing

// kvtierd as a process: command line, config files, signals, and the
// `kvtier stats` tool talking to it.
#include <gtest/gtest.h>

#include <csignal>
#include <fstream>
#include <future>
#include <sstream>

#include "tests/testing/daemon_process.h"
#include "tests/testing/test_daemon.h"

namespace kvtier::testing {
namespace {

constexpr const char* kSmallArena = "[host]\ncapacity_bytes = \"64MiB\"\nlock_memory = \"off\"\n";

TEST(KvtierdProcess, HelpListsEveryOption) {
  CommandResult r = RunCommand({KVTIERD_PATH, "--help"});
  EXPECT_EQ(r.exit_code, 0);
  for (const char* option : {"server.socket_path", "server.max_frame_bytes", "host.capacity_bytes", "host.lock_memory",
                             "engine.eviction", "log.level", "--config"}) {
    EXPECT_NE(r.output.find(option), std::string::npos) << option << " missing from --help";
  }
}

TEST(KvtierdProcess, PrintDefaultConfigIsAValidConfig) {
  CommandResult r = RunCommand({KVTIERD_PATH, "--print-default-config"});
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_NE(r.output.find("capacity_bytes = 0\n"), std::string::npos) << r.output;
}

TEST(KvtierdProcess, BadConfigFailsWithTheKeyAndLine) {
  std::string dir = MakeTempDir();
  std::string path = dir + "/bad.toml";
  FILE* f = std::fopen(path.c_str(), "w");
  std::fputs("[host]\ncapacity_bytes = \"12 parsecs\"\n", f);
  std::fclose(f);
  CommandResult r = RunCommand({KVTIERD_PATH, "--config", path});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("host.capacity_bytes"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(":2"), std::string::npos) << "line number missing: " << r.output;
  CommandResult missing = RunCommand({KVTIERD_PATH, "--config", dir + "/nope.toml"});
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.output.find("nope.toml"), std::string::npos) << missing.output;
  RemoveTree(dir);
}

// The embedded default host.capacity_bytes (0) sizes the arena to the
// machine (here a 1 GiB one with 800 MiB available, through
// $KVTIER_MEMINFO), says so in its log, and `kvtier config get` shows it.
TEST(KvtierdProcess, TheDefaultHostTierIsSizedToTheMachine) {
  const std::string dir = MakeTempDir();
  std::ofstream(dir + "/meminfo") << "MemTotal:        1048576 kB\nMemAvailable:     819200 kB\n";
  ::setenv("KVTIER_MEMINFO", (dir + "/meminfo").c_str(), 1);  // inherited by the child
  DaemonProcess daemon(KVTIERD_PATH, "", "[host]\nlock_memory = \"off\"\n");
  ::unsetenv("KVTIER_MEMINFO");
  ASSERT_TRUE(daemon.running());
  std::ifstream in(daemon.log_path());
  std::stringstream log;
  log << in.rdbuf();
  EXPECT_NE(log.str().find("host.capacity_bytes = 0 (auto): 256 MiB of this machine's 1024 MiB (800 MiB available)"),
            std::string::npos)
      << log.str();
  CommandResult got =
      RunCommand({KVTIER_TOOL_PATH, "config", "get", "host.capacity_bytes", "--socket", daemon.socket_path()});
  ASSERT_EQ(got.exit_code, 0) << got.output;
  EXPECT_EQ(got.output, std::to_string(256 << 20) + "\n");
  RemoveTree(dir);
}

// With host.capacity_bytes set, the auto client memory is still a
// sixteenth of the machine (here 32 GiB), not the floor of a machine
// never read.
TEST(KvtierdProcess, TheAutoClientMemoryIsSizedToTheMachineWhenTheHostTierIsNot) {
  const std::string dir = MakeTempDir();
  std::ofstream(dir + "/meminfo") << "MemTotal:       33554432 kB\nMemAvailable:   16777216 kB\n";
  ::setenv("KVTIER_MEMINFO", (dir + "/meminfo").c_str(), 1);  // inherited by the child
  DaemonProcess daemon(KVTIERD_PATH, "", kSmallArena);
  ::unsetenv("KVTIER_MEMINFO");
  ASSERT_TRUE(daemon.running());
  CommandResult got =
      RunCommand({KVTIER_TOOL_PATH, "config", "get", "server.client_memory_bytes", "--socket", daemon.socket_path()});
  ASSERT_EQ(got.exit_code, 0) << got.output;
  EXPECT_EQ(got.output, std::to_string(2048ull << 20) + "\n");
  RemoveTree(dir);
}

// With host.allocate_at_start_bytes kvtierd allocates that much of its
// host arena before it serves and the rest behind the socket; a machine
// that cannot hold the arena (here 4 GiB asked, 2 GiB available through
// $KVTIER_MEMINFO) still fails the start, naming the sizes, before it
// allocates anything, as allocating it all up front would have.
TEST(KvtierdProcess, AHostArenaTheMachineCannotHoldFailsTheStart) {
  const std::string dir = MakeTempDir();
  std::ofstream(dir + "/meminfo") << "MemTotal:        8388608 kB\nMemAvailable:    2097152 kB\n";
  std::ofstream(dir + "/k.toml") << "[server]\nsocket_path = \"" << dir
                                 << "/s.sock\"\n[host]\ncapacity_bytes = \"4GiB\"\nallocate_at_start_bytes = \"1GiB\"\n"
                                    "lock_memory = \"off\"\n"
                                    "[events]\nenabled = false\n";
  ::setenv("KVTIER_MEMINFO", (dir + "/meminfo").c_str(), 1);  // inherited by the child
  CommandResult r = RunCommand({KVTIERD_PATH, "--config", dir + "/k.toml"});
  ::unsetenv("KVTIER_MEMINFO");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("needs 4096 MiB it has not allocated"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("2048 MiB available (MemAvailable"), std::string::npos) << r.output;
  RemoveTree(dir);
}

TEST(KvtierdProcess, StatsToolTalksToTheDaemon) {
  DaemonProcess daemon(KVTIERD_PATH, "", kSmallArena);
  ASSERT_TRUE(daemon.running());
  CommandResult r = RunCommand({KVTIER_TOOL_PATH, "stats", "--socket", daemon.socket_path()});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("engine.commits"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("host.arena.capacity_bytes"), std::string::npos) << r.output;
  CommandResult nobody = RunCommand({KVTIER_TOOL_PATH, "stats", "--socket", daemon.socket_path() + ".x"});
  EXPECT_EQ(nobody.exit_code, 3) << "unreachable (docs/OPERATIONS.md, Admin commands)";
  EXPECT_NE(nobody.output.find("no kvtierd listening"), std::string::npos) << nobody.output;
}

// Requests already written when SIGTERM arrives are answered; then the
// daemon exits 0 and removes its socket.
TEST(KvtierdProcess, SigtermDrainsInFlightRequestsAndExitsZero) {
  DaemonProcess daemon(KVTIERD_PATH, "", kSmallArena);
  ASSERT_TRUE(daemon.running());
  ClientOptions options;
  options.socket_path = daemon.socket_path();
  options.namespaces = {TestNamespace()};
  options.use_directory = false;  // every lookup must be a request on the socket
  auto client = Client::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto keys = TestKeys(TestNamespace(), 64, 1);
  std::vector<std::byte> block(64 << 10);
  FillBlockBytes(keys[0], 0, block);
  ASSERT_TRUE((*client)->Put(0, keys[0], block).ok());

  std::vector<std::future<Result<LookupResult>>> in_flight;
  for (int i = 0; i < 500; ++i) in_flight.push_back((*client)->LookupAsync(0, keys));
  EXPECT_EQ(daemon.SignalAndWait(SIGTERM, 10000), 0);
  for (auto& f : in_flight) {
    auto r = f.get();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->prefix_blocks, 1u);
  }
  auto after = (*client)->Lookup(0, keys);
  EXPECT_EQ(after.status().code(), StatusCode::kUnavailable) << after.status().ToString();
  EXPECT_NE(::access(daemon.socket_path().c_str(), F_OK), 0) << "socket file left behind";
}

TEST(KvtierdProcess, SecondDaemonOnTheSameSocketRefuses) {
  DaemonProcess first(KVTIERD_PATH, "", kSmallArena);
  ASSERT_TRUE(first.running());
  std::string dir = MakeTempDir();
  std::string path = dir + "/second.toml";
  FILE* f = std::fopen(path.c_str(), "w");
  std::fprintf(f, "[server]\nsocket_path = \"%s\"\n%s", first.socket_path().c_str(), kSmallArena);
  std::fclose(f);
  CommandResult r = RunCommand({KVTIERD_PATH, "--config", path});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("already listening"), std::string::npos) << r.output;
  RemoveTree(dir);
}

// hbm.enabled = auto (the default): with a GPU the HBM tier runs; without
// one (or without CUDA in the build) kvtierd says why in one warning and
// serves without it. hbm.enabled = on makes the missing GPU fatal.
TEST(KvtierdProcess, WithoutAGpuTheHbmTierIsLoggedAndLeftOut) {
  DaemonProcess daemon(KVTIERD_PATH, "", kSmallArena);
  ASSERT_TRUE(daemon.running());
  ClientOptions options;
  options.socket_path = daemon.socket_path();
  options.namespaces = {TestNamespace()};
  auto client = Client::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto keys = TestKeys(TestNamespace(), 1, 2);
  std::vector<std::byte> block(64 << 10);
  FillBlockBytes(keys[0], 0, block);
  ASSERT_TRUE((*client)->Put(0, keys[0], block).ok());
  std::stringstream log;
  log << std::ifstream(daemon.log_path()).rdbuf();
  const bool with_gpu = log.str().find("tier hbm: ") != std::string::npos;
  if (with_gpu) {
    EXPECT_EQ(log.str().find("hbm tier (hbm.enabled = auto): "), std::string::npos) << log.str();
    return;
  }
  EXPECT_NE(log.str().find("hbm tier (hbm.enabled = auto): "), std::string::npos) << log.str();

  std::string dir = MakeTempDir();
  std::string path = dir + "/hbm_on.toml";
  FILE* f = std::fopen(path.c_str(), "w");
  std::fprintf(f, "[server]\nsocket_path = \"%s/s.sock\"\n%s[hbm]\nenabled = \"on\"\n", dir.c_str(), kSmallArena);
  std::fclose(f);
  CommandResult r = RunCommand({KVTIERD_PATH, "--config", path});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("hbm tier (hbm.enabled = on): "), std::string::npos) << r.output;
  RemoveTree(dir);
}

}  // namespace
}  // namespace kvtier::testing

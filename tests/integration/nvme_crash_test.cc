// kill -9 of kvtierd under write load, again and again, on the same NVMe
// files: after every restart each block is either missing or byte-exact
// (self-describing values), and blocks do survive.
#include <gtest/gtest.h>

#include <atomic>
#include <csignal>
#include <random>
#include <thread>

#include "tests/testing/daemon_process.h"
#include "tests/testing/test_daemon.h"

namespace kvtier::testing {
namespace {

constexpr size_t kBlockBytes = 64 << 10;  // TestNamespace(): a whole block
constexpr int kCycles = 12;
constexpr size_t kKeysPerCycle = 400;

std::string Config(const std::string& dir) {
  return "[host]\ncapacity_bytes = \"4MiB\"\nlock_memory = \"off\"\n"
         "[nvme]\npath = \"" +
         dir +
         "/tier.dat\"\ncapacity_bytes = \"24MiB\"\nregion_bytes = \"2MiB\"\n"
         "admission = \"all\"\n"
         "staging_bytes = \"8MiB\"\n";
}

TEST(NvmeCrash, KillNineUnderWriteLoadNeverServesAWrongByte) {
  const std::string dir = MakeTempDir();
  const uint64_t seed = std::random_device{}();
  std::mt19937_64 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::vector<BlockKey> written;  // every key ever put (content: FillBlockBytes(key, 0))
  int64_t served_after_restart = 0;
  std::vector<std::byte> dst(kBlockBytes);
  for (int cycle = 0; cycle < kCycles; ++cycle) {
    DaemonProcess daemon(KVTIERD_PATH, "", Config(dir));
    ASSERT_TRUE(daemon.running()) << "cycle " << cycle << ": kvtierd did not start";
    ClientOptions options;
    options.socket_path = daemon.socket_path();
    options.namespaces = {TestNamespace()};
    auto client = Client::Connect(options);
    ASSERT_TRUE(client.ok()) << client.status().ToString();

    // Everything that survived the last crash must be exact.
    for (const BlockKey& key : written) {
      auto got = (*client)->Get(0, key, dst);
      if (!got.ok()) {
        ASSERT_EQ(got.status().code(), StatusCode::kNotFound) << got.status().ToString();
        continue;
      }
      ASSERT_EQ(*got, kBlockBytes);
      ASSERT_TRUE(CheckBlockBytes(key, 0, dst)) << "cycle " << cycle << ": wrong bytes after a crash";
      ++served_after_restart;
    }

    // Write load (4.7x the arena per cycle: demotions all the time), cut by SIGKILL.
    const auto keys = TestKeys(TestNamespace(), kKeysPerCycle, 1000 + cycle);
    std::atomic<size_t> attempted{0};
    std::thread writer([&] {
      std::vector<std::byte> block(kBlockBytes);
      for (const BlockKey& key : keys) {
        FillBlockBytes(key, 0, block);
        attempted = attempted + 1;
        if (!(*client)->Put(0, key, block).ok()) return;  // the daemon is gone
      }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(30 + rng() % 400));
    EXPECT_EQ(daemon.SignalAndWait(SIGKILL, 5000), -1) << "killed by the signal";
    writer.join();
    written.insert(written.end(), keys.begin(), keys.begin() + attempted.load());
  }
  // A final clean start: the same check, and some blocks must have survived.
  DaemonProcess daemon(KVTIERD_PATH, "", Config(dir));
  ASSERT_TRUE(daemon.running());
  ClientOptions options;
  options.socket_path = daemon.socket_path();
  options.namespaces = {TestNamespace()};
  auto client = Client::Connect(options);
  ASSERT_TRUE(client.ok());
  for (const BlockKey& key : written) {
    auto got = (*client)->Get(0, key, dst);
    if (got.ok()) {
      ASSERT_TRUE(CheckBlockBytes(key, 0, dst)) << "wrong bytes after the last crash";
      ++served_after_restart;
    }
  }
  EXPECT_GT(served_after_restart, 0) << "no block ever survived a restart";
  RecordProperty("served_after_restart", static_cast<int>(served_after_restart));
  RemoveTree(dir);
}

}  // namespace
}  // namespace kvtier::testing

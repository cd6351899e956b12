// ENOSPC from a real, full file system (a size-capped tmpfs, so this needs
// root; skipped with a message otherwise): the NVMe tier marks itself full,
// the host tier keeps serving, and writes resume once space returns and
// the tier's retry interval passed on the daemon's (fake) clock.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/testing/fake_clock.h"
#include "tests/testing/test_daemon.h"

namespace kvtier::testing {
namespace {

constexpr size_t kBlockBytes = 64 << 10;

std::map<std::string, int64_t> Stats(Client& client) {
  std::map<std::string, int64_t> out;
  auto stats = client.Stats();
  EXPECT_TRUE(stats.ok());
  if (stats.ok()) {
    for (const auto& c : *stats) out[c.name] = c.value;
  }
  return out;
}

class NvmeFullTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to mount a size-capped tmpfs";
    dir_ = MakeTempDir();
    mount_ = dir_ + "/fs";
    ::mkdir(mount_.c_str(), 0700);
    const std::string cmd = "mount -t tmpfs -o size=8m kvtier-enospc-test " + mount_ + " 2>/dev/null";
    if (std::system(cmd.c_str()) != 0) GTEST_SKIP() << "cannot mount a tmpfs here (container without CAP_SYS_ADMIN?)";
    mounted_ = true;
  }
  void TearDown() override {
    if (mounted_) std::system(("umount " + mount_).c_str());
    if (!dir_.empty()) RemoveTree(dir_);
  }
  std::string dir_, mount_;
  bool mounted_ = false;
};

TEST_F(NvmeFullTest, FullFileSystemMarksTheTierFullHostKeepsServingWritesResume) {
  const std::string filler = mount_ + "/filler";
  {
    std::ofstream out(filler, std::ios::binary);
    std::string chunk(1 << 20, 'x');
    for (int i = 0; i < 5; ++i) out << chunk;  // 5 of the 8 MiB
  }
  TestDaemonOptions options;
  options.arena_bytes = 2 << 20;
  options.nvme_path = mount_ + "/tier.dat";  // sparse: 16 MiB on a file system with ~3 MiB free
  options.nvme_bytes = 16 << 20;
  options.nvme_region_bytes = 1 << 20;
  options.nvme_preallocate = false;
  options.nvme_index_path = dir_ + "/index";  // the index needs a file system with room
  FakeClock clock;
  options.clock = &clock;
  TestDaemon daemon(options);
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);

  // The daemon's clock moves 1 us a request (the host tier's LRU orders by
  // it), and by the tier's retry interval where the test says so.
  std::vector<std::byte> block(kBlockBytes), dst(kBlockBytes);
  auto put = [&](const BlockKey& k) {
    clock.AdvanceUs(1);
    FillBlockBytes(k, 0, block);
    return client->Put(0, k, block);
  };
  auto get = [&](const BlockKey& k) {
    clock.AdvanceUs(1);
    return client->Get(0, k, dst);
  };

  auto keys = TestKeys(TestNamespace(), 200, 31);  // 12.5 MiB through a 2 MiB arena
  for (const auto& k : keys) ASSERT_TRUE(put(k).ok()) << "the host tier must keep accepting writes";
  daemon.engine().WaitForIdle();
  auto s = Stats(*client);
  EXPECT_GE(s["nvme.enospc"], 1) << "the file system never filled up";
  EXPECT_EQ(s["nvme.full"], 1);
  EXPECT_GT(s["nvme.blocks"], 0) << "some blocks fit before the disk filled";
  // `kvtier health` says so: unhealthy, and why.
  auto health = client->Health();
  ASSERT_TRUE(health.ok()) << health.status().ToString();
  EXPECT_FALSE(health->healthy);
  ASSERT_EQ(health->problems.size(), 1u);
  EXPECT_NE(health->problems[0].find("the nvme tier is full"), std::string::npos) << health->problems[0];

  // The host tier serves (the newest block is in DRAM); every block is a
  // miss or exact.
  auto tail = get(keys.back());
  ASSERT_TRUE(tail.ok()) << tail.status().ToString();
  EXPECT_TRUE(CheckBlockBytes(keys.back(), 0, dst));
  for (const auto& k : keys) {
    auto got = get(k);
    if (got.ok()) {
      ASSERT_TRUE(CheckBlockBytes(k, 0, dst));
    }
  }

  // Space returns, but the tier tries again only once its retry interval
  // passed on its clock: until then a write is refused unwritten.
  ASSERT_EQ(::unlink(filler.c_str()), 0);
  const BlockKey probe = TestKeys(TestNamespace(), 1, 33)[0];
  FillBlockBytes(probe, 0, block);
  const Status refused = daemon.nvme()->Write(FingerprintNamespace(TestNamespace()), probe, 1, block, [](Status) {});
  EXPECT_EQ(refused.code(), StatusCode::kNoSpace) << "the tier tried again before its retry interval passed";
  EXPECT_EQ(Stats(*client)["nvme.full"], 1);
  // After the retry interval demotions are written again.
  clock.AdvanceUs(static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(NvmeTierOptions{}.full_retry).count()));
  const int64_t writes_before = Stats(*client)["nvme.writes"];
  auto more = TestKeys(TestNamespace(), 100, 32);
  for (const auto& k : more) ASSERT_TRUE(put(k).ok());
  daemon.engine().WaitForIdle();
  s = Stats(*client);
  EXPECT_EQ(s["nvme.full"], 0) << "writes did not resume after space returned";
  health = client->Health();
  ASSERT_TRUE(health.ok());
  EXPECT_TRUE(health->healthy) << (health->problems.empty() ? "" : health->problems[0]);
  EXPECT_GT(s["nvme.writes"], writes_before);
  for (const auto& k : more) {
    auto got = get(k);
    if (got.ok()) {
      ASSERT_TRUE(CheckBlockBytes(k, 0, dst));
    }
  }
}

}  // namespace
}  // namespace kvtier::testing

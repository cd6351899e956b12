// kvtierd in a memory cgroup (daemon/setup/memory_limit.h): it finds the limit in
// cgroup v1 and v2 layouts (fake trees here; the real one in
// tests/integration/memory_pressure_test.cc), takes the lowest along the
// path, sizes "auto" under it and refuses sizes that cannot fit.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "daemon/config/config.h"
#include "daemon/setup/memory_limit.h"
#include "tests/testing/test_daemon.h"

namespace kvtier {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;

class MemoryLimitTest : public ::testing::Test {
 protected:
  void SetUp() override { root_ = testing::MakeTempDir(); }
  void TearDown() override { testing::RemoveTree(root_); }

  void Write(const std::string& relative, const std::string& text) {
    const std::filesystem::path path = root_ + "/" + relative;
    std::filesystem::create_directories(path.parent_path());
    std::ofstream(path) << text;
  }
  std::optional<CgroupMemory> Read() { return ReadCgroupMemory(root_ + "/proc_cgroup", root_ + "/sys"); }

  std::string root_;
};

TEST_F(MemoryLimitTest, V1TakesTheLowestLimitOnThePathAndTheOwnUsage) {
  Write("proc_cgroup", "5:cpu,cpuacct:/\n4:memory:/pods/kvtier\n0::/\n");
  Write("sys/memory/memory.limit_in_bytes", "9223372036854771712\n");
  Write("sys/memory/pods/memory.limit_in_bytes", std::to_string(2 * kGiB) + "\n");
  Write("sys/memory/pods/kvtier/memory.limit_in_bytes", std::to_string(3 * kGiB) + "\n");
  Write("sys/memory/pods/kvtier/memory.usage_in_bytes", std::to_string(100 * kMiB) + "\n");
  auto found = Read();
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->limit_bytes, 2 * kGiB) << "the parent's limit binds";
  EXPECT_EQ(found->usage_bytes, 100 * kMiB);
  EXPECT_EQ(found->limit_file, root_ + "/sys/memory/pods/memory.limit_in_bytes");
}

TEST_F(MemoryLimitTest, V2ReadsMemoryMaxAndMaxIsNoLimit) {
  Write("proc_cgroup", "0::/system.slice/kvtierd.service\n");
  Write("sys/cgroup.controllers", "cpuset cpu io memory pids\n");
  Write("sys/system.slice/memory.max", "max\n");
  Write("sys/system.slice/kvtierd.service/memory.max", std::to_string(512 * kMiB) + "\n");
  Write("sys/system.slice/kvtierd.service/memory.current", std::to_string(10 * kMiB) + "\n");
  auto found = Read();
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->limit_bytes, 512 * kMiB);
  EXPECT_EQ(found->usage_bytes, 10 * kMiB);

  Write("sys/system.slice/kvtierd.service/memory.max", "max\n");
  EXPECT_FALSE(Read().has_value()) << "max all the way up: no limit";
}

TEST_F(MemoryLimitTest, NoLimitNoControllerOrNothingReadableIsNoLimit) {
  EXPECT_FALSE(Read().has_value()) << "no /proc file";
  Write("proc_cgroup", "0::/user.slice\n");
  Write("sys/cgroup.controllers", "cpu io pids\n");  // v2 without memory
  EXPECT_FALSE(Read().has_value());
  Write("proc_cgroup", "4:memory:/\n");
  Write("sys/memory/memory.limit_in_bytes", "9223372036854771712\n");  // v1's "unlimited"
  EXPECT_FALSE(Read().has_value());
  Write("sys/memory/memory.limit_in_bytes", "garbage\n");
  EXPECT_FALSE(Read().has_value());
}

TEST_F(MemoryLimitTest, APathOutsideTheMountIsReadAtTheMountsRoot) {
  // A cgroup namespace: /proc names the host's path, the mount is the pod's.
  Write("proc_cgroup", "0::/kubepods/burstable/pod1/abc\n");
  Write("sys/cgroup.controllers", "memory pids\n");
  Write("sys/memory.max", std::to_string(1 * kGiB) + "\n");
  auto found = Read();
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->limit_bytes, 1 * kGiB);
}

TEST(MemoryLimitFitTest, AutoSizesUnderTheLimitAndTooLargeSizesAreRefused) {
  const MachineMemory machine{64 * kGiB, 60 * kGiB};
  const CgroupMemory cgroup{2 * kGiB, 512 * kMiB, "/sys/fs/cgroup/memory.max"};
  const MachineMemory seen = UnderLimit(machine, cgroup);
  EXPECT_EQ(seen.total_bytes, 2 * kGiB);
  EXPECT_EQ(seen.available_bytes, 1536 * kMiB);
  EXPECT_LE(AutoHostCapacity(seen), 768 * kMiB) << "auto leaves the limit room";

  auto config = ParseConfig("[host]\ncapacity_bytes = \"4GiB\"\n", "test");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  const Status refused = CheckFitsUnderLimit(*config, cgroup);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("2048 MiB"), std::string::npos) << refused.ToString();
  EXPECT_NE(refused.message().find("host.capacity_bytes"), std::string::npos) << refused.ToString();

  config->host_capacity_bytes = static_cast<int64_t>(1 * kGiB);
  EXPECT_TRUE(CheckFitsUnderLimit(*config, cgroup).ok()) << CheckFitsUnderLimit(*config, cgroup).ToString();
  EXPECT_GE(ConfiguredMemoryBytes(*config), 1 * kGiB + kDaemonBaseBytes);
  config->nvme_path = "/var/lib/kvtier/nvme";
  const uint64_t with_nvme = ConfiguredMemoryBytes(*config);
  config->nvme_path.clear();
  EXPECT_EQ(with_nvme - ConfiguredMemoryBytes(*config), static_cast<uint64_t>(config->nvme_staging_bytes));
  // A peer tier holds its members' events directory.
  config->peer_members = "10.0.0.5:7470";
  const uint64_t with_peers = ConfiguredMemoryBytes(*config);
  config->peer_members.clear();
  EXPECT_EQ(with_peers - ConfiguredMemoryBytes(*config),
            static_cast<uint64_t>(config->peer_events_max_blocks) * kPeerEventsBytesPerBlock);
  EXPECT_GT(config->peer_events_max_blocks, 0);
}

}  // namespace
}  // namespace kvtier

// host.capacity_bytes = 0 sizes the host arena to the machine: a quarter
// of its memory, at most half of what is available, within 64 MiB..64 GiB.
#include <gtest/gtest.h>

#include <fstream>

#include "daemon/setup/auto_size.h"
#include "tests/testing/test_daemon.h"

namespace kvtier {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;

TEST(AutoSizeTest, AQuarterOfMemoryAtMostHalfOfWhatIsAvailableWithinBounds) {
  EXPECT_EQ(AutoHostCapacity({16 * kGiB, 12 * kGiB}), 4 * kGiB);
  EXPECT_EQ(AutoHostCapacity({16 * kGiB, 2 * kGiB}), 1 * kGiB) << "a busy machine: half of what is available";
  EXPECT_EQ(AutoHostCapacity({2048 * kGiB, 2000 * kGiB}), 64 * kGiB) << "a large node: the cap";
  EXPECT_EQ(AutoHostCapacity({128 * kMiB, 100 * kMiB}), 64 * kMiB) << "a tiny one: the floor";
  EXPECT_EQ(AutoHostCapacity({10 * kGiB + 3 * kMiB, 10 * kGiB}) % (2 * kMiB), 0u);
}

// A kept arena's memory is held already: an auto size keeps its size up to
// a quarter of the memory, however little is available now, and not past.
TEST(AutoSizeTest, AnAutoSizeKeepsTheKeptArenaUpToAQuarterOfTheMemory) {
  const MachineMemory tight{16 * kGiB, 6 * kGiB};  // a predecessor still holds some
  const auto automatic = static_cast<int64_t>(AutoHostCapacity(tight));
  ASSERT_EQ(automatic, static_cast<int64_t>(3 * kGiB));
  DaemonConfig config;
  config.host_capacity_bytes = automatic;
  std::string line = KeepKeptArenaSize(4 * kGiB, tight, config);
  EXPECT_EQ(config.host_capacity_bytes, static_cast<int64_t>(4 * kGiB))
      << "adopted, though half of what is available is less";
  EXPECT_NE(line.find("kept host arena"), std::string::npos) << line;
  config.host_capacity_bytes = automatic;
  EXPECT_TRUE(KeepKeptArenaSize(5 * kGiB, tight, config).empty()) << "past a quarter of 16 GiB";
  EXPECT_EQ(config.host_capacity_bytes, automatic);
  EXPECT_TRUE(KeepKeptArenaSize(0, tight, config).empty()) << "nothing kept";
  EXPECT_TRUE(KeepKeptArenaSize(3 * kGiB, tight, config).empty()) << "the same size: nothing to say";
  // With tenants no one adopts that arena: auto sizes as usual.
  config.tenants.emplace_back();
  config.tenants.back().name = "alpha";
  EXPECT_TRUE(KeepKeptArenaSize(2 * kGiB, tight, config).empty());
  EXPECT_EQ(config.host_capacity_bytes, automatic);
}

TEST(AutoSizeTest, ClientMemoryIsASixteenthOfTheMemoryWithinItsBounds) {
  EXPECT_EQ(AutoClientMemory(MachineMemory{32ull << 30, 16ull << 30}), 2048 * kMiB);
  EXPECT_EQ(AutoClientMemory(MachineMemory{256 * kMiB, 200 * kMiB}), 32 * kMiB) << "the floor";
  EXPECT_EQ(AutoClientMemory(MachineMemory{1ull << 40, 1ull << 39}), 4096 * kMiB) << "the ceiling";
  DaemonConfig config;
  config.host_capacity_bytes = 123 * kMiB;
  const auto lines = ResolveAutoSizes(config, MachineMemory{32ull << 30, 16ull << 30});
  EXPECT_EQ(config.client_memory_bytes, static_cast<int64_t>(2048 * kMiB));
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("server.client_memory_bytes = 0 (auto): 2048 MiB"), std::string::npos) << lines[0];
}

TEST(AutoSizeTest, ReadsProcMeminfoAndResolvesOnlyWhatIsLeftAtZero) {
  const std::string dir = testing::MakeTempDir();
  const std::string path = dir + "/meminfo";
  std::ofstream(path) << "MemTotal:       32768000 kB\nMemFree:         1000 kB\nMemAvailable:   20000000 kB\n";
  auto memory = ReadMachineMemory(path);
  ASSERT_TRUE(memory.ok()) << memory.status().ToString();
  EXPECT_EQ(memory->total_bytes, 32768000ull * 1024);
  EXPECT_EQ(memory->available_bytes, 20000000ull * 1024);
  EXPECT_EQ(ReadMachineMemory(dir + "/none").status().code(), StatusCode::kIoError);
  std::ofstream(path) << "nothing useful\n";
  EXPECT_FALSE(ReadMachineMemory(path).ok());
  testing::RemoveTree(dir);

  DaemonConfig config;
  config.host_capacity_bytes = 0;
  config.client_memory_bytes = 64 * kMiB;
  const auto lines = ResolveAutoSizes(config, *memory);
  EXPECT_EQ(config.host_capacity_bytes, static_cast<int64_t>(AutoHostCapacity(*memory)));
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("host.capacity_bytes = 0 (auto): 8000 MiB"), std::string::npos) << lines[0];
  config.host_capacity_bytes = 123 * kMiB;
  EXPECT_TRUE(ResolveAutoSizes(config, *memory).empty());
  EXPECT_EQ(config.host_capacity_bytes, static_cast<int64_t>(123 * kMiB)) << "a size given is kept";
  // The real machine: something within the bounds.
  auto here = ReadMachineMemory();
  ASSERT_TRUE(here.ok()) << here.status().ToString();
  const uint64_t mine = AutoHostCapacity(*here);
  EXPECT_GE(mine, 64 * kMiB);
  EXPECT_LE(mine, 64 * kGiB);
}

}  // namespace
}  // namespace kvtier

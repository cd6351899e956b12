// NvmeIndex: the persistent key -> record map and region table survive a
// reopen, reset atomically, and refuse a second owner.
#include "tiers/nvme/nvme_index.h"

#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "tests/testing/test_daemon.h"

namespace kvtier {
namespace {

using ::kvtier::testing::MakeTempDir;
using ::kvtier::testing::RemoveTree;

IndexEntry Entry(uint32_t region, uint64_t offset) {
  IndexEntry e;
  e.ns = BlockKey{0xabc, region};
  e.payload_checksum = 0x1234567890abcdefULL ^ offset;
  e.region = region;
  e.offset = offset;
  e.payload_bytes = 3 * 4096 + 17;
  e.layer_count = 3 + region;
  e.region_generation = 7 + region;
  e.flags = 0x5;
  e.hits = 99;
  e.last_use_us = -12345;  // any value round-trips, negative included
  return e;
}

class NvmeIndexTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = MakeTempDir(); }
  void TearDown() override { RemoveTree(dir_); }
  std::unique_ptr<NvmeIndex> Open() {
    auto index = NvmeIndex::Open(dir_ + "/index", /*sync_writes=*/false);
    EXPECT_TRUE(index.ok()) << index.status().ToString();
    return index.ok() ? std::move(*index) : nullptr;
  }
  std::string dir_;
};

TEST_F(NvmeIndexTest, PutGetDeleteAndReopen) {
  const BlockKey a{1, 2}, b{0xffffffffffffffffULL, 0}, missing{5, 5};
  {
    auto index = Open();
    ASSERT_NE(index, nullptr);
    ASSERT_TRUE(index->Put(a, Entry(0, 4096)).ok());
    ASSERT_TRUE(index->Put(b, Entry(3, 8192)).ok());
    auto got = index->Get(a);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, Entry(0, 4096));
    EXPECT_EQ(index->Get(missing).status().code(), StatusCode::kNotFound);
    ASSERT_TRUE(index->Put(a, Entry(1, 0)).ok());  // overwrite
    ASSERT_TRUE(index->PutRegion(RegionState{3, 10, RegionStatus::kSealed, 777}).ok());
    ASSERT_TRUE(index->PutRegion(RegionState{1, 2, RegionStatus::kOpen, 0}).ok());
  }
  auto index = Open();  // what returned before the close is there after it
  ASSERT_NE(index, nullptr);
  EXPECT_EQ(*index->Get(a), Entry(1, 0));
  EXPECT_EQ(*index->Get(b), Entry(3, 8192));
  std::vector<RegionState> regions;
  ASSERT_TRUE(index->ForEachRegion([&](const RegionState& r) { regions.push_back(r); }).ok());
  ASSERT_EQ(regions.size(), 2u);
  EXPECT_EQ(regions[0], (RegionState{1, 2, RegionStatus::kOpen, 0}));  // region order
  EXPECT_EQ(regions[1], (RegionState{3, 10, RegionStatus::kSealed, 777}));
  ASSERT_TRUE(index->Delete(a).ok());
  EXPECT_EQ(index->Get(a).status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(index->Delete(missing).ok()) << "deleting an absent key is not an error";
}

TEST_F(NvmeIndexTest, ForEachEntryVisitsAllInKeyOrderAndNoRegions) {
  auto index = Open();
  ASSERT_NE(index, nullptr);
  std::map<std::pair<uint64_t, uint64_t>, IndexEntry> want;
  for (uint64_t i = 0; i < 200; ++i) {
    const BlockKey k{i * 0x9e3779b97f4a7c15ULL, ~i};
    want[{k.hi, k.lo}] = Entry(static_cast<uint32_t>(i % 7), i * 4096);
    ASSERT_TRUE(index->Put(k, want[{k.hi, k.lo}]).ok());
  }
  ASSERT_TRUE(index->PutRegion(RegionState{0, 1, RegionStatus::kOpen, 0}).ok());
  std::vector<std::pair<std::pair<uint64_t, uint64_t>, IndexEntry>> seen;
  ASSERT_TRUE(index->ForEachEntry([&](const BlockKey& k, const IndexEntry& e) { seen.push_back({{k.hi, k.lo}, e}); })
                  .ok());
  ASSERT_EQ(seen.size(), want.size());
  auto it = want.begin();
  for (const auto& s : seen) {
    EXPECT_EQ(s.first, it->first);
    EXPECT_EQ(s.second, it->second);
    ++it;
  }
}

TEST_F(NvmeIndexTest, ResetRegionDropsItsEntriesAndBumpsItInOneWrite) {
  std::vector<BlockKey> in_region = {{1, 1}, {1, 2}, {1, 3}};
  const BlockKey elsewhere{2, 1};
  {
    auto index = Open();
    ASSERT_NE(index, nullptr);
    for (const auto& k : in_region) ASSERT_TRUE(index->Put(k, Entry(4, 0)).ok());
    ASSERT_TRUE(index->Put(elsewhere, Entry(5, 0)).ok());
    ASSERT_TRUE(index->ResetRegion(RegionState{4, 12, RegionStatus::kOpen, 0}, in_region).ok());
  }
  auto index = Open();
  ASSERT_NE(index, nullptr);
  for (const auto& k : in_region) EXPECT_EQ(index->Get(k).status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(index->Get(elsewhere).ok());
  std::vector<RegionState> regions;
  ASSERT_TRUE(index->ForEachRegion([&](const RegionState& r) { regions.push_back(r); }).ok());
  ASSERT_EQ(regions.size(), 1u);
  EXPECT_EQ(regions[0].generation, 12u);
}

TEST_F(NvmeIndexTest, SecondOpenOfTheSameIndexIsRefused) {
  auto first = Open();
  ASSERT_NE(first, nullptr);
  auto second = NvmeIndex::Open(dir_ + "/index", false);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kIoError);
  EXPECT_NE(second.status().message().find(dir_ + "/index"), std::string::npos) << second.status().message();
}

TEST_F(NvmeIndexTest, UnwritablePathIsAClearError) {
  auto index = NvmeIndex::Open("/proc/kvtier-index-cannot-live-here", false);
  ASSERT_FALSE(index.ok());
  EXPECT_NE(index.status().message().find("/proc/kvtier-index-cannot-live-here"), std::string::npos);
}

}  // namespace
}  // namespace kvtier

// RegionManager: append placement, sealing, oldest-first reclaim that skips
// regions with writes in flight, and restart.
#include "tiers/nvme/region_manager.h"

#include <gtest/gtest.h>

namespace kvtier {
namespace {

constexpr uint64_t kRegion = 64 << 10;
constexpr uint32_t kAlign = 4096;

TEST(RegionManager, AppendsInsideTheOpenRegionThenSealsAndOpensTheNext) {
  RegionManager m(4 * kRegion, kRegion, kAlign);
  auto a = m.Allocate(16 << 10);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->placement.region, 0u);
  EXPECT_EQ(a->placement.offset, 0u);
  EXPECT_EQ(a->placement.generation, 1u);
  ASSERT_EQ(a->changed.size(), 1u);  // region 0 opened
  EXPECT_EQ(a->changed[0].status, RegionStatus::kOpen);
  auto b = m.Allocate(32 << 10);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->placement.offset, 16u << 10);
  EXPECT_TRUE(b->changed.empty());
  auto c = m.Allocate(32 << 10);  // 16K left in region 0: goes to region 1
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->placement.region, 1u);
  EXPECT_EQ(c->placement.offset, kRegion);
  ASSERT_EQ(c->changed.size(), 2u);
  EXPECT_EQ(c->changed[0].region, 0u);
  EXPECT_EQ(c->changed[0].status, RegionStatus::kSealed);
  EXPECT_EQ(c->changed[1].region, 1u);
  EXPECT_EQ(c->changed[1].status, RegionStatus::kOpen);
  EXPECT_FALSE(c->reclaimed);
}

TEST(RegionManager, ReclaimsOldestSealedWithoutWritesInFlightAndBumpsItsGeneration) {
  RegionManager m(3 * kRegion, kRegion, kAlign);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(m.Allocate(kRegion).ok());  // regions 0, 1, 2 in turn
  m.WriteStarted(0);                                                  // region 0 (oldest sealed) still being written
  auto a = m.Allocate(kRegion);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(a->reclaimed);
  EXPECT_EQ(*a->reclaimed, 1u) << "region 0 has a write in flight: skip to the next oldest";
  EXPECT_EQ(a->placement.region, 1u);
  EXPECT_EQ(a->placement.generation, 2u);
  m.WriteStarted(2);
  m.WriteStarted(1);
  auto busy = m.Allocate(kRegion);  // 0 and 2 sealed with writes, 1 open and full
  ASSERT_FALSE(busy.ok());
  EXPECT_EQ(busy.status().code(), StatusCode::kBusy);
  m.WriteFinished(0);
  auto b = m.Allocate(kRegion);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b->reclaimed, 0u);
  EXPECT_EQ(m.Generation(0), 2u);
}

TEST(RegionManager, RejectsRecordsLargerThanARegionAndBadGeometry) {
  RegionManager m(4 * kRegion, kRegion, kAlign);
  EXPECT_EQ(m.Allocate(kRegion + kAlign).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(m.Allocate(100).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(RegionManager::Validate(kRegion, kRegion, kAlign).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(RegionManager::Validate(4 * kRegion, kRegion + 1, kAlign).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(RegionManager::Validate(2 * kRegion, kRegion, kAlign).ok());
}

TEST(RegionManager, RestoreSealsTheOpenRegionAndKeepsReclaimOrder) {
  RegionManager m(4 * kRegion, kRegion, kAlign);
  std::vector<RegionState> persisted = {
      {0, 5, RegionStatus::kSealed, 9},  // sealed after region 2
      {1, 3, RegionStatus::kOpen, 0},    // open at the crash
      {2, 7, RegionStatus::kSealed, 4},
  };
  auto changed = m.Restore(persisted);
  ASSERT_EQ(changed.size(), 1u);
  EXPECT_EQ(changed[0].region, 1u);
  EXPECT_EQ(changed[0].status, RegionStatus::kSealed);
  EXPECT_GT(changed[0].seal_sequence, 9u);
  EXPECT_EQ(m.StatusOf(3), RegionStatus::kFree);
  auto a = m.Allocate(kRegion);  // the free region first
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->placement.region, 3u);
  EXPECT_EQ(a->placement.generation, 1u);
  auto b = m.Allocate(kRegion);  // then the oldest sealed: 2, then 0, then 1
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b->reclaimed, 2u);
  EXPECT_EQ(b->placement.generation, 8u);
  EXPECT_EQ(*m.Allocate(kRegion)->reclaimed, 0u);
  EXPECT_EQ(*m.Allocate(kRegion)->reclaimed, 1u);
}

}  // namespace
}  // namespace kvtier

// RangeAllocator (gpu/range_allocator.h): pure bookkeeping, no device.
#include "gpu/range_allocator.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

namespace kvtier::gpu {
namespace {

constexpr uint64_t kUnit = RangeAllocator::kDefaultAlignmentBytes;

TEST(RangeAllocatorTest, SizesAreRoundedUpToTheAlignmentAndCapacityDown) {
  RangeAllocator a(10 * kUnit + 100);
  EXPECT_EQ(a.capacity_bytes(), 10 * kUnit);
  Result<uint64_t> first = a.Allocate(1);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(*first, 0u);
  EXPECT_EQ(a.LengthAt(0), kUnit);
  Result<uint64_t> second = a.Allocate(kUnit + 1);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(*second, kUnit);
  EXPECT_EQ(a.LengthAt(kUnit), 2 * kUnit);
  EXPECT_EQ(a.used_bytes(), 3 * kUnit);
  EXPECT_EQ(a.free_bytes(), 7 * kUnit);
}

TEST(RangeAllocatorTest, BadRequestsAndAFullPoolAreErrors) {
  RangeAllocator a(4 * kUnit);
  EXPECT_EQ(a.Allocate(0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a.Allocate(4 * kUnit + 1).status().code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(a.Allocate(4 * kUnit).ok());
  Result<uint64_t> full = a.Allocate(1);
  EXPECT_EQ(full.status().code(), StatusCode::kNoSpace) << full.status().ToString();
  EXPECT_EQ(a.largest_free_bytes(), 0u);
}

TEST(RangeAllocatorTest, TheSmallestFittingHoleIsTakenLowestOffsetFirst) {
  RangeAllocator a(16 * kUnit);
  // Carve [0,3) [3,4) [4,5) [5,6) [6,8) [8,9) and leave [9,16) free, then
  // free [0,3), [4,5) and [6,8): holes of 3, 1 and 2 units (+ the tail of 7).
  std::vector<uint64_t> at;
  for (uint64_t units : {3, 1, 1, 1, 2, 1}) at.push_back(*a.Allocate(units * kUnit));
  ASSERT_TRUE(a.Free(at[0]).ok());
  ASSERT_TRUE(a.Free(at[2]).ok());
  ASSERT_TRUE(a.Free(at[4]).ok());
  EXPECT_EQ(a.free_ranges(), 4u);
  EXPECT_EQ(*a.Allocate(kUnit), 4 * kUnit) << "the 1-unit hole, not the first hole";
  EXPECT_EQ(*a.Allocate(2 * kUnit), 6 * kUnit) << "the 2-unit hole";
  EXPECT_EQ(*a.Allocate(2 * kUnit), 0u) << "the 3-unit hole, split from its front";
  EXPECT_EQ(*a.Allocate(kUnit), 2 * kUnit) << "what is left of it";
  EXPECT_EQ(a.largest_free_bytes(), 7 * kUnit);
}

TEST(RangeAllocatorTest, FreedNeighboursCoalesceIntoOneRange) {
  RangeAllocator a(6 * kUnit);
  const uint64_t x = *a.Allocate(2 * kUnit), y = *a.Allocate(2 * kUnit), z = *a.Allocate(2 * kUnit);
  ASSERT_TRUE(a.Free(x).ok());
  ASSERT_TRUE(a.Free(z).ok());
  EXPECT_EQ(a.free_ranges(), 2u);
  EXPECT_EQ(a.largest_free_bytes(), 2 * kUnit);
  ASSERT_TRUE(a.Free(y).ok());  // merges with both sides
  EXPECT_EQ(a.free_ranges(), 1u);
  EXPECT_EQ(a.largest_free_bytes(), 6 * kUnit);
  EXPECT_EQ(a.used_bytes(), 0u);
  EXPECT_EQ(*a.Allocate(6 * kUnit), 0u);
}

TEST(RangeAllocatorTest, ADoubleOrWildFreeChangesNothing) {
  RangeAllocator a(4 * kUnit);
  const uint64_t x = *a.Allocate(kUnit);
  ASSERT_TRUE(a.Allocate(kUnit).ok());
  EXPECT_EQ(a.Free(x + 1).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(a.Free(x).ok());
  EXPECT_EQ(a.Free(x).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a.used_bytes(), kUnit);
  EXPECT_EQ(a.live_ranges(), 1u);
}

TEST(RangeAllocatorTest, AnAlignmentThatIsNotAPowerOfTwoFallsBackToTheDefault) {
  RangeAllocator a(4096, 100);
  EXPECT_EQ(a.alignment_bytes(), kUnit);
  RangeAllocator b(4096, 1024);
  EXPECT_EQ(*b.Allocate(1), 0u);
  EXPECT_EQ(*b.Allocate(1), 1024u);
}

// Random allocations and frees against a map of units: live ranges never
// overlap, the books balance, and freeing everything leaves one range.
TEST(RangeAllocatorTest, RandomTrafficKeepsRangesDisjointAndCoalescesFully) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  constexpr uint64_t kUnits = 512;
  RangeAllocator a(kUnits * kUnit);
  std::vector<int> owner(kUnits, -1);
  std::vector<std::pair<uint64_t, uint64_t>> live;  // offset, length
  for (int step = 0; step < 20000; ++step) {
    if (live.empty() || rng() % 3 != 0) {
      const uint64_t bytes = 1 + rng() % (24 * kUnit);
      Result<uint64_t> got = a.Allocate(bytes);
      if (!got.ok()) {
        ASSERT_EQ(got.status().code(), StatusCode::kNoSpace);
        ASSERT_LT(a.largest_free_bytes(), bytes);
        continue;
      }
      const uint64_t length = a.LengthAt(*got);
      ASSERT_EQ(*got % kUnit, 0u);
      ASSERT_GE(length, bytes);
      ASSERT_LT(length - bytes, kUnit);
      for (uint64_t u = *got / kUnit; u < (*got + length) / kUnit; ++u) {
        ASSERT_EQ(owner[u], -1) << "unit " << u << " handed out twice";
        owner[u] = step;
      }
      live.emplace_back(*got, length);
    } else {
      const size_t i = rng() % live.size();
      ASSERT_TRUE(a.Free(live[i].first).ok());
      for (uint64_t u = live[i].first / kUnit; u < (live[i].first + live[i].second) / kUnit; ++u) owner[u] = -1;
      live[i] = live.back();
      live.pop_back();
    }
    uint64_t used = 0;
    for (const auto& [offset, length] : live) used += length;
    ASSERT_EQ(a.used_bytes(), used);
    ASSERT_EQ(a.live_ranges(), live.size());
  }
  for (const auto& [offset, length] : live) ASSERT_TRUE(a.Free(offset).ok());
  EXPECT_EQ(a.free_ranges(), 1u);
  EXPECT_EQ(a.largest_free_bytes(), kUnits * kUnit);
}

}  // namespace
}  // namespace kvtier::gpu

#include "tiers/host/arena_allocator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace kvtier {
namespace {

using Extent = ArenaAllocator::Extent;

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;
constexpr uint64_t kGiB = 1024 * kMiB;
constexpr uint64_t kPage = ArenaAllocator::kAlignmentBytes;

int64_t Counter(const ArenaAllocator& a, const std::string& name) {
  CounterCollector c;
  a.VisitCounters(c);
  for (const auto& [n, v] : c.counters()) {
    if (n == name) return v;
  }
  ADD_FAILURE() << "no counter " << name;
  return -1;
}

// Live extents never overlap, stay inside the arena, and the accounting adds
// up. `live` is the test's own record of what it holds.
void ExpectConsistent(const ArenaAllocator& a, std::vector<Extent> live) {
  std::sort(live.begin(), live.end(), [](const Extent& x, const Extent& y) { return x.offset < y.offset; });
  uint64_t used = 0;
  for (size_t i = 0; i < live.size(); ++i) {
    ASSERT_EQ(live[i].offset % kPage, 0u);
    ASSERT_LE(live[i].offset + live[i].length, a.capacity_bytes());
    if (i > 0) {
      ASSERT_LE(live[i - 1].offset + live[i - 1].length, live[i].offset)
          << "extents overlap at offset " << live[i].offset;
    }
    used += live[i].length;
  }
  ASSERT_EQ(a.used_bytes(), used);
  ASSERT_EQ(a.used_bytes() + a.free_bytes(), a.capacity_bytes());
  ASSERT_EQ(a.allocations(), live.size());
  ASSERT_LE(a.largest_free_bytes(), a.free_bytes());
}

TEST(ArenaAllocatorClassSize, KnownValues) {
  EXPECT_EQ(ArenaAllocator::ClassSize(1), 4 * kKiB);
  EXPECT_EQ(ArenaAllocator::ClassSize(4 * kKiB), 4 * kKiB);
  EXPECT_EQ(ArenaAllocator::ClassSize(4 * kKiB + 1), 8 * kKiB);
  EXPECT_EQ(ArenaAllocator::ClassSize(60 * kKiB + 1), 64 * kKiB);
  EXPECT_EQ(ArenaAllocator::ClassSize(64 * kKiB), 64 * kKiB);
  EXPECT_EQ(ArenaAllocator::ClassSize(64 * kKiB + 1), 80 * kKiB);
  EXPECT_EQ(ArenaAllocator::ClassSize(100 * kKiB), 112 * kKiB);
  EXPECT_EQ(ArenaAllocator::ClassSize(128 * kKiB + 1), 160 * kKiB);
  EXPECT_EQ(ArenaAllocator::ClassSize(256 * kKiB), 256 * kKiB);
  EXPECT_EQ(ArenaAllocator::ClassSize(2 * kMiB), 2 * kMiB);
  EXPECT_EQ(ArenaAllocator::ClassSize(2 * kMiB + 1), 2 * kMiB + 512 * kKiB);
}

TEST(ArenaAllocatorClassSize, MonotonicAlignedBoundedWaste) {
  uint64_t previous = 0;
  for (uint64_t bytes = 1; bytes <= 64 * kMiB; bytes += 1 + bytes / 97) {
    const uint64_t c = ArenaAllocator::ClassSize(bytes);
    ASSERT_GE(c, bytes) << bytes;
    ASSERT_EQ(c % kPage, 0u) << bytes;
    ASSERT_GE(c, previous) << bytes;
    ASSERT_EQ(ArenaAllocator::ClassSize(c), c) << "a class is its own class";
    if (bytes > 64 * kKiB) {
      ASSERT_LE((c - bytes) * 4, bytes) << bytes;
    }
    previous = c;
  }
}

TEST(ArenaAllocatorClassSize, FourClassesPerDoubling) {
  for (uint64_t p = 64 * kKiB; p <= 1 * kGiB; p *= 2) {
    std::set<uint64_t> classes;
    for (uint64_t bytes = p + 1; bytes <= 2 * p; bytes += kPage) {
      classes.insert(ArenaAllocator::ClassSize(bytes));
    }
    EXPECT_EQ(classes.size(), 4u) << "in (" << p << ", " << 2 * p << "]";
  }
}

TEST(ArenaAllocatorTest, CapacityRoundsDownToAlignment) {
  ArenaAllocator a(10 * kPage + 123);
  EXPECT_EQ(a.capacity_bytes(), 10 * kPage);
  EXPECT_EQ(a.free_bytes(), 10 * kPage);
  EXPECT_EQ(a.largest_free_bytes(), 10 * kPage);
  ArenaAllocator empty(kPage - 1);
  EXPECT_EQ(empty.capacity_bytes(), 0u);
  EXPECT_FALSE(empty.Allocate(1).has_value());
}

// An arena still being allocated: only the usable part is handed out or
// claimed; Grow adds the rest as one free range with the free tail before it.
TEST(ArenaAllocatorTest, HandsOutOnlyTheUsablePartUntilItGrows) {
  ArenaAllocator a(16 * kPage, 4 * kPage + 100);
  EXPECT_EQ(a.capacity_bytes(), 16 * kPage);
  EXPECT_EQ(a.usable_bytes(), 4 * kPage);
  EXPECT_EQ(a.free_bytes(), 4 * kPage);
  EXPECT_FALSE(a.Allocate(5 * kPage).has_value());
  EXPECT_FALSE(a.Claim({8 * kPage, kPage}));
  const std::optional<Extent> first = a.Allocate(kPage);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->offset, 0u);
  a.Grow(2 * kPage);  // smaller: nothing changes
  EXPECT_EQ(a.usable_bytes(), 4 * kPage);
  a.Grow(12 * kPage);
  EXPECT_EQ(a.usable_bytes(), 12 * kPage);
  EXPECT_EQ(a.free_bytes(), 11 * kPage);
  EXPECT_EQ(a.largest_free_bytes(), 11 * kPage);  // [1, 4) and [4, 12) coalesced
  EXPECT_TRUE(a.Claim({8 * kPage, kPage}));
  a.Grow(100 * kPage);  // at most the capacity
  EXPECT_EQ(a.usable_bytes(), 16 * kPage);
  EXPECT_EQ(a.free_bytes(), 14 * kPage);
  const std::optional<Extent> low = a.Allocate(7 * kPage);
  const std::optional<Extent> tail = a.Allocate(7 * kPage);
  ASSERT_TRUE(low.has_value() && tail.has_value());
  EXPECT_EQ(low->offset, kPage);       // [1, 8) and [9, 16) around the claimed page
  EXPECT_EQ(tail->offset, 9 * kPage);  // the grown part
  EXPECT_EQ(a.free_bytes(), 0u);
  ExpectConsistent(a, {*first, *low, Extent{8 * kPage, kPage}, *tail});

  // Grown with the tail in use: the new part is a range of its own.
  ArenaAllocator b(8 * kPage, 2 * kPage);
  ASSERT_TRUE(b.Allocate(2 * kPage).has_value());
  b.Grow(8 * kPage);
  EXPECT_EQ(b.largest_free_bytes(), 6 * kPage);
  EXPECT_EQ(b.Allocate(6 * kPage)->offset, 2 * kPage);
}

void FillUniform(uint64_t capacity, uint64_t block) {
  ArenaAllocator a(capacity);
  const uint64_t cls = ArenaAllocator::ClassSize(block);
  const uint64_t expected = capacity / cls;
  std::vector<Extent> live;
  while (auto e = a.Allocate(block)) {
    EXPECT_EQ(e->length, cls);
    live.push_back(*e);
  }
  EXPECT_EQ(live.size(), expected) << "block " << block;
  EXPECT_EQ(a.used_bytes(), expected * cls);
  EXPECT_LT(a.largest_free_bytes(), cls);
  ExpectConsistent(a, live);
  for (const Extent& e : live) a.Free(e);
  EXPECT_EQ(a.used_bytes(), 0u);
  EXPECT_EQ(a.largest_free_bytes(), capacity / kPage * kPage);
}

TEST(ArenaAllocatorTest, FillsExactlyWithUniformBlocks) {
  FillUniform(1 * kGiB, 256 * kKiB);
  FillUniform(1 * kGiB, 2 * kMiB);
  FillUniform(1 * kGiB, 2 * kMiB - 1);
  FillUniform(1 * kGiB + 7 * kPage, 320 * kKiB);  // not a divisor
}

TEST(ArenaAllocatorTest, FreedRangeIsReusedBySameClass) {
  ArenaAllocator a(64 * kMiB);
  std::vector<Extent> live;
  while (auto e = a.Allocate(2 * kMiB)) live.push_back(*e);
  ASSERT_EQ(live.size(), 32u);
  const Extent hole = live[13];
  a.Free(hole);
  auto again = a.Allocate(2 * kMiB - 100);  // same class
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(*again, hole);
  EXPECT_FALSE(a.Allocate(1).has_value());
}

TEST(ArenaAllocatorTest, CoalescesWithBothNeighbours) {
  ArenaAllocator a(16 * kPage);
  std::vector<Extent> live;
  while (auto e = a.Allocate(kPage)) live.push_back(*e);
  ASSERT_EQ(live.size(), 16u);
  a.Free(live[1]);
  a.Free(live[3]);
  a.Free(live[2]);  // merges left and right
  EXPECT_EQ(a.largest_free_bytes(), 3 * kPage);
  auto merged = a.Allocate(3 * kPage);
  ASSERT_TRUE(merged.has_value());
  EXPECT_EQ(merged->offset, 1 * kPage);
  EXPECT_EQ(merged->length, 3 * kPage);

  a.Free(live[6]);
  a.Free(live[5]);  // merges right only
  a.Free(live[7]);  // merges left only
  EXPECT_EQ(a.largest_free_bytes(), 3 * kPage);
  auto second = a.Allocate(3 * kPage);
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->offset, 5 * kPage);
}

TEST(ArenaAllocatorTest, FreeingEverythingRestoresOneRange) {
  ArenaAllocator a(256 * kPage);
  std::vector<Extent> live;
  for (uint64_t i = 1; auto e = a.Allocate((i % 7 + 1) * kPage); ++i) {
    live.push_back(*e);
  }
  std::mt19937_64 rng(7);
  std::shuffle(live.begin(), live.end(), rng);
  for (const Extent& e : live) a.Free(e);
  EXPECT_EQ(a.largest_free_bytes(), a.capacity_bytes());
  EXPECT_EQ(a.free_bytes(), a.capacity_bytes());
}

TEST(ArenaAllocatorTest, BestFitPicksSmallestRangeThatFits) {
  ArenaAllocator a(16 * kPage);
  std::vector<Extent> live;
  while (auto e = a.Allocate(kPage)) live.push_back(*e);
  // Holes: 3 pages at 0, 1 page at 4, 2 pages at 6 (pages 3, 5, 8.. live).
  for (int i : {0, 1, 2, 4, 6, 7}) a.Free(live[i]);
  auto two = a.Allocate(2 * kPage);
  ASSERT_TRUE(two.has_value());
  EXPECT_EQ(two->offset, 6 * kPage);
  auto one = a.Allocate(kPage);
  ASSERT_TRUE(one.has_value());
  EXPECT_EQ(one->offset, 4 * kPage);
  auto three = a.Allocate(3 * kPage);
  ASSERT_TRUE(three.has_value());
  EXPECT_EQ(three->offset, 0u);
  EXPECT_EQ(a.free_bytes(), 0u);
}

TEST(ArenaAllocatorTest, ExhaustionReturnsNulloptAndCounts) {
  ArenaAllocator a(8 * kMiB);
  EXPECT_EQ(Counter(a, "host.alloc.failed_allocations"), 0);
  EXPECT_FALSE(a.Allocate(0).has_value());
  EXPECT_FALSE(a.Allocate(8 * kMiB + 1).has_value());
  EXPECT_EQ(Counter(a, "host.alloc.failed_allocations"), 2);
  ASSERT_TRUE(a.Allocate(6 * kMiB).has_value());
  EXPECT_FALSE(a.Allocate(3 * kMiB).has_value());  // 2 MiB left
  EXPECT_EQ(Counter(a, "host.alloc.failed_allocations"), 3);
  EXPECT_TRUE(a.Allocate(2 * kMiB).has_value());
  EXPECT_FALSE(a.Allocate(1).has_value());
  EXPECT_EQ(Counter(a, "host.alloc.failed_allocations"), 4);
  EXPECT_EQ(Counter(a, "host.alloc.used_bytes"), int64_t(8 * kMiB));
  EXPECT_EQ(Counter(a, "host.alloc.free_bytes"), 0);
  EXPECT_EQ(Counter(a, "host.alloc.largest_free_bytes"), 0);
  EXPECT_EQ(Counter(a, "host.alloc.allocations"), 2);
}

TEST(ArenaAllocatorDeathTest, DoubleAndForeignFreeAbort) {
  ArenaAllocator a(1 * kMiB);
  auto e = a.Allocate(64 * kKiB);
  ASSERT_TRUE(e.has_value());
  EXPECT_DEATH(a.Free(Extent{e->offset + kPage, kPage}), "not live");
  EXPECT_DEATH(a.Free(Extent{e->offset, 2 * e->length}), "length differs");
  a.Free(*e);
  EXPECT_DEATH(a.Free(*e), "double free");
}

// A fixed seed, printed; KVTIER_TEST_SEED overrides it to explore others.
uint64_t TestSeed(uint64_t fixed) {
  const char* env = std::getenv("KVTIER_TEST_SEED");
  const uint64_t seed = env != nullptr ? std::strtoull(env, nullptr, 10) : fixed;
  std::printf("[ seed     ] %s seed=%llu (KVTIER_TEST_SEED overrides)\n",
              ::testing::UnitTest::GetInstance()->current_test_info()->name(), static_cast<unsigned long long>(seed));
  return seed;
}

// Random alloc/free of `min_bytes`..`max_bytes` requests, checking the
// invariants after every step, then that freeing everything coalesces back
// into one range.
void RandomStress(uint64_t capacity, uint64_t min_bytes, uint64_t max_bytes, int steps) {
  const uint64_t seed = TestSeed(20240611);
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<uint64_t> size(min_bytes, max_bytes);
  ArenaAllocator a(capacity);
  std::vector<Extent> live;
  for (int step = 0; step < steps; ++step) {
    const bool alloc = live.empty() || rng() % 100 < 55;
    if (alloc) {
      const uint64_t bytes = size(rng);
      auto e = a.Allocate(bytes);
      if (e) {
        ASSERT_EQ(e->length, ArenaAllocator::ClassSize(bytes));
        live.push_back(*e);
      } else {
        ASSERT_LT(a.largest_free_bytes(), ArenaAllocator::ClassSize(bytes));
      }
    } else {
      const size_t i = rng() % live.size();
      a.Free(live[i]);
      live[i] = live.back();
      live.pop_back();
    }
    ExpectConsistent(a, live);
    if (::testing::Test::HasFatalFailure()) return;
  }
  for (const Extent& e : live) a.Free(e);
  ASSERT_EQ(a.largest_free_bytes(), a.capacity_bytes());
}

TEST(ArenaAllocatorTest, RandomStressSmallBlocks) { RandomStress(64 * kMiB, 1, 1 * kMiB, 20000); }

TEST(ArenaAllocatorTest, RandomStressMixedKvBlocks) { RandomStress(4 * kGiB, 256 * kKiB, 32 * kMiB, 20000); }

// Churn with mixed KV block sizes: whenever an allocation fails, record how
// full the arena was. Size classes + best fit keep that high.
TEST(ArenaAllocatorTest, MixedSizesFragmentationStaysBounded) {
  const uint64_t seed = TestSeed(42);
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<uint64_t> size(256 * kKiB, 32 * kMiB);
  ArenaAllocator a(4 * kGiB);
  std::vector<Extent> live;
  double worst_utilization = 1.0;
  int failures = 0;
  for (int round = 0; round < 200; ++round) {
    while (auto e = a.Allocate(size(rng))) live.push_back(*e);
    ++failures;
    const double utilization = static_cast<double>(a.used_bytes()) / static_cast<double>(a.capacity_bytes());
    worst_utilization = std::min(worst_utilization, utilization);
    ExpectConsistent(a, live);
    std::shuffle(live.begin(), live.end(), rng);
    const size_t keep = live.size() / 2;
    for (size_t i = keep; i < live.size(); ++i) a.Free(live[i]);
    live.resize(keep);
  }
  std::printf(
      "[ info     ] worst utilization at a failed allocation: %.3f "
      "over %d failures\n",
      worst_utilization, failures);
  EXPECT_GE(worst_utilization, 0.80);
}

// A restart's adoption claims the extents a previous allocator handed out:
// exactly those bytes, never over another extent, and Allocate then fits
// around them; a claimed extent frees like an allocated one.
TEST(ArenaAllocatorTest, ClaimTakesExactlyTheFreeRangeAskedAndNothingElse) {
  ArenaAllocator a(64 * kKiB);
  EXPECT_TRUE(a.Claim({8 * kKiB, 8 * kKiB}));
  EXPECT_TRUE(a.Claim({32 * kKiB, 4 * kKiB}));
  EXPECT_EQ(a.used_bytes(), 12 * kKiB);
  EXPECT_EQ(a.allocations(), 2u);
  EXPECT_FALSE(a.Claim({12 * kKiB, 4 * kKiB}));  // inside the first
  EXPECT_FALSE(a.Claim({4 * kKiB, 8 * kKiB}));   // overlaps its start
  EXPECT_FALSE(a.Claim({60 * kKiB, 8 * kKiB}));  // past the end
  EXPECT_FALSE(a.Claim({1 * kKiB, 4 * kKiB}));   // not aligned
  EXPECT_FALSE(a.Claim({20 * kKiB, 0}));         // empty
  EXPECT_EQ(a.used_bytes(), 12 * kKiB);
  std::vector<Extent> live = {{8 * kKiB, 8 * kKiB}, {32 * kKiB, 4 * kKiB}};
  while (auto e = a.Allocate(4 * kKiB)) {
    EXPECT_TRUE(e->offset + e->length <= 8 * kKiB || e->offset >= 16 * kKiB) << e->offset;
    EXPECT_TRUE(e->offset + e->length <= 32 * kKiB || e->offset >= 36 * kKiB) << e->offset;
    live.push_back(*e);
  }
  EXPECT_EQ(a.free_bytes(), 0u);
  ExpectConsistent(a, live);
  for (const Extent& e : live) a.Free(e);
  EXPECT_EQ(a.largest_free_bytes(), 64 * kKiB);
}

}  // namespace
}  // namespace kvtier

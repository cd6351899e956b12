// Tests of PlanPrefetch and BandwidthEstimate: deadline order, the longest
// prefix that arrives in time, holes, short hits, the host budget, shared
// blocks read once, one channel per tier, and the moving average.
#include "policy/prefetch_planner.h"

#include <gtest/gtest.h>

#include <vector>

namespace kvtier {
namespace {

constexpr uint64_t kNow = 1'000'000;

// Where a block is: the host, a tier below (level 0 "NVMe", 1 "remote"), nowhere.
struct Where {
  BlockPlace place;
  uint32_t level = 0;
};
constexpr Where kHost{BlockPlace::kHost};
constexpr Where kNvme{BlockPlace::kBelow, 0};
constexpr Where kRemote{BlockPlace::kBelow, 1};
constexpr Where kNowhere{BlockPlace::kNowhere};

BlockKey K(uint64_t i) { return BlockKey{0x7e, i}; }

// 1 byte per microsecond: a 1000-byte block takes 1000 us.
BandwidthEstimate OneBytePerUs() { return BandwidthEstimate(1e6); }

PrefetchRequest Request(uint64_t id, uint64_t deadline_in_us, std::vector<std::pair<uint64_t, Where>> blocks) {
  PrefetchRequest r;
  r.id = id;
  r.deadline_us = kNow + deadline_in_us;
  for (auto [k, where] : blocks) r.chain.push_back(PrefetchBlock{K(k), 1000, where.place, where.level});
  return r;
}

// The read bandwidths of the tiers below the host, highest first.
std::vector<BandwidthEstimate> Tiers(BandwidthEstimate nvme, BandwidthEstimate remote) { return {nvme, remote}; }

std::vector<uint64_t> Keys(const PrefetchPlan& plan) {
  std::vector<uint64_t> out;
  for (const auto& a : plan.actions) out.push_back(a.key.lo);
  return out;
}

PrefetchOptions Budget(uint64_t bytes, uint32_t min_hit = 1) { return PrefetchOptions{bytes, min_hit}; }

TEST(BandwidthEstimateTest, MovesTowardWhatItObserves) {
  BandwidthEstimate b(1e9, 0.5);
  EXPECT_EQ(b.TimeUs(1'000'000), 1000u);
  b.Observe(1'000'000, 2000);  // 0.5 GB/s
  EXPECT_DOUBLE_EQ(b.bytes_per_s(), 0.75e9);
  b.Observe(1'000'000, 0);  // no duration: ignored
  b.Observe(0, 100);        // nothing read: ignored
  EXPECT_DOUBLE_EQ(b.bytes_per_s(), 0.75e9);
  for (int i = 0; i < 60; ++i) b.Observe(1'000'000, 2000);
  EXPECT_NEAR(b.bytes_per_s(), 0.5e9, 1e3);
  EXPECT_EQ(BandwidthEstimate(1e9).TimeUs(1), 1u) << "at least a microsecond";
}

TEST(PrefetchPlannerTest, EarliestDeadlineFirst) {
  const std::vector<PrefetchRequest> queue = {Request(1, 100'000, {{1, kNvme}}), Request(2, 10'000, {{2, kNvme}})};
  auto plan = PlanPrefetch(kNow, queue, Tiers(OneBytePerUs(), OneBytePerUs()), Budget(1 << 20));
  EXPECT_EQ(Keys(plan), (std::vector<uint64_t>{2, 1}));
  EXPECT_EQ(plan.actions[0].start_us, kNow);
  EXPECT_EQ(plan.actions[0].done_us, kNow + 1000);
  EXPECT_EQ(plan.actions[1].start_us, kNow + 1000) << "one NVMe channel: after the first read";
  EXPECT_EQ(plan.bytes, 2000u);
}

TEST(PrefetchPlannerTest, FetchesTheLongestPrefixThatArrivesByTheDeadline) {
  const std::vector<PrefetchRequest> queue = {Request(1, 2500, {{1, kNvme}, {2, kNvme}, {3, kNvme}, {4, kNvme}})};
  auto plan = PlanPrefetch(kNow, queue, Tiers(OneBytePerUs(), OneBytePerUs()), Budget(1 << 20));
  EXPECT_EQ(Keys(plan), (std::vector<uint64_t>{1, 2})) << "the third would arrive at +3000";
  EXPECT_EQ(plan.cut_by_deadline, 1u);
}

TEST(PrefetchPlannerTest, HostBlocksCountButAreNotReadAndAHoleEndsThePrefix) {
  const std::vector<PrefetchRequest> queue = {
      Request(1, 100'000, {{1, kHost}, {2, kNvme}, {3, kHost}, {4, kRemote}, {5, kNowhere}, {6, kNvme}})};
  auto plan = PlanPrefetch(kNow, queue, Tiers(OneBytePerUs(), OneBytePerUs()), Budget(1 << 20));
  EXPECT_EQ(Keys(plan), (std::vector<uint64_t>{2, 4})) << "6 is behind a block cached nowhere";
  EXPECT_EQ(plan.actions[1].level, kRemote.level);
  EXPECT_EQ(plan.actions[1].start_us, kNow) << "the remote channel runs beside the NVMe one";
}

TEST(PrefetchPlannerTest, ShortHitsAreSkipped) {
  const std::vector<PrefetchRequest> queue = {Request(1, 100'000, {{1, kNvme}, {2, kNowhere}}),
                                              Request(2, 200'000, {{3, kHost}, {4, kNvme}, {5, kNvme}})};
  auto plan = PlanPrefetch(kNow, queue, Tiers(OneBytePerUs(), OneBytePerUs()), Budget(1 << 20, /*min_hit=*/3));
  EXPECT_EQ(Keys(plan), (std::vector<uint64_t>{4, 5})) << "request 1 would hit one block only";
  EXPECT_EQ(plan.skipped_short, 1u);
  EXPECT_EQ(plan.actions[0].start_us, kNow) << "a skipped request takes no channel time";
  // A prefix cut by the deadline can become too short as well.
  const std::vector<PrefetchRequest> tight = {Request(3, 1500, {{6, kNvme}, {7, kNvme}, {8, kNvme}})};
  plan = PlanPrefetch(kNow, tight, Tiers(OneBytePerUs(), OneBytePerUs()), Budget(1 << 20, 2));
  EXPECT_TRUE(plan.actions.empty());
  EXPECT_EQ(plan.skipped_short, 1u);
}

TEST(PrefetchPlannerTest, TheHostBudgetGoesToTheEarliestDeadlines) {
  const std::vector<PrefetchRequest> queue = {Request(1, 100'000, {{1, kNvme}, {2, kNvme}, {3, kNvme}}),
                                              Request(2, 200'000, {{4, kNvme}})};
  auto plan = PlanPrefetch(kNow, queue, Tiers(OneBytePerUs(), OneBytePerUs()), Budget(2500));
  EXPECT_EQ(Keys(plan), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(plan.bytes, 2000u);
  EXPECT_EQ(plan.cut_by_budget, 1u);
  plan = PlanPrefetch(kNow, queue, Tiers(OneBytePerUs(), OneBytePerUs()), Budget(0));
  EXPECT_TRUE(plan.actions.empty());
}

TEST(PrefetchPlannerTest, ASharedBlockIsReadOnceForEveryRequestThatNeedsIt) {
  const std::vector<PrefetchRequest> queue = {Request(1, 10'000, {{1, kNvme}, {2, kNvme}}),
                                              Request(2, 20'000, {{1, kNvme}, {3, kNvme}})};
  auto plan = PlanPrefetch(kNow, queue, Tiers(OneBytePerUs(), OneBytePerUs()), Budget(1 << 20, 2));
  EXPECT_EQ(Keys(plan), (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(plan.actions[0].request, 1u);
  // The shared root arrives too late for a request due before it lands.
  const std::vector<PrefetchRequest> racing = {Request(1, 10'000, {{5, kNvme}, {6, kNvme}}),
                                               Request(2, 10'500, {{6, kNvme}, {7, kNvme}})};
  plan = PlanPrefetch(kNow, racing, Tiers(BandwidthEstimate(1e5), OneBytePerUs()), Budget(1 << 20, 1));
  // At 0.1 byte/us a block takes 10 ms: only 5 fits request 1's deadline;
  // 6 would land at +20 ms, after both deadlines.
  EXPECT_EQ(Keys(plan), (std::vector<uint64_t>{5}));
  EXPECT_EQ(plan.cut_by_deadline, 1u);
}

TEST(PrefetchPlannerTest, EveryTierBelowHasItsOwnChannelAtItsOwnBandwidth) {
  // Three tiers below the host: level 2 is ten times slower than the others.
  const std::vector<BandwidthEstimate> below = {OneBytePerUs(), OneBytePerUs(), BandwidthEstimate(1e5)};
  const Where third{BlockPlace::kBelow, 2};
  const std::vector<PrefetchRequest> queue = {
      Request(1, 100'000, {{1, kNvme}, {2, kRemote}, {3, third}, {4, kNvme}, {5, third}})};
  auto plan = PlanPrefetch(kNow, queue, below, Budget(1 << 20));
  ASSERT_EQ(Keys(plan), (std::vector<uint64_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(plan.actions[2].level, 2u);
  EXPECT_EQ(plan.actions[2].start_us, kNow) << "the third tier's channel runs beside the others";
  EXPECT_EQ(plan.actions[2].done_us, kNow + 10'000);
  EXPECT_EQ(plan.actions[3].start_us, kNow + 1000) << "after block 1 on the first tier's channel";
  EXPECT_EQ(plan.actions[4].start_us, kNow + 10'000) << "after block 3 on the third tier's channel";
  // A tier with no bandwidth given (no channel) ends the usable prefix.
  const std::vector<BandwidthEstimate> two(below.begin(), below.begin() + 2);
  EXPECT_EQ(Keys(PlanPrefetch(kNow, queue, two, Budget(1 << 20))), (std::vector<uint64_t>{1, 2}));
}

TEST(PrefetchPlannerTest, SlowerMeasuredBandwidthShortensThePlan) {
  BandwidthEstimate nvme(1e6);
  const std::vector<PrefetchRequest> queue = {Request(1, 3000, {{1, kNvme}, {2, kNvme}, {3, kNvme}, {4, kNvme}})};
  EXPECT_EQ(PlanPrefetch(kNow, queue, Tiers(nvme, nvme), Budget(1 << 20)).actions.size(), 3u);
  for (int i = 0; i < 50; ++i) nvme.Observe(1000, 2000);  // the drive turns out to be half as fast
  EXPECT_EQ(PlanPrefetch(kNow, queue, Tiers(nvme, nvme), Budget(1 << 20)).actions.size(), 1u);
}

TEST(PrefetchPlannerTest, TheBudgetIsTheShareOfTheHostTierLessWhatIsStillUnused) {
  EXPECT_EQ(PrefetchBudget(0.25, 1000, 0), 250u);
  EXPECT_EQ(PrefetchBudget(0.25, 1000, 100), 150u);
  EXPECT_EQ(PrefetchBudget(0.25, 1000, 400), 0u) << "never below zero";
  EXPECT_EQ(PrefetchBudget(0, 1000, 0), 0u);
  EXPECT_EQ(kPrefetchPlanRequests, 256u);
}

TEST(PrefetchPlannerTest, ALowPercentileOfTheLatestReadsIsWhatATierDeliversOnASlowDay) {
  BandwidthEstimate bw(5e9);
  EXPECT_DOUBLE_EQ(bw.Percentile(10), 5e9) << "the estimate before any read";
  // Rates of 1..10 MB/s: the 10th percentile (nearest rank) is the slowest.
  for (uint64_t mb = 1; mb <= 10; ++mb) bw.Observe(mb * 1'000'000, 1'000'000);
  EXPECT_DOUBLE_EQ(bw.Percentile(10), 1e6);
  EXPECT_DOUBLE_EQ(bw.Percentile(50), 5e6);
  EXPECT_DOUBLE_EQ(bw.Percentile(100), 10e6);
  // Only the last kWindow reads count: 64 reads at 20 MB/s push the others out.
  for (size_t i = 0; i < BandwidthEstimate::kWindow; ++i) bw.Observe(20'000'000, 1'000'000);
  EXPECT_DOUBLE_EQ(bw.Percentile(10), 20e6);
  bw.Observe(0, 5);  // ignored
  bw.Observe(5, 0);
  EXPECT_DOUBLE_EQ(bw.Percentile(0), 20e6);
}

}  // namespace
}  // namespace kvtier

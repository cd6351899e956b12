// Tests of PlanPrefetch and BandwidthEstimate: deadline order, the longest
// prefix that arrives in time, holes, short hits, the host budget, shared
// blocks read once, one channel per tier, and the moving average.
#include "policy/prefetch_planner.h"

#include <gtest/gtest.h>

#include <vector>

namespace kvtier {
namespace {

constexpr uint64_t kNow = 1'000'000;
using P = BlockPlace;

BlockKey K(uint64_t i) { return BlockKey{0x7e, i}; }

// 1 byte per microsecond: a 1000-byte block takes 1000 us.
BandwidthEstimate OneBytePerUs() { return BandwidthEstimate(1e6); }

PrefetchRequest Request(uint64_t id, uint64_t deadline_in_us, std::vector<std::pair<uint64_t, P>> blocks) {
  PrefetchRequest r;
  r.id = id;
  r.deadline_us = kNow + deadline_in_us;
  for (auto [k, place] : blocks) r.chain.push_back(PrefetchBlock{K(k), 1000, place});
  return r;
}

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
  const std::vector<PrefetchRequest> queue = {Request(1, 100'000, {{1, P::kNvme}}),
                                              Request(2, 10'000, {{2, P::kNvme}})};
  auto plan = PlanPrefetch(kNow, queue, OneBytePerUs(), OneBytePerUs(), Budget(1 << 20));
  EXPECT_EQ(Keys(plan), (std::vector<uint64_t>{2, 1}));
  EXPECT_EQ(plan.actions[0].start_us, kNow);
  EXPECT_EQ(plan.actions[0].done_us, kNow + 1000);
  EXPECT_EQ(plan.actions[1].start_us, kNow + 1000) << "one NVMe channel: after the first read";
  EXPECT_EQ(plan.bytes, 2000u);
}

TEST(PrefetchPlannerTest, FetchesTheLongestPrefixThatArrivesByTheDeadline) {
  const std::vector<PrefetchRequest> queue = {
      Request(1, 2500, {{1, P::kNvme}, {2, P::kNvme}, {3, P::kNvme}, {4, P::kNvme}})};
  auto plan = PlanPrefetch(kNow, queue, OneBytePerUs(), OneBytePerUs(), Budget(1 << 20));
  EXPECT_EQ(Keys(plan), (std::vector<uint64_t>{1, 2})) << "the third would arrive at +3000";
  EXPECT_EQ(plan.cut_by_deadline, 1u);
}

TEST(PrefetchPlannerTest, HostBlocksCountButAreNotReadAndAHoleEndsThePrefix) {
  const std::vector<PrefetchRequest> queue = {Request(
      1, 100'000, {{1, P::kHost}, {2, P::kNvme}, {3, P::kHost}, {4, P::kRemote}, {5, P::kNowhere}, {6, P::kNvme}})};
  auto plan = PlanPrefetch(kNow, queue, OneBytePerUs(), OneBytePerUs(), Budget(1 << 20));
  EXPECT_EQ(Keys(plan), (std::vector<uint64_t>{2, 4})) << "6 is behind a block cached nowhere";
  EXPECT_EQ(plan.actions[1].from, P::kRemote);
  EXPECT_EQ(plan.actions[1].start_us, kNow) << "the remote channel runs beside the NVMe one";
}

TEST(PrefetchPlannerTest, ShortHitsAreSkipped) {
  const std::vector<PrefetchRequest> queue = {Request(1, 100'000, {{1, P::kNvme}, {2, P::kNowhere}}),
                                              Request(2, 200'000, {{3, P::kHost}, {4, P::kNvme}, {5, P::kNvme}})};
  auto plan = PlanPrefetch(kNow, queue, OneBytePerUs(), OneBytePerUs(), Budget(1 << 20, /*min_hit=*/3));
  EXPECT_EQ(Keys(plan), (std::vector<uint64_t>{4, 5})) << "request 1 would hit one block only";
  EXPECT_EQ(plan.skipped_short, 1u);
  EXPECT_EQ(plan.actions[0].start_us, kNow) << "a skipped request takes no channel time";
  // A prefix cut by the deadline can become too short as well.
  const std::vector<PrefetchRequest> tight = {Request(3, 1500, {{6, P::kNvme}, {7, P::kNvme}, {8, P::kNvme}})};
  plan = PlanPrefetch(kNow, tight, OneBytePerUs(), OneBytePerUs(), Budget(1 << 20, 2));
  EXPECT_TRUE(plan.actions.empty());
  EXPECT_EQ(plan.skipped_short, 1u);
}

TEST(PrefetchPlannerTest, TheHostBudgetGoesToTheEarliestDeadlines) {
  const std::vector<PrefetchRequest> queue = {Request(1, 100'000, {{1, P::kNvme}, {2, P::kNvme}, {3, P::kNvme}}),
                                              Request(2, 200'000, {{4, P::kNvme}})};
  auto plan = PlanPrefetch(kNow, queue, OneBytePerUs(), OneBytePerUs(), Budget(2500));
  EXPECT_EQ(Keys(plan), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(plan.bytes, 2000u);
  EXPECT_EQ(plan.cut_by_budget, 1u);
  plan = PlanPrefetch(kNow, queue, OneBytePerUs(), OneBytePerUs(), Budget(0));
  EXPECT_TRUE(plan.actions.empty());
}

TEST(PrefetchPlannerTest, ASharedBlockIsReadOnceForEveryRequestThatNeedsIt) {
  const std::vector<PrefetchRequest> queue = {Request(1, 10'000, {{1, P::kNvme}, {2, P::kNvme}}),
                                              Request(2, 20'000, {{1, P::kNvme}, {3, P::kNvme}})};
  auto plan = PlanPrefetch(kNow, queue, OneBytePerUs(), OneBytePerUs(), Budget(1 << 20, 2));
  EXPECT_EQ(Keys(plan), (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(plan.actions[0].request, 1u);
  // The shared root arrives too late for a request due before it lands.
  const std::vector<PrefetchRequest> racing = {Request(1, 10'000, {{5, P::kNvme}, {6, P::kNvme}}),
                                               Request(2, 10'500, {{6, P::kNvme}, {7, P::kNvme}})};
  plan = PlanPrefetch(kNow, racing, BandwidthEstimate(1e5), OneBytePerUs(), Budget(1 << 20, 1));
  // At 0.1 byte/us a block takes 10 ms: only 5 fits request 1's deadline;
  // 6 would land at +20 ms, after both deadlines.
  EXPECT_EQ(Keys(plan), (std::vector<uint64_t>{5}));
  EXPECT_EQ(plan.cut_by_deadline, 1u);
}

TEST(PrefetchPlannerTest, SlowerMeasuredBandwidthShortensThePlan) {
  BandwidthEstimate nvme(1e6);
  const std::vector<PrefetchRequest> queue = {
      Request(1, 3000, {{1, P::kNvme}, {2, P::kNvme}, {3, P::kNvme}, {4, P::kNvme}})};
  EXPECT_EQ(PlanPrefetch(kNow, queue, nvme, nvme, Budget(1 << 20)).actions.size(), 3u);
  for (int i = 0; i < 50; ++i) nvme.Observe(1000, 2000);  // the drive turns out to be half as fast
  EXPECT_EQ(PlanPrefetch(kNow, queue, nvme, nvme, Budget(1 << 20)).actions.size(), 1u);
}

}  // namespace
}  // namespace kvtier

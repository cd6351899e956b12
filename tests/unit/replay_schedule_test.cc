// kvtier replay's engine-model schedule (ReplayOptions::record_schedule):
// the steps a live replay repeats against a daemon, in time order, and the
// prefetch plans made where the daemon's engine makes them.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tests/testing/replay_trace_files.h"
#include "tools/replay/replay_sim.h"
#include "tools/replay/replay_trace.h"

namespace kvtier::tools {
namespace {

using Kind = ScheduleEvent::Kind;

class ReplayScheduleTest : public ::kvtier::testing::ReplayTraceFiles {
 protected:
  // One engine at 1000 tokens/s over a host tier of 3 blocks and an NVMe
  // tier, prefetch into all of the host tier.
  static ReplayOptions OneEngine() {
    ReplayOptions o;
    o.host = Capacity{Capacity::Unit::kBlocks, 3, false};
    o.nvme = Capacity{Capacity::Unit::kBlocks, 100, false};
    o.bytes_per_token = 1000;
    o.engines = 1;
    o.prefill_tps = 1000;
    o.prefetch_share = 1.0;
    o.record_schedule = true;
    return o;
  }
};

struct Step {
  Kind kind;
  uint64_t at_us;
  size_t request;
  bool operator==(const Step&) const = default;
};

std::vector<Step> Steps(const std::vector<ScheduleEvent>& schedule) {
  std::vector<Step> steps;
  for (const ScheduleEvent& e : schedule) steps.push_back(Step{e.kind, e.at_us, e.request});
  return steps;
}

TEST_F(ReplayScheduleTest, TheStepsComeInTimeOrderPrefillsEndingFirst) {
  // [0] runs 0-8 ms, [1] (arrived at 1 ms) 8-20 ms, [2] 20-24 ms, [3]
  // after. At [1]'s start [0]'s prefill has ended (its commit comes
  // first), and [2] and [3], arrived meanwhile, are hinted, a mean service
  // (8 ms) apart; [1] never waited behind a start, so it was never hinted.
  auto trace =
      ReadMooncakeTrace(Write({Line(0, 8, "1, 2"), Line(1, 12, "3, 4, 5"), Line(2, 4, "7"), Line(3, 8, "1, 2")}), 4, 0);
  ASSERT_TRUE(trace.ok());
  auto r = Replay(*trace, OneEngine());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const std::vector<Step> steps = Steps(r->schedule);
  ASSERT_EQ(steps.size(), 12u);
  const std::vector<Step> first = {{Kind::kStart, 0, 0},       {Kind::kCommit, 8000, 0}, {Kind::kEnqueue, 8000, 2},
                                   {Kind::kEnqueue, 8000, 3},  {Kind::kStart, 8000, 1},  {Kind::kCommit, 20000, 1},
                                   {Kind::kDequeue, 20000, 2}, {Kind::kStart, 20000, 2}, {Kind::kCommit, 24000, 2},
                                   {Kind::kDequeue, 24000, 3}, {Kind::kStart, 24000, 3}};
  EXPECT_EQ(std::vector<Step>(steps.begin(), steps.begin() + 11), first);
  EXPECT_EQ(steps.back().kind, Kind::kCommit);
  EXPECT_EQ(steps.back().request, 3u);
  EXPECT_EQ(r->schedule[2].start_us, 16000u);
  EXPECT_EQ(r->schedule[3].start_us, 24000u);
  for (size_t i = 1; i < steps.size(); ++i) EXPECT_LE(steps[i - 1].at_us, steps[i].at_us) << i;
  // [1]'s commit at 20 ms pushes 1 and 2 down; [2]'s start (a Dequeue)
  // plans for the queued [3] and reads them back; [3] pins them at its
  // commit: used.
  EXPECT_EQ(r->prefetches, 2u);
  EXPECT_EQ(r->prefetch_used, 2u);
  EXPECT_EQ(r->tiers[kHostTier].hits, 2u);

  ReplayOptions unrecorded = OneEngine();
  unrecorded.record_schedule = false;
  EXPECT_TRUE(Replay(*trace, unrecorded)->schedule.empty());
}

TEST_F(ReplayScheduleTest, AScheduleNeedsTheEngineModelOnOneNode) {
  auto trace = ReadMooncakeTrace(Write({Line(0, 4, "1")}), 4, 0);
  ASSERT_TRUE(trace.ok());
  ReplayOptions o = OneEngine();
  o.engines = 0;
  EXPECT_EQ(Replay(*trace, o).status().code(), StatusCode::kInvalidArgument);
  o = OneEngine();
  o.nodes = 2;
  EXPECT_EQ(Replay(*trace, o).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvtier::tools

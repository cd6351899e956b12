// kvtier replay's write channels into the tiers below: a demotion waits
// behind earlier ones, and is given up by the daemon's own rule
// (policy/option_defaults.h's kQueuedDemotionWaitMs, the demotion
// buffer), so the replay cannot drift from Demoter.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "daemon/engine/demoter.h"
#include "daemon/engine/engine_types.h"
#include "tests/testing/replay_trace_files.h"
#include "tools/replay/replay_sim.h"
#include "tools/replay/replay_trace.h"

namespace kvtier::tools {
namespace {

class ReplayWriteChannelTest : public ::kvtier::testing::ReplayTraceFiles {
 protected:
  // Host 1 block over NVMe 10 blocks, 4-token blocks, 1 byte per token,
  // every block admitted.
  static ReplayOptions TwoTiers() {
    ReplayOptions o;
    o.host = Capacity{Capacity::Unit::kBlocks, 1, false};
    o.nvme = Capacity{Capacity::Unit::kBlocks, 10, false};
    o.admission = "all";
    o.bytes_per_token = 1;
    return o;
  }
};

TEST_F(ReplayWriteChannelTest, ADemotionThatWouldWaitTooLongForTheWriteChannelIsDropped) {
  // 4-byte blocks into an NVMe tier writing 0.25 bytes/s: a demotion takes
  // 16 s. [2] demotes 1 at 0; [3] at 0 would wait 16 s (> the daemon's
  // 10 s): 2 is dropped; [4] at 80 s demotes 3; then [1] (an NVMe hit) at
  // 80.001 s and [3] at 80.003 s each demote a block into a channel busy
  // until 96 s: dropped.
  auto trace = ReadMooncakeTrace(Write({Line(0, 4, "1"), Line(0, 4, "2"), Line(0, 4, "3"), Line(80000, 4, "4"),
                                        Line(80001, 4, "1"), Line(80002, 4, "2"), Line(80003, 4, "3")}),
                                 4, 0);
  ASSERT_TRUE(trace.ok());
  ReplayOptions o = TwoTiers();
  o.write_bytes_per_s[kNvmeTier] = 0.25;
  auto r = Replay(*trace, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->tiers[kNvmeTier].dropped_busy, 3u);
  EXPECT_EQ(r->tiers[kNvmeTier].hits, 2u) << "1 and 3; 2 was dropped";
  o.write_bytes_per_s[kNvmeTier] = 0;  // no limit
  EXPECT_EQ(Replay(*trace, o)->tiers[kNvmeTier].hits, 3u);
}

// The replay gives a queued demotion up when the daemon's demoter does
// (policy/option_defaults.h), so a demotion waiting 1 s is written, as
// kvtierd writes it; and one that does not fit the demotion buffer is
// dropped, as kvtierd drops it.
TEST_F(ReplayWriteChannelTest, AQueuedDemotionWaitsAsLongAsTheDaemonsDemoterWaits) {
  EXPECT_EQ(std::chrono::microseconds(ReplayOptions{}.max_write_backlog_us),
            std::chrono::microseconds(Demoter::kQueuedDemotionWaitUs));
  EXPECT_EQ(ReplayOptions{}.demotion_buffer_bytes, EngineOptions{}.demotion_buffer_bytes);
  // 4-byte blocks at 4 bytes/s: [3] at 0 waits 1 s behind the demotion of
  // 1 to demote 2, more than the 200 ms the replay once gave up after.
  auto trace = ReadMooncakeTrace(Write({Line(0, 4, "1"), Line(0, 4, "2"), Line(0, 4, "3"), Line(5000, 4, "4"),
                                        Line(5001, 4, "1"), Line(5002, 4, "2")}),
                                 4, 0);
  ASSERT_TRUE(trace.ok());
  ReplayOptions o = TwoTiers();
  o.write_bytes_per_s[kNvmeTier] = 4;
  auto r = Replay(*trace, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->tiers[kNvmeTier].dropped_busy, 0u);
  EXPECT_EQ(r->tiers[kNvmeTier].hits, 2u) << "1 and 2, each written after waiting";
  // A buffer of one block: the demotion of 2 would queue 8 bytes (1's
  // 4 still to write, and its own): dropped, so [2] later misses; so is
  // that of 4 at 5.001 s, queued behind 3's.
  o.demotion_buffer_bytes = 4;
  r = Replay(*trace, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->tiers[kNvmeTier].dropped_busy, 2u);
  EXPECT_EQ(r->tiers[kNvmeTier].hits, 1u) << "1 only";
}

}  // namespace
}  // namespace kvtier::tools

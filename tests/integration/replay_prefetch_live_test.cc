// The replay's prefetch is the daemon's: an engine-model run of the
// simulator records its schedule (queue hints, starts, ends of prefills),
// and a client drives an in-process daemon through the same steps
// (ReplayLive with LiveOptions::schedule), its clock a FakeClock moved to
// each step's time and its background work waited for after each. Both
// plan with policy/prefetch_planner.h at the daemon's triggers, on the same
// read bandwidth (the daemon's read meters measure nothing on a clock that
// does not move, and keep defaults::kInitialReadBytesPerS), so they read the
// same blocks in and find the same hits in each tier.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

#include "policy/option_defaults.h"
#include "policy/policy_registry.h"
#include "policy/reclaim_policy.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/live_parity.h"
#include "tests/testing/map_tier.h"
#include "tests/testing/seeded_numbers.h"
#include "tests/testing/test_daemon.h"
#include "tools/replay/replay_live.h"
#include "tools/replay/replay_sim.h"

namespace kvtier::tools {
namespace {

using testing::EngineCounter;
using testing::FakeClock;
using testing::TestDaemon;
using testing::TestDaemonOptions;

constexpr uint32_t kBlockTokens = 4;
constexpr uint64_t kBlockBytes = 64 << 10;
constexpr uint64_t kBytesPerToken = kBlockBytes / kBlockTokens;
constexpr uint64_t kRecordBytes = 4096 + kBlockBytes;  // the NVMe record: header + payload
constexpr uint64_t kRegionBytes = 4 * kRecordBytes;
constexpr uint64_t kNvmeBytes = 6 * kRegionBytes;
static_assert(kNvmeBytes % kBytesPerToken == 0, "the sim's capacity is in tokens");
constexpr uint64_t kHostBlocks = 16;
// Prefetch into one block of the host tier: each plan reads at most one
// block, so it moves at most one block between tiers. The daemon runs a
// plan's reads, and the demotions their room makes, concurrently (its NVMe
// log's writes and region turns race with its reads): a plan of several
// reads can change the tiers in another order than the sim's, as a
// request's pins would unless they are made one call each.
constexpr double kPrefetchShare = 1.0 / kHostBlocks;
constexpr uint64_t kRemoteBytes = uint64_t{1} << 30;
constexpr uint64_t kClockStartUs = 1'000'000;  // FakeClock's: the trace's time 0

// Documents of up to 5 blocks drawn with a skew, each request a prefix of
// at least 2 blocks of one (one in four adding a block of its own),
// arriving four at once every 4 ms: one engine falls behind within each
// burst, so requests queue (and are hinted), and a queued request's prefix
// has often left the host tier for a tier below by then, for a plan to
// read back.
Trace BurstTrace() {
  Trace t;
  t.path = "bursts";
  t.block_tokens = kBlockTokens;
  testing::SeededNumbers numbers(4242);
  const auto next = [&numbers] { return numbers.Next(); };
  for (uint64_t r = 0; r < 400; ++r) {
    TraceRequest req;
    req.arrival_us = (r / 4) * 4000;
    const uint64_t a = next() % 20, b = next() % 20;
    const uint64_t doc = std::min(a, b);
    const uint64_t length = 2 + next() % 4;
    for (uint64_t i = 0; i < length; ++i) req.blocks.push_back(BlockKey{doc + 1, i + 1});
    if (next() % 4 == 0) req.blocks.push_back(BlockKey{1000 + r, 1});
    req.input_tokens = kBlockTokens * req.blocks.size();
    t.requests.push_back(std::move(req));
  }
  return t;
}

// One engine at `prefill_tps`, the host tier, the NVMe log and (when
// `remote`) a remote tier under it; the planner's bandwidths are the
// daemon's before it measures.
ReplayOptions EngineModel(double prefill_tps, bool remote) {
  ReplayOptions o;
  o.host = Capacity{Capacity::Unit::kBlocks, kHostBlocks, false};
  o.nvme = Capacity{Capacity::Unit::kTokens, kNvmeBytes / kBytesPerToken, false};
  if (remote) o.remote = Capacity{Capacity::Unit::kTokens, kRemoteBytes / kBytesPerToken, false};
  o.policy = "lru";
  o.nvme_eviction = "lru";
  o.nvme_region_bytes = kRegionBytes;
  o.nvme_reinsert_share = 0.5;
  o.bytes_per_token = kBytesPerToken;
  o.write_bytes_per_s = {0, 0, 0};  // the live run has no write channel model
  o.read_bytes_per_s[kNvmeTier] = defaults::kInitialReadBytesPerS;
  o.read_bytes_per_s[kRemoteTier] = defaults::kInitialReadBytesPerS;
  o.prefetch_share = kPrefetchShare;
  o.engines = 1;
  o.prefill_tps = prefill_tps;
  o.record_schedule = true;
  return o;
}

// The trace through the simulator's engine model and, on its schedule,
// through an in-process daemon of the same tiers; the sim's result.
ReplayResult SimAndLiveAgree(const Trace& trace, const ReplayOptions& sim_options) {
  SCOPED_TRACE(std::string(sim_options.remote ? "with" : "without") + " a remote tier");
  auto sim = Replay(trace, sim_options);
  EXPECT_TRUE(sim.ok()) << sim.status().ToString();
  if (!sim.ok()) return {};

  FakeClock clock(kClockStartUs);
  testing::MapTier remote(kRemoteBytes, "remote");
  TestDaemonOptions options;
  options.clock = &clock;
  options.arena_bytes = kHostBlocks * kBlockBytes;
  options.limits.max_reserved_bytes = options.arena_bytes;
  options.shards = 1;
  options.eviction = *ParseEvictionPolicy(sim_options.policy);
  options.directory_slots = -1;
  options.nvme_in_memory = true;
  options.nvme_bytes = kNvmeBytes;
  options.nvme_region_bytes = kRegionBytes;
  options.nvme_eviction = *ParseReclaimOrder(sim_options.nvme_eviction);
  options.nvme_reinsert_share = sim_options.nvme_reinsert_share;
  options.prefetch_share = sim_options.prefetch_share;
  if (sim_options.remote) options.remote = &remote;
  TestDaemon daemon(options);
  LiveOptions live_options = testing::SettledLiveOptions(daemon, kBytesPerToken);
  live_options.schedule = sim->schedule;
  live_options.at = [&clock](uint64_t at_us) { clock.SetUs(kClockStartUs + at_us); };
  auto live = ReplayLive(trace, live_options);
  EXPECT_TRUE(live.ok()) << live.status().ToString();
  if (!live.ok()) return {};

  EXPECT_EQ(live->requests, sim->requests);
  testing::ExpectTheSameHits(*live, *sim);
  EXPECT_EQ(EngineCounter(daemon, "engine.prefetches"), static_cast<int64_t>(sim->prefetches));
  EXPECT_EQ(EngineCounter(daemon, "engine.prefetch_bytes"), static_cast<int64_t>(sim->prefetch_bytes));
  // A use is a pin of a prefetched block: landed (on time) or, were a pin
  // to wait for its read, late; settled, none is.
  EXPECT_EQ(EngineCounter(daemon, "engine.prefetches_on_time"), static_cast<int64_t>(sim->prefetch_used));
  EXPECT_EQ(EngineCounter(daemon, "engine.prefetches_late"), 0);
  EXPECT_EQ(EngineCounter(daemon, "nvme.reinserted"), static_cast<int64_t>(sim->nvme_reinserted));
  // The trace exercises what it should: requests queue, plans read blocks
  // in, and requests use them.
  EXPECT_GT(sim->mean_queue, 1.0);
  EXPECT_GT(sim->prefetches, 0u);
  EXPECT_GT(sim->prefetch_used, 0u);
  EXPECT_GT(sim->tiers[kNvmeTier].hits, 0u);
  return std::move(*sim);
}

TEST(ReplayNvmeLiveTest, SimAndLivePrefetchTheSameBlocks) {
  const Trace trace = BurstTrace();
  SimAndLiveAgree(trace, EngineModel(10000, /*remote=*/false));
}

// Two channels: the NVMe tier's and the remote tier's (the NVMe log's
// evictions go there), each planned at its own bandwidth.
TEST(ReplayNvmeLiveTest, SimAndLivePrefetchTheSameBlocksFromTwoTiers) {
  const Trace trace = BurstTrace();
  const ReplayResult r = SimAndLiveAgree(trace, EngineModel(4000, /*remote=*/true));
  EXPECT_GT(r.tiers[kRemoteTier].hits, 0u);
}

}  // namespace
}  // namespace kvtier::tools

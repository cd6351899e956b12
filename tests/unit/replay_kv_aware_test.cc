// kvtier replay with the kv_aware router (ReplayOptions::router, docs/REPLAY.md
// "KV-aware routing"): requests routed at arrival by max(Q, R) + C from
// delayed, lossy KV events, against round_robin on a trace built so the
// reason is plain.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <vector>

#include "tools/replay/replay_sim.h"
#include "tools/replay/replay_trace.h"

namespace kvtier::tools {
namespace {

constexpr uint32_t kBlockTokens = 100;
constexpr uint64_t kDocBlocks = 20;

// Two documents of 20 blocks (2000 tokens) asked about, each question a
// block of its own. On two nodes of one engine at 1000 tokens/s, a request
// that finds its document prefills 100 tokens (0.1 s), one that does not
// 2100 (2.1 s); a node's host tier (25 blocks) holds one document, not two.
// First D1 at 0 and D2 at 0.1 s (each its node: the second node is free);
// from 3 s, `burst` questions `gap_ms` apart in pairs D1, D1, D2, D2, ...
// round_robin sends burst questions 0, 2, 4, ... (D1, D2, D1, ...) to one
// node: each finds the other document there and misses, and at about 2 s of
// work every 1.2 s its queue grows without end. kv_aware knows where each
// document is and keeps D1 on one node, D2 on the other: 0.1 s each.
Trace TwoDocuments(uint64_t burst, uint64_t gap_ms) {
  Trace t;
  t.path = "in-memory";
  t.block_tokens = kBlockTokens;
  auto ask = [&](uint64_t at_ms, uint64_t doc) {
    TraceRequest r;
    r.arrival_us = at_ms * 1000;
    for (uint64_t b = 0; b < kDocBlocks; ++b) r.blocks.push_back(BlockKey{0, doc + b});
    r.blocks.push_back(BlockKey{0, 1'000'000 + t.requests.size()});  // the question
    r.input_tokens = kBlockTokens * r.blocks.size();
    t.requests.push_back(std::move(r));
  };
  ask(0, 1000);
  ask(100, 2000);
  for (uint64_t i = 0; i < burst; ++i) ask(3000 + i * gap_ms, (i / 2) % 2 == 0 ? 1000 : 2000);
  return t;
}

ReplayOptions Options(Router router) {
  ReplayOptions o;
  o.nodes = 2;
  o.router = router;
  o.host = Capacity{Capacity::Unit::kBlocks, 25, false};
  o.engines = 1;
  o.prefill_tps = 1000;
  return o;
}

ReplayResult Replayed(const Trace& trace, const ReplayOptions& o) {
  auto r = Replay(trace, o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : ReplayResult{};
}

TEST(ReplayKvAwareTest, BeatsRoundRobinOnTtftWhenRoundRobinScattersThePrefixes) {
  const Trace trace = TwoDocuments(40, 600);
  ReplayOptions rr_options = Options(Router::kRoundRobin);
  rr_options.fetch = FetchModel::kOverlap;  // the same engine model for both
  const ReplayResult rr = Replayed(trace, rr_options);
  const ReplayResult kv = Replayed(trace, Options(Router::kKvAware));
  EXPECT_EQ(FetchModelOf(Options(Router::kKvAware)), FetchModel::kOverlap);
  EXPECT_EQ(rr.nodes[0].requests, 21u);
  // round_robin: a burst question finds the other document, and of its own
  // only the 4 root blocks the other's 21 did not push out (the tail goes
  // first): 400 of 2100 tokens.
  EXPECT_LT(rr.token_hit_rate(), 0.25);
  EXPECT_GT(kv.token_hit_rate(), 0.8);
  EXPECT_GT(kv.events_published, 0u);
  EXPECT_EQ(kv.events_lost, 0u);
  ASSERT_EQ(kv.ttft_ms.size(), 42u);
  // round_robin's queue grows about 0.5 s a question on each node: 11.6 s
  // at the end; kv_aware stays near the hits' 0.1 s after the first two
  // misses.
  EXPECT_GT(*rr.ttft_percentile(99), 10'000);
  EXPECT_LT(*kv.ttft_percentile(99), *rr.ttft_percentile(99) / 4);
  EXPECT_LT(*kv.ttft_percentile(50), 500);
}

// What the router does not learn it cannot use: with every event lost it
// spreads by load alone, and with events later than the trace it never
// sees a store in time; both lose the hits it gets when told.
TEST(ReplayKvAwareTest, LostOrLateEventsLoseTheHits) {
  const Trace trace = TwoDocuments(40, 600);
  ReplayOptions told = Options(Router::kKvAware);
  told.event_delay_us = 0;
  ReplayOptions blind = told;
  blind.event_loss = 1.0;
  ReplayOptions late = told;
  late.event_delay_us = 3'600'000'000;
  const ReplayResult with_events = Replayed(trace, told);
  const ReplayResult without = Replayed(trace, blind);
  const ReplayResult too_late = Replayed(trace, late);
  EXPECT_EQ(without.events_lost, without.events_published);
  EXPECT_GT(with_events.token_hit_rate(), 0.8);
  EXPECT_LT(without.token_hit_rate(), 0.5);
  EXPECT_LT(too_late.token_hit_rate(), 0.5);
  EXPECT_GT(*without.ttft_percentile(99), 2 * *with_events.ttft_percentile(99));
}

TEST(ReplayKvAwareTest, NeedsTheEngineModelAndALossRate) {
  const Trace trace = TwoDocuments(4, 600);
  ReplayOptions o = Options(Router::kKvAware);
  o.engines = 0;
  o.prefill_tps = 0;
  EXPECT_FALSE(Replay(trace, o).ok());
  o = Options(Router::kKvAware);
  o.event_loss = 1.5;
  EXPECT_FALSE(Replay(trace, o).ok());
  EXPECT_EQ(ParseRouter("kv_aware"), Router::kKvAware);
  EXPECT_EQ(RouterName(Router::kKvAware), "kv_aware");
}

// The overlap model never waits longer than the serial one: the fetch
// runs beside the queue instead of after it. A host tier over an NVMe
// tier (bytes to read) on one node.
TEST(ReplayKvAwareTest, OverlapNeverSlowerThanSerial) {
  const Trace trace = TwoDocuments(40, 600);
  ReplayOptions o = Options(Router::kRoundRobin);
  o.nodes = 1;
  o.bytes_per_token = 1'000'000;  // 100 MB a block: an NVMe read of 20 ms at 5 GB/s
  o.nvme = Capacity{Capacity::Unit::kBlocks, 100, false};
  ReplayOptions overlap = o;
  overlap.fetch = FetchModel::kOverlap;
  const ReplayResult serial = Replayed(trace, o);
  const ReplayResult overlapped = Replayed(trace, overlap);
  EXPECT_EQ(serial.token_hit_rate(), overlapped.token_hit_rate());
  EXPECT_GT(serial.tiers[kHostTier].hits, 0u);
  ASSERT_EQ(serial.ttft_ms.size(), overlapped.ttft_ms.size());
  EXPECT_LE(*overlapped.ttft_percentile(99), *serial.ttft_percentile(99));
  EXPECT_LT(*overlapped.ttft_percentile(50), *serial.ttft_percentile(50));
}

// Belady under kv_aware: the routes are made in the run, so every node's
// tiers read the one next use per block (the next request naming it, on
// any node). A node whose tiers kept the next use as of its own last
// lookup held a block another node had served since as needed next, for
// good: its host tier filled with such blocks, Belady's only victims left
// were the blocks the prefetch planner read in for a queued request, and
// each read evicted the one before it (its bytes back in the budget, the
// plan read it again), without end. Six requests on two nodes of six host
// blocks reach that state. The run is forked with an alarm, so a return
// of the loop fails the test instead of hanging the suite.
Trace PrefetchAfterOtherNodesLookups() {
  Trace t;
  t.path = "in-memory";
  t.block_tokens = kBlockTokens;
  const std::vector<std::pair<uint64_t, std::vector<uint64_t>>> requests = {
      {291, {101, 102}},       {727, {3, 4}},  {1086, {201, 202, 203, 1'000'006}},
      {1298, {201, 202, 203}}, {1313, {3, 4}}, {1427, {101, 102}},
  };
  for (const auto& [at_ms, blocks] : requests) {
    TraceRequest r;
    r.arrival_us = at_ms * 1000;
    for (uint64_t b : blocks) r.blocks.push_back(BlockKey{0, b});
    r.input_tokens = kBlockTokens * r.blocks.size();
    t.requests.push_back(std::move(r));
  }
  return t;
}

TEST(ReplayKvAwareTest, BeladyWithPrefetchEndsAfterOtherNodesLookups) {
  const Trace trace = PrefetchAfterOtherNodesLookups();
  ReplayOptions o = Options(Router::kKvAware);
  o.policy = "belady";
  o.host = Capacity{Capacity::Unit::kBlocks, 6, false};
  o.remote = Capacity{Capacity::Unit::kBlocks, 1000, false};
  o.bytes_per_token = 1000;
  o.event_delay_us = 0;
  o.prefetch_share = 0.75;
  EXPECT_EXIT(
      {
        alarm(10);
        const bool ok = Replay(trace, o).ok();
        std::_Exit(ok ? 0 : 1);
      },
      testing::ExitedWithCode(0), "");
  if (HasFailure()) return;  // it looped: not again in this process
  const ReplayResult run = Replayed(trace, o);
  EXPECT_EQ(run.requests, 6u);
  // Each plan reads a queued request's prefix once: no more reads than
  // the trace has blocks.
  EXPECT_LE(run.prefetches, 14u);
}

}  // namespace
}  // namespace kvtier::tools

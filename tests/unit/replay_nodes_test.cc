// kvtier replay with several nodes (ReplayOptions::nodes, docs/REPLAY.md
// "Several nodes"): each node's host and NVMe tiers are its own, the remote
// tier is shared; routing; the split of hits into local and shared; exact
// counts on hand-computed traces.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tools/replay/replay_sim.h"
#include "tools/replay/replay_trace.h"

namespace kvtier::tools {
namespace {

constexpr uint32_t kBlockTokens = 4;

// A request at `ms` over whole 4-token blocks `ids`.
TraceRequest Request(uint64_t ms, const std::vector<uint64_t>& ids, uint64_t session = 0) {
  TraceRequest r;
  r.arrival_us = ms * 1000;
  r.input_tokens = kBlockTokens * ids.size();
  r.session = session;
  for (uint64_t id : ids) r.blocks.push_back(BlockKey{0, id});
  return r;
}

Trace MakeTrace(std::vector<TraceRequest> requests) {
  Trace t;
  t.path = "in-memory";
  t.block_tokens = kBlockTokens;
  t.requests = std::move(requests);
  return t;
}

// `conversations` conversations of `turns` turns, turn-major (every
// conversation's turn 0, then every turn 1...), one request a millisecond.
// Turn t of conversation c sends blocks c*100 .. c*100+t: each turn's
// chain extends the one before, and conversations share no block.
Trace Conversations(uint64_t conversations, uint64_t turns) {
  std::vector<TraceRequest> requests;
  for (uint64_t t = 0; t < turns; ++t) {
    for (uint64_t c = 0; c < conversations; ++c) {
      std::vector<uint64_t> ids;
      for (uint64_t b = 0; b <= t; ++b) ids.push_back(c * 100 + b);
      requests.push_back(Request(requests.size(), ids, c + 1));
    }
  }
  return MakeTrace(std::move(requests));
}

Capacity Blocks(uint64_t n) { return Capacity{Capacity::Unit::kBlocks, n, false}; }
Capacity Infinite() { return Capacity{Capacity::Unit::kTokens, 0, true}; }

ReplayOptions Options(uint32_t nodes, Router router, Capacity host) {
  ReplayOptions o;
  o.nodes = nodes;
  o.router = router;
  o.host = host;
  return o;
}

ReplayResult Replayed(const Trace& trace, const ReplayOptions& o) {
  auto r = Replay(trace, o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : ReplayResult{};
}

TEST(ReplayRouteTest, RoundRobinCyclesAndPrefixAffinityFollowsTheFirstBlock) {
  const Trace t = MakeTrace(
      {Request(0, {1, 2}), Request(1, {1, 3}), Request(2, {7}), Request(3, {1}), Request(4, {}), Request(5, {7, 8})});
  EXPECT_EQ(RouteRequests(t, 3, Router::kRoundRobin), (std::vector<uint32_t>{0, 1, 2, 0, 1, 2}));
  const std::vector<uint32_t> affinity = RouteRequests(t, 3, Router::kPrefixAffinity);
  EXPECT_EQ(affinity[1], affinity[0]) << "the same first block, the same node";
  EXPECT_EQ(affinity[3], affinity[0]);
  EXPECT_EQ(affinity[5], affinity[2]);
  EXPECT_EQ(affinity[4], 0u) << "no blocks: node 0";
  EXPECT_EQ(affinity, RouteRequests(t, 3, Router::kPrefixAffinity)) << "deterministic";
  EXPECT_EQ(RouteRequests(t, 1, Router::kRoundRobin), std::vector<uint32_t>(6, 0));
  // The hash spreads first blocks over the nodes: 64 of them over 4 nodes
  // leave no node empty.
  std::vector<TraceRequest> many;
  for (uint64_t i = 0; i < 64; ++i) many.push_back(Request(i, {1000 + i}));
  std::vector<int> per_node(4, 0);
  for (uint32_t k : RouteRequests(MakeTrace(std::move(many)), 4, Router::kPrefixAffinity)) ++per_node[k];
  for (int count : per_node) EXPECT_GT(count, 4);
  // Conversations that all open with one system-prompt block: one node for
  // all of them on their first block, spread on their first two.
  std::vector<TraceRequest> prompted;
  for (uint64_t i = 0; i < 64; ++i) prompted.push_back(Request(i, {1, 1000 + i, 2000 + i}));
  const Trace p = MakeTrace(std::move(prompted));
  EXPECT_EQ(RouteRequests(p, 4, Router::kPrefixAffinity, 1), std::vector<uint32_t>(64, affinity[0]));
  std::vector<int> per_node2(4, 0);
  for (uint32_t k : RouteRequests(p, 4, Router::kPrefixAffinity, 2)) ++per_node2[k];
  for (int count : per_node2) EXPECT_GT(count, 4);
  EXPECT_EQ(RouteRequests(MakeTrace({Request(0, {1})}), 4, Router::kPrefixAffinity, 2)[0], affinity[0])
      << "a request shorter than the blocks hashed: the blocks it has";
  EXPECT_EQ(ParseRouter("round_robin"), Router::kRoundRobin);
  EXPECT_EQ(ParseRouter("prefix_affinity"), Router::kPrefixAffinity);
  EXPECT_EQ(ParseRouter("random"), std::nullopt);
  EXPECT_EQ(RouterName(Router::kRoundRobin), "round_robin");
}

// Two nodes of 2 blocks each, round robin (node 0 serves requests 0, 2, 4),
// and a shared remote tier with room for all; LRU. By hand:
//   r0 n0 [1,2] misses; n0 holds 1, 2.
//   r1 n1 [1,2] misses: n0's blocks are not n1's. n1 holds 1, 2.
//   r2 n0 [3,4] misses; n0 evicts 2 then 1 into the remote tier.
//   r3 n1 [1,2] hits both in n1's host tier: local.
//   r4 n0 [1,2] hits both in the remote tier: shared. Their promotion
//      evicts n0's 4 and 3 into the remote tier.
//   r5 n1 [3,4] hits both in the remote tier: shared (n1 never held them).
// One node of 2 blocks (the same trace): r1 and r4 hit in the host tier,
// r3 and r5 in the remote tier.
TEST(ReplayNodesTest, EachNodeSeesItsOwnTiersAndTheSharedRemoteTier) {
  const Trace t = MakeTrace({Request(0, {1, 2}), Request(1, {1, 2}), Request(2, {3, 4}), Request(3, {1, 2}),
                             Request(4, {1, 2}), Request(5, {3, 4})});
  ReplayOptions o = Options(2, Router::kRoundRobin, Blocks(2));
  o.remote = Infinite();
  o.bytes_per_token = 1;
  const ReplayResult two = Replayed(t, o);
  EXPECT_EQ(two.blocks, 12u);
  EXPECT_EQ(two.hit_blocks, 6u);
  EXPECT_EQ(two.tiers[kHostTier].hits, 2u);
  EXPECT_EQ(two.tiers[kRemoteTier].hits, 4u);
  EXPECT_EQ(two.tiers[kRemoteTier].bytes_written, 16u) << "1, 2, 3, 4 once each (4 bytes a block)";
  ASSERT_EQ(two.nodes.size(), 2u);
  EXPECT_EQ(two.nodes[0].requests, 3u);
  EXPECT_EQ(two.nodes[1].requests, 3u);
  EXPECT_EQ(two.nodes[0].local_hit_tokens, 0u);
  EXPECT_EQ(two.nodes[0].shared_hit_tokens, 8u);
  EXPECT_EQ(two.nodes[1].local_hit_tokens, 8u);
  EXPECT_EQ(two.nodes[1].shared_hit_tokens, 8u);
  EXPECT_DOUBLE_EQ(two.local_token_hit_rate(), 8.0 / 48);
  EXPECT_DOUBLE_EQ(two.shared_token_hit_rate(), 16.0 / 48);
  EXPECT_DOUBLE_EQ(two.local_block_hit_rate() + two.shared_block_hit_rate(), two.block_hit_rate());

  o.nodes = 1;
  const ReplayResult one = Replayed(t, o);
  EXPECT_EQ(one.hit_blocks, 8u);
  EXPECT_EQ(one.tiers[kHostTier].hits, 4u);
  EXPECT_EQ(one.tiers[kRemoteTier].hits, 4u);
  ASSERT_EQ(one.nodes.size(), 1u);
  EXPECT_EQ(one.nodes[0].requests, 6u);
  EXPECT_EQ(one.nodes[0].local_hit_tokens, 16u);
  EXPECT_EQ(one.nodes[0].shared_hit_tokens, 16u);
}

// One node is the single-node replay: the router is moot and every figure
// is the same (the single-node tests in replay_test.cc pin those).
TEST(ReplayNodesTest, OneNodeIsTheSingleNodeReplayWhateverTheRouter) {
  const Trace t = Conversations(5, 4);
  for (const char* policy : {"lru", "queue_aware", "belady"}) {
    SCOPED_TRACE(policy);
    ReplayOptions o;
    o.policy = policy;
    o.host = Blocks(6);
    o.nvme = Capacity{Capacity::Unit::kBlocks, 64, false};
    o.remote = Blocks(8);
    o.bytes_per_token = 1;
    o.engines = 1;
    o.prefill_tps = 2000;
    const ReplayResult base = Replayed(t, o);
    EXPECT_GT(base.hit_blocks, 0u);
    o.router = Router::kRoundRobin;
    const ReplayResult rr = Replayed(t, o);
    EXPECT_EQ(rr.hit_blocks, base.hit_blocks);
    EXPECT_EQ(rr.hit_tokens, base.hit_tokens);
    for (int tier = 0; tier < kSimTiers; ++tier) {
      EXPECT_EQ(rr.tiers[tier].hits, base.tiers[tier].hits);
      EXPECT_EQ(rr.tiers[tier].bytes_written, base.tiers[tier].bytes_written);
    }
    EXPECT_EQ(rr.ttft_ms, base.ttft_ms);
  }
}

// 15 conversations of 4 turns (60 distinct blocks). One node with room
// for all of them hits every earlier turn's chain in its host tier: 90 of
// 150 blocks, all local. Two nodes with half that room each:
// - round robin alternates each conversation's turns between the nodes
//   (15 is odd): a node misses the turn the other one served, and each
//   holds nearly every conversation, so it evicts into the shared remote
//   tier: the local hit rate falls and shared hits appear;
// - prefix affinity keeps each conversation on one node.
TEST(ReplayNodesTest, RoundRobinSplitsConversationsAndPrefixAffinityKeepsThemLocal) {
  const Trace t = Conversations(15, 4);
  ReplayOptions o = Options(1, Router::kPrefixAffinity, Blocks(60));
  o.remote = Infinite();
  o.bytes_per_token = 1;
  const ReplayResult one = Replayed(t, o);
  EXPECT_EQ(one.hit_blocks, 90u);
  EXPECT_EQ(one.tiers[kRemoteTier].hits, 0u);

  o.nodes = 2;
  o.host = Blocks(30);
  o.router = Router::kRoundRobin;
  const ReplayResult rr = Replayed(t, o);
  EXPECT_LT(rr.local_token_hit_rate(), one.local_token_hit_rate() / 2);
  EXPECT_GT(rr.tiers[kRemoteTier].hits, 0u);
  EXPECT_LT(rr.hit_blocks, one.hit_blocks);

  // With unlimited room per node (nothing is evicted, so nothing shared),
  // prefix affinity finds every hit one node finds; round robin loses
  // the turns served elsewhere.
  o.host = Infinite();
  o.router = Router::kPrefixAffinity;
  const ReplayResult affinity = Replayed(t, o);
  EXPECT_EQ(affinity.hit_blocks, one.hit_blocks);
  EXPECT_EQ(affinity.tiers[kRemoteTier].hits, 0u);
  EXPECT_GT(affinity.nodes[0].requests, 0u) << "the conversations spread over both nodes";
  EXPECT_GT(affinity.nodes[1].requests, 0u);
  o.router = Router::kRoundRobin;
  const ReplayResult rr_unlimited = Replayed(t, o);
  // Turn t of a conversation finds turn t-2's chain (t-1 blocks) on its node.
  EXPECT_EQ(rr_unlimited.hit_blocks, 15u * (0 + 1 + 2));
}

// Each node has its own engines: four requests of 100 ms of prefill that
// all arrive at 0 wait 0, 100, 200, 300 ms for one engine, and 0, 0, 100,
// 100 ms on two nodes of one engine each.
TEST(ReplayNodesTest, EachNodeHasItsOwnEngines) {
  std::vector<TraceRequest> requests;
  for (uint64_t i = 0; i < 4; ++i) requests.push_back(Request(0, {10 * i, 10 * i + 1}));
  const Trace t = MakeTrace(std::move(requests));
  ReplayOptions o = Options(1, Router::kRoundRobin, Infinite());
  o.engines = 1;
  o.prefill_tps = 80;  // 8 tokens: 100 ms
  EXPECT_EQ(Replayed(t, o).ttft_ms, (std::vector<double>{100, 200, 300, 400}));
  o.nodes = 2;
  const ReplayResult two = Replayed(t, o);
  EXPECT_EQ(two.ttft_ms, (std::vector<double>{100, 100, 200, 200})) << "in start order";
  EXPECT_DOUBLE_EQ(two.mean_queue, (1 + 1 + 0 + 0) / 4.0) << "each start sees its own node's queue";
}

// Each node has its own NVMe drive: the DWPD budget is one per node.
TEST(ReplayNodesTest, TheDwpdBudgetIsOnePerNode) {
  const Trace t = Conversations(3, 2);
  ReplayOptions o = Options(1, Router::kRoundRobin, Blocks(2));
  o.nvme = Capacity{Capacity::Unit::kBlocks, 64, false};
  o.bytes_per_token = 1;
  o.admission = "dwpd";
  o.dwpd.drive_capacity_bytes = 1'000'000;
  const uint64_t one = Replayed(t, o).ssd_budget_bytes;
  EXPECT_GT(one, 0u);
  o.nodes = 3;
  EXPECT_EQ(Replayed(t, o).ssd_budget_bytes, 3 * one);
}

TEST(ReplayNodesTest, ANodeCountOutsideOneToTheMostIsRefused) {
  const Trace t = Conversations(2, 2);
  for (uint32_t nodes : {0u, kMaxNodes + 1}) {
    auto r = Replay(t, Options(nodes, Router::kRoundRobin, Infinite()));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("nodes"), std::string::npos) << r.status().message();
  }
}

TEST(ReplayNodesTest, RunsAreDeterministic) {
  const Trace t = Conversations(9, 5);
  for (Router router : {Router::kRoundRobin, Router::kPrefixAffinity}) {
    ReplayOptions o = Options(4, router, Blocks(5));
    o.policy = "s3fifo";
    o.nvme = Capacity{Capacity::Unit::kBlocks, 32, false};
    o.remote = Blocks(12);
    o.bytes_per_token = 1;
    const ReplayResult a = Replayed(t, o), b = Replayed(t, o);
    EXPECT_EQ(a.hit_tokens, b.hit_tokens);
    for (size_t k = 0; k < a.nodes.size(); ++k) {
      EXPECT_EQ(a.nodes[k].local_hit_tokens, b.nodes[k].local_hit_tokens);
      EXPECT_EQ(a.nodes[k].shared_hit_tokens, b.nodes[k].shared_hit_tokens);
    }
  }
}

}  // namespace
}  // namespace kvtier::tools

// kvtier replay's peer tier (ReplayOptions::peer, kvtierd's [peer]): a
// node reads a block another node holds in its host or NVMe tier, asked
// after its own tiers and before the remote tier; the pull is promoted
// into the reader's host tier, is a use on its source, costs the peer
// bandwidth after one round trip; the peer tier is never written, and a
// victim a node learned a peer holds is not written further down. Exact
// counts on traces computed by hand.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tools/replay/replay_sim.h"
#include "tools/replay/replay_trace.h"

namespace kvtier::tools {
namespace {

constexpr uint32_t kBlockTokens = 4;

// A request at `ms` over whole 4-token blocks `ids`.
TraceRequest Request(uint64_t ms, const std::vector<uint64_t>& ids) {
  TraceRequest r;
  r.arrival_us = ms * 1000;
  r.input_tokens = kBlockTokens * ids.size();
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

Capacity Blocks(uint64_t n) { return Capacity{Capacity::Unit::kBlocks, n, false}; }
Capacity Infinite() { return Capacity{Capacity::Unit::kTokens, 0, true}; }

// Two nodes, round robin (node 0 serves requests 0, 2, 4...), LRU, one
// byte per token (4 bytes a block).
ReplayOptions TwoNodes(Capacity host, bool peer) {
  ReplayOptions o;
  o.nodes = 2;
  o.router = Router::kRoundRobin;
  o.host = host;
  o.bytes_per_token = 1;
  o.peer = peer;
  return o;
}

ReplayResult Replayed(const Trace& trace, const ReplayOptions& o) {
  auto r = Replay(trace, o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : ReplayResult{};
}

// r0 n0 [1,2] misses; r1 n1 [1,2]: node 1's own tier misses what node 0
// holds. With the peer tier it is a peer hit (pulled into node 1's host
// tier: r3 n1 [1,2] then hits there); without it, a miss.
TEST(ReplayPeerTest, ABlockAnotherNodeHoldsIsAPeerHit) {
  const Trace t = MakeTrace({Request(0, {1, 2}), Request(1, {1, 2}), Request(2, {7}), Request(3, {1, 2})});
  const ReplayResult off = Replayed(t, TwoNodes(Blocks(4), false));
  EXPECT_EQ(off.hit_blocks, 2u) << "r3 only, in node 1's host tier";
  EXPECT_EQ(off.peer.hits, 0u);

  const ReplayResult on = Replayed(t, TwoNodes(Blocks(4), true));
  EXPECT_EQ(on.hit_blocks, 4u);
  EXPECT_EQ(on.peer.hits, 2u);
  EXPECT_EQ(on.peer.hit_tokens, 8u);
  EXPECT_EQ(on.peer.bytes_read, 8u);
  EXPECT_EQ(on.peer.bytes_written, 0u) << "never written";
  EXPECT_EQ(on.peer_pulled_bytes, 8u);
  EXPECT_EQ(on.peer_pulls, 1u);
  EXPECT_EQ(on.tiers[kHostTier].hits, 2u) << "r3 hits what r1 pulled";
  EXPECT_EQ(on.nodes[0].peer_bytes_served, 8u);
  EXPECT_EQ(on.nodes[1].peer_bytes_served, 0u);
  EXPECT_EQ(on.nodes[1].peer_hit_tokens, 8u);
  EXPECT_EQ(on.nodes[1].local_hit_tokens, 8u);
  EXPECT_DOUBLE_EQ(on.peer_token_hit_rate(), 8.0 / 28);
  EXPECT_DOUBLE_EQ(on.local_block_hit_rate() + on.peer_block_hit_rate() + on.shared_block_hit_rate(),
                   on.block_hit_rate());
}

// Host tiers of 2 blocks, a shared remote tier with room for all:
//   r0 n0 [1,2] misses; r1 n1 [3,4] misses;
//   r2 n0 [5,6] misses: node 0 evicts 2, 1 into the remote tier;
//   r3 n1 [1,2]: the remote tier's (node 0 no longer holds them), pulled
//      into node 1 (evicting 4, 3 into the remote tier);
//   r4 n0 [1,2]: node 1 holds them, and so does the remote tier. The peer
//      tier is asked first: a peer hit; without it a remote hit.
TEST(ReplayPeerTest, ThePeerTierIsAskedBeforeTheRemoteTier) {
  const Trace t =
      MakeTrace({Request(0, {1, 2}), Request(1, {3, 4}), Request(2, {5, 6}), Request(3, {1, 2}), Request(4, {1, 2})});
  ReplayOptions o = TwoNodes(Blocks(2), false);
  o.remote = Infinite();
  const ReplayResult off = Replayed(t, o);
  EXPECT_EQ(off.tiers[kRemoteTier].hits, 4u);
  EXPECT_EQ(off.peer.hits, 0u);
  o.peer = true;
  const ReplayResult on = Replayed(t, o);
  EXPECT_EQ(on.hit_blocks, off.hit_blocks);
  EXPECT_EQ(on.tiers[kRemoteTier].hits, 2u) << "r3";
  EXPECT_EQ(on.peer.hits, 2u) << "r4";
  EXPECT_EQ(on.nodes[0].peer_hit_tokens, 8u);
  EXPECT_EQ(on.nodes[0].shared_hit_tokens, 0u);
  EXPECT_EQ(on.nodes[1].peer_bytes_served, 8u);
}

// No remote tier, host tiers of 2 blocks:
//   r0 n0 [1,2] misses; r1 n1 [1,2] pulls both from node 0 (node 1's
//   probe learned node 0 holds them); r2 n0 [1,2] hits locally;
//   r3 n1 [3,4] evicts 2, 1 from node 1.
// With a remote tier, those victims are not written there: node 1 learned
// at r1 that a peer holds them (the peer tier holds them, as the daemon's
// demotion walk asks it), unless it learned that longer than
// peer_known_us ago. Without the peer tier they are written.
TEST(ReplayPeerTest, AVictimAPeerIsKnownToHoldIsNotWrittenBelow) {
  const Trace t = MakeTrace({Request(0, {1, 2}), Request(1, {1, 2}), Request(2, {1, 2}), Request(3, {3, 4})});
  ReplayOptions o = TwoNodes(Blocks(2), false);
  o.remote = Infinite();
  EXPECT_EQ(Replayed(t, o).tiers[kRemoteTier].bytes_written, 8u) << "1 and 2, node 1's victims";
  o.peer = true;
  const ReplayResult on = Replayed(t, o);
  EXPECT_EQ(on.peer.hits, 2u);
  EXPECT_EQ(on.tiers[kRemoteTier].bytes_written, 0u);
  EXPECT_EQ(on.peer.bytes_written, 0u);
  o.peer_known_us = 1000;  // learned at 1 ms, forgotten by 3 ms
  EXPECT_EQ(Replayed(t, o).tiers[kRemoteTier].bytes_written, 8u);
}

// A pull is a pin on its source: a use there. Host tiers of 4 blocks; node
// 0 takes 1, 2, 3, 4 at 0, 2, 4, 6 ms and node 1 pulls 1 at 3 ms. At 8 ms
// node 0 needs room for 5: LRU evicts 2, the least recently used once the
// pull used 1 (without that use it would be 1). At 10 ms node 0 finds 1
// in its own host tier (had it gone, node 1 would have served it).
TEST(ReplayPeerTest, APullIsAUseOfTheSourcesCopy) {
  const Trace t =
      MakeTrace({Request(0, {1}), Request(1, {9}), Request(2, {2}), Request(3, {1}), Request(4, {3}), Request(5, {8}),
                 Request(6, {4}), Request(7, {7}), Request(8, {5}), Request(9, {6}), Request(10, {1})});
  const ReplayResult on = Replayed(t, TwoNodes(Blocks(4), true));
  EXPECT_EQ(on.peer.hits, 1u) << "r3 only";
  EXPECT_EQ(on.tiers[kHostTier].hits, 1u) << "r10, node 0's own copy";
  EXPECT_EQ(on.nodes[0].local_hit_tokens, 4u);
  EXPECT_EQ(on.nodes[0].peer_bytes_served, 4u);
}

// A block on another node's NVMe tier is pulled from there (read in place:
// not promoted into that node's host tier, which keeps its blocks).
//   r0 n0 [1]; r1 n1 [5]; r2 n0 [2]: node 0 evicts 1 into its NVMe tier;
//   r3 n1 [1]: a peer hit from node 0's NVMe tier; r4 n0 [2]: still in
//   node 0's host tier.
TEST(ReplayPeerTest, APeersNvmeTierServesToo) {
  const Trace t = MakeTrace({Request(0, {1}), Request(1, {5}), Request(2, {2}), Request(3, {1}), Request(4, {2})});
  ReplayOptions o = TwoNodes(Blocks(1), true);
  o.nvme = Infinite();
  const ReplayResult on = Replayed(t, o);
  EXPECT_EQ(on.peer.hits, 1u);
  EXPECT_EQ(on.nodes[0].peer_bytes_served, 4u);
  EXPECT_EQ(on.tiers[kHostTier].hits, 1u) << "r4";
  EXPECT_EQ(on.tiers[kNvmeTier].hits, 0u) << "node 1's own NVMe tier never held 1";
}

// The engine model: one engine per node at 400 tokens/s (a 4-token block:
// 10 ms of prefill), 1000 bytes per token (4000 bytes a block). r1 on node
// 1 finds [1,2] at node 0: 8000 bytes at 4e6 bytes/s (2 ms) after one
// 500 us round trip: 2.5 ms, against 20 ms of prefill without the peer tier.
TEST(ReplayPeerTest, APullCostsTheRoundTripAndThePeerBandwidth) {
  const Trace t = MakeTrace({Request(0, {1, 2}), Request(100, {1, 2})});
  ReplayOptions o = TwoNodes(Infinite(), false);
  o.bytes_per_token = 1000;
  o.engines = 1;
  o.prefill_tps = 400;
  EXPECT_EQ(Replayed(t, o).ttft_ms, (std::vector<double>{20, 20}));
  o.peer = true;
  o.peer_bytes_per_s = 4e6;
  o.peer_rtt_us = 500;
  EXPECT_EQ(Replayed(t, o).ttft_ms, (std::vector<double>{20, 2.5}));
  o.fetch = FetchModel::kOverlap;
  EXPECT_EQ(Replayed(t, o).ttft_ms, (std::vector<double>{20, 2.5}));
}

TEST(ReplayPeerTest, ThePeerTierNeedsTwoNodesAndABandwidth) {
  const Trace t = MakeTrace({Request(0, {1})});
  ReplayOptions o = TwoNodes(Infinite(), true);
  o.nodes = 1;
  auto one = Replay(t, o);
  ASSERT_FALSE(one.ok());
  EXPECT_EQ(one.status().code(), StatusCode::kInvalidArgument);
  o.nodes = 2;
  o.peer_bytes_per_s = 0;
  EXPECT_FALSE(Replay(t, o).ok());
}

}  // namespace
}  // namespace kvtier::tools

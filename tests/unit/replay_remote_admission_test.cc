// kvtier replay's remote admission (ReplayOptions::remote_admission,
// docs/REPLAY.md "Remote admission"): each node writes into the shared
// remote tier through its own admission, kvtierd's remote.admission
// (policy/admission_policy.h): all, second_hit (refuses first sightings),
// rate (second_hit's rules within remote_write_rate bytes/s per node).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tiers/remote/remote_value.h"
#include "tools/replay/replay_sim.h"
#include "tools/replay/replay_trace.h"

namespace kvtier::tools {
namespace {

constexpr uint32_t kBlockTokens = 4;

// A request at `us` over whole 4-token blocks `ids`.
TraceRequest Request(uint64_t us, const std::vector<uint64_t>& ids) {
  TraceRequest r;
  r.arrival_us = us;
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

// Host tiers of one block per node over an unlimited remote tier, LRU,
// one byte per token.
ReplayOptions Options(const std::string& remote_admission, uint32_t nodes = 1) {
  ReplayOptions o;
  o.nodes = nodes;
  o.router = Router::kRoundRobin;
  o.host = Capacity{Capacity::Unit::kBlocks, 1, false};
  o.remote = Capacity{Capacity::Unit::kTokens, 0, true};
  o.bytes_per_token = 1;
  o.remote_admission = remote_admission;
  return o;
}

ReplayResult Replayed(const Trace& trace, const ReplayOptions& o) {
  auto r = Replay(trace, o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : ReplayResult{};
}

// By hand, one node of one block:
//   r0 [1] misses; the host holds 1 (never found: a first sighting).
//   r1 [2] misses; 1 is evicted: all writes it to the remote tier,
//      second_hit refuses it (first sighting).
//   r2 [1]: all hits it in the remote tier; second_hit misses.
// Its eviction of 2 (a first sighting too) is the second refusal.
TEST(ReplayRemoteAdmissionTest, SecondHitRefusesAFirstSightingIntoTheRemoteTier) {
  const Trace t = MakeTrace({Request(0, {1}), Request(1000, {2}), Request(2000, {1})});
  const ReplayResult all = Replayed(t, Options("all"));
  EXPECT_EQ(all.tiers[kRemoteTier].hits, 1u);
  EXPECT_EQ(all.remote_admission_refused, 0u);
  EXPECT_EQ(all.tiers[kRemoteTier].bytes_written, 8u) << "1, then 2 (evicted by 1's promotion)";
  const ReplayResult second_hit = Replayed(t, Options("second_hit"));
  EXPECT_EQ(second_hit.tiers[kRemoteTier].hits, 0u);
  EXPECT_EQ(second_hit.hit_blocks, 0u);
  EXPECT_EQ(second_hit.remote_admission_refused, 2u);
  EXPECT_EQ(second_hit.tiers[kRemoteTier].bytes_written, 0u);
  EXPECT_EQ(second_hit.admission_refused, 0u) << "no NVMe tier: its admission is not asked";
}

// A block found again (r1 hits 1 in the host tier: reused) is admitted by
// second_hit, and then r3 hits it in the remote tier.
TEST(ReplayRemoteAdmissionTest, SecondHitAdmitsAReusedBlock) {
  const Trace t = MakeTrace({Request(0, {1}), Request(1000, {1}), Request(2000, {2}), Request(3000, {1})});
  const ReplayResult r = Replayed(t, Options("second_hit"));
  EXPECT_EQ(r.tiers[kRemoteTier].hits, 1u);
  EXPECT_EQ(r.tiers[kHostTier].hits, 1u);
  EXPECT_EQ(r.tiers[kRemoteTier].bytes_written, 4u) << "1 only: 2, evicted by 1's promotion, was never found";
  EXPECT_EQ(r.remote_admission_refused, 1u);
}

// Two nodes, round robin: the next turn of what node 0 served lands on
// node 1. Node 0 never found block 1 again, so second_hit keeps it out
// of the shared tier and node 1 misses it: the cross-node reuse a shared
// tier is for, lost.
//   r0 n0 [1]; r1 n1 [5]; r2 n0 [2] evicts 1; r3 n1 [1].
TEST(ReplayRemoteAdmissionTest, RefusingFirstSightingsLosesAnotherNodesReuse) {
  const Trace t = MakeTrace({Request(0, {1}), Request(1000, {5}), Request(2000, {2}), Request(3000, {1})});
  EXPECT_EQ(Replayed(t, Options("all", 2)).tiers[kRemoteTier].hits, 1u);
  EXPECT_EQ(Replayed(t, Options("second_hit", 2)).tiers[kRemoteTier].hits, 0u);
  EXPECT_EQ(Replayed(t, Options("rate", 2)).tiers[kRemoteTier].hits, 0u) << "rate has second_hit's rules";
}

// Every block found once (so second_hit's rules admit it) and evicted by
// the next: `blocks` blocks of 4 tokens x 1000 bytes, one request a
// millisecond, demand about 2 MB/s per node; with `nodes` nodes under
// round robin each node gets such a stream of its own blocks.
Trace ReusedStream(uint64_t blocks, uint32_t nodes) {
  // Node k serves requests i with i mod nodes == k; give it two lookups
  // of each of its blocks in a row.
  std::vector<TraceRequest> requests;
  for (uint64_t step = 0; step < 2 * blocks; ++step) {
    for (uint32_t k = 0; k < nodes; ++k) {
      const uint64_t id = (uint64_t{k} << 32) | (step / 2);
      requests.push_back(Request(step * 1000, {id}));
    }
  }
  return MakeTrace(std::move(requests));
}

TEST(ReplayRemoteAdmissionTest, RateCapsTheBytesEachNodeWritesOverTime) {
  const Trace t = ReusedStream(1000, 1);
  ReplayOptions o = Options("rate");
  o.bytes_per_token = 1000;  // 4,000-byte blocks, 4,072 stored
  o.remote_write_rate = 100'000;
  const ReplayResult rate = Replayed(t, o);
  const double span_s = double(t.requests.back().arrival_us - t.requests.front().arrival_us) / 1e6;
  const uint64_t stored_per_block = 4000 + kRemoteHeaderBytes;
  const uint64_t written = rate.tiers[kRemoteTier].bytes_written;
  const uint64_t admitted_blocks = written / 4000;
  // The bucket: one second's worth at the start, then the rate.
  EXPECT_LE(double(admitted_blocks * stored_per_block), double(o.remote_write_rate) * (span_s + 1));
  EXPECT_GE(double(admitted_blocks * stored_per_block), double(o.remote_write_rate) * span_s * 0.9)
      << "demand is twenty times the cap: the cap is used";
  EXPECT_GT(rate.remote_admission_refused, 0u);
  EXPECT_EQ(rate.remote_admission_refused + admitted_blocks, 999u) << "every block but the last is evicted";
  // second_hit alone admits all of them; so does all.
  o.remote_admission = "second_hit";
  EXPECT_EQ(Replayed(t, o).tiers[kRemoteTier].bytes_written, 999u * 4000);
  EXPECT_EQ(Replayed(t, o).remote_admission_refused, 0u);
  // A higher rate writes more.
  o.remote_admission = "rate";
  o.remote_write_rate = 400'000;
  EXPECT_GT(Replayed(t, o).tiers[kRemoteTier].bytes_written, 2 * written);
}

// Each node has its own bucket: two nodes with the same stream each write
// what one node alone writes.
TEST(ReplayRemoteAdmissionTest, EachNodeHasItsOwnWriteRate) {
  ReplayOptions o = Options("rate");
  o.bytes_per_token = 1000;
  o.remote_write_rate = 100'000;
  const uint64_t one = Replayed(ReusedStream(500, 1), o).tiers[kRemoteTier].bytes_written;
  o.nodes = 2;
  const ReplayResult two = Replayed(ReusedStream(500, 2), o);
  EXPECT_EQ(two.tiers[kRemoteTier].bytes_written, 2 * one);
  EXPECT_EQ(two.nodes[0].requests, two.nodes[1].requests);
}

// The default is all, the figures of a run that does not ask.
TEST(ReplayRemoteAdmissionTest, TheDefaultAdmitsEverything) {
  const Trace t = ReusedStream(50, 2);
  ReplayOptions o = Options("all", 2);
  ReplayOptions d = o;
  d.remote_admission = ReplayOptions{}.remote_admission;
  EXPECT_EQ(d.remote_admission, "all");
  const ReplayResult a = Replayed(t, o);
  const ReplayResult b = Replayed(t, d);
  EXPECT_EQ(a.hit_tokens, b.hit_tokens);
  EXPECT_EQ(a.tiers[kRemoteTier].bytes_written, b.tiers[kRemoteTier].bytes_written);
  EXPECT_EQ(b.remote_admission_refused, 0u);
  EXPECT_TRUE(SameSetting(o, d));
  d.remote_admission = "second_hit";
  EXPECT_FALSE(SameSetting(o, d)) << "gap_closed compares runs of one remote admission";
}

TEST(ReplayRemoteAdmissionTest, BadRemoteAdmissionsAreRefused) {
  const Trace t = MakeTrace({Request(0, {1})});
  ReplayOptions o = Options("lru");
  auto unknown = Replay(t, o);
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("remote admission 'lru'"), std::string::npos) << unknown.status().message();
  o = Options("second_hit");
  o.remote.reset();
  auto no_tier = Replay(t, o);
  ASSERT_FALSE(no_tier.ok());
  EXPECT_NE(no_tier.status().message().find("remote"), std::string::npos) << no_tier.status().message();
  o = Options("rate");
  o.remote_write_rate = 0;
  auto zero = Replay(t, o);
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.status().message().find("rate"), std::string::npos) << zero.status().message();
}

}  // namespace
}  // namespace kvtier::tools

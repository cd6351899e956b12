// The kv_aware router's model (tools/replay/replay_router.h): T_first =
// max(Q, R) + C with the design brief's numbers, the queue threshold past
// which an idle node that must fetch beats a cache hit, and what the
// router knows through delayed and lost KV events.
#include "tools/replay/replay_router.h"

#include <gtest/gtest.h>

#include <vector>

namespace kvtier::tools {
namespace {

constexpr double kMs = 1000;  // us

// The brief: a node with the prefix, 80 ms of queue, a 60 ms fetch and
// 10 ms of compute.
TEST(KvAwareModelTest, TheFetchOverlapsTheQueueOrWaitsForTheGpu) {
  EXPECT_DOUBLE_EQ(FirstTokenTime(80 * kMs, 60 * kMs, 10 * kMs, FetchModel::kOverlap), 90 * kMs);
  EXPECT_DOUBLE_EQ(FirstTokenTime(80 * kMs, 60 * kMs, 10 * kMs, FetchModel::kSerial), 150 * kMs);
  // A fetch longer than the queue decides instead.
  EXPECT_DOUBLE_EQ(FirstTokenTime(50 * kMs, 60 * kMs, 10 * kMs, FetchModel::kOverlap), 70 * kMs);
}

TEST(KvAwareModelTest, ReadyTimeReadsTiersSideBySideAfterTheirQueues) {
  const std::array<double, kSimTiers> bw = {20e9, 5e9, 25e9};
  // 3.425 GB over 200 GbE (25 GB/s): 137 ms.
  EXPECT_DOUBLE_EQ(ReadyTime(0, {0, 0, 3'425'000'000}, bw, {}), 137 * kMs);
  // 1 GB from NVMe (200 ms) beside 2 GB from the host (100 ms): the slower.
  EXPECT_DOUBLE_EQ(ReadyTime(0, {2'000'000'000, 1'000'000'000, 0}, bw, {}), 200 * kMs);
  // 30 ms of reads already queued on the NVMe channel come first; a busy
  // tier with nothing to read adds nothing.
  const uint64_t now = 1'000'000;
  EXPECT_DOUBLE_EQ(ReadyTime(now, {0, 1'000'000'000, 0}, bw, {now + 500'000, now + 30'000, 0}), 230 * kMs);
  EXPECT_DOUBLE_EQ(ReadyTime(now, {0, 0, 0}, bw, {now + 500'000, now + 30'000, 0}), 0);
}

// The brief: a cache hit behind a 250 ms queue loses to an idle node that
// fetches over 200 GbE in 137 ms. Chosen here: C = 10 ms on both (the same
// uncached tokens), R = 0 on the hit node. The hit node wins while
// max(Q_hit, R_hit) + C_hit < max(0, R_idle) + C_idle, so the threshold is
// Q* = R_idle + C_idle - C_hit = 137 ms (it is above R_hit, so the max is
// Q_hit's).
TEST(KvAwareModelTest, AnIdleNodeThatFetchesBeatsAHitPastTheQueueThreshold) {
  const std::array<double, kSimTiers> bw = {20e9, 5e9, 25e9};
  const double r_idle = ReadyTime(0, {0, 0, 3'425'000'000}, bw, {});
  const double c_hit = 10 * kMs, c_idle = 10 * kMs, r_hit = 0;
  const double threshold = r_idle + c_idle - c_hit;
  ASSERT_GE(threshold, r_hit);
  EXPECT_DOUBLE_EQ(threshold, 137 * kMs);
  auto choose = [&](double q_hit) {
    const std::vector<NodeEstimate> nodes = {{q_hit, r_hit, c_hit, 100}, {0, r_idle, c_idle, 100}};
    return ChooseNode(nodes, FetchModel::kOverlap);
  };
  EXPECT_EQ(choose(80 * kMs), 0u) << "a short queue: the hit";
  EXPECT_EQ(choose(threshold - 1), 0u);
  EXPECT_EQ(choose(threshold), 0u) << "a tie: the lowest index";
  EXPECT_EQ(choose(threshold + 1), 1u);
  EXPECT_EQ(choose(250 * kMs), 1u) << "the brief's 250 ms queue is past the threshold";
  EXPECT_DOUBLE_EQ(FirstTokenTime(250 * kMs, r_hit, c_hit, FetchModel::kOverlap), 260 * kMs);
  EXPECT_DOUBLE_EQ(FirstTokenTime(0, r_idle, c_idle, FetchModel::kOverlap), 147 * kMs);
}

// The router: 2 nodes of one engine at 1000 tokens/s (1 ms a token); the
// host reads at 1e15 B/s (a 3.4 us copy: all but free), the remote tier at
// 25 GB/s (200 GbE).
KvAwareParams Params(uint64_t delay_us = 0, double loss = 0) {
  KvAwareParams p;
  p.nodes = 2;
  p.engines = 1;
  p.prefill_tps = 1000;
  p.read_bytes_per_s = {1e15, 5e9, 25e9};
  p.event_delay_us = delay_us;
  p.event_loss = loss;
  return p;
}

constexpr uint32_t kPrefix = 1, kFiller = 2;
const std::vector<NodeIo> kIdleIo(2);

// Node 0 holds the prefix (3.425 GB, 100 tokens) in its host tier and the
// remote tier holds it too; node 0 also holds the filler's 1000-token
// prefix. The filler's 1000 + q tokens go to node 0 (q ms there, 1000 + q
// on node 1), so the router has q ms of queue on node 0; then a request of
// the prefix and 10 more tokens (C = 10 ms anywhere) arrives.
uint32_t RouteBehindQueue(double queue_ms) {
  KvAwareRouter router(Params());
  router.Publish({0, 0, kHostTier, kPrefix, true});
  router.Publish({0, 0, kRemoteTier, kPrefix, true});
  router.Publish({0, 0, kHostTier, kFiller, true});
  const uint64_t now = 1000;
  const std::vector<RouteBlock> filler = {{kFiller, 1000, 1}};
  EXPECT_EQ(router.Route(now, filler, 1000 + static_cast<uint64_t>(queue_ms), kIdleIo), 0u);
  const std::vector<RouteBlock> prefix = {{kPrefix, 100, 3'425'000'000}};
  std::vector<NodeEstimate> estimates;
  const uint32_t node = router.Route(now, prefix, 110, kIdleIo, &estimates);
  EXPECT_NEAR(estimates[0].queue_us, queue_ms * kMs, 10);
  EXPECT_DOUBLE_EQ(estimates[1].ready_us, 137 * kMs);
  EXPECT_DOUBLE_EQ(estimates[0].compute_us, 10 * kMs);
  EXPECT_DOUBLE_EQ(estimates[1].compute_us, 10 * kMs);
  return node;
}

TEST(KvAwareRouterTest, PicksTheHitBeforeTheThresholdAndTheIdleNodePastIt) {
  EXPECT_EQ(RouteBehindQueue(80), 0u);
  EXPECT_EQ(RouteBehindQueue(136), 0u);
  EXPECT_EQ(RouteBehindQueue(138), 1u);
  EXPECT_EQ(RouteBehindQueue(250), 1u);
}

// With every event lost the router knows nothing cached: each request goes
// to the node whose engines it expects free first (the lowest index among
// equals), as a least-loaded router would, whatever the nodes hold.
TEST(KvAwareRouterTest, WithEveryEventLostItIsLeastLoaded) {
  const std::vector<RouteBlock> chain = {{kPrefix, 100, 1000}};
  KvAwareRouter knowing(Params(0, 0));
  knowing.Publish({0, 1, kHostTier, kPrefix, true});
  EXPECT_EQ(knowing.Route(0, chain, 100, kIdleIo), 1u) << "it knows node 1 holds the prefix";

  KvAwareRouter blind(Params(0, 1.0));
  blind.Publish({0, 1, kHostTier, kPrefix, true});
  EXPECT_EQ(blind.events_lost(), 1u);
  EXPECT_FALSE(blind.Believes(1, kHostTier, kPrefix));
  EXPECT_EQ(blind.Route(0, chain, 100, kIdleIo), 0u) << "both idle: the lowest index";
  EXPECT_EQ(blind.Route(0, chain, 100, kIdleIo), 1u) << "node 0 is busy for 100 ms";
  EXPECT_EQ(blind.Route(50'000, chain, 100, kIdleIo), 0u) << "both busy until 100 ms: the lowest index";
  EXPECT_EQ(blind.Route(50'000, chain, 50, kIdleIo), 1u) << "node 0 now until 200 ms, node 1 until 100 ms";
}

// An event reaches the router `delay` after the block changed: a store
// that recent is not known yet.
TEST(KvAwareRouterTest, WithDelayItMissesRecentStores) {
  const std::vector<RouteBlock> chain = {{kPrefix, 100, 1000}};
  KvAwareRouter early(Params(10'000));
  early.Publish({0, 1, kHostTier, kPrefix, true});
  EXPECT_EQ(early.Route(9'999, chain, 100, kIdleIo), 0u) << "node 1's store is 10 ms late: not known yet";
  EXPECT_FALSE(early.Believes(1, kHostTier, kPrefix));

  KvAwareRouter later(Params(10'000));
  later.Publish({0, 1, kHostTier, kPrefix, true});
  EXPECT_EQ(later.Route(10'000, chain, 100, kIdleIo), 1u) << "delivered: node 1 holds the prefix";
  EXPECT_TRUE(later.Believes(1, kHostTier, kPrefix));
  // A removal delivered later takes it back; the remote tier is one view.
  later.Publish({20'000, 1, kHostTier, kPrefix, false});
  later.Publish({20'000, 0, kRemoteTier, kPrefix, true});
  later.Route(30'000, chain, 100, kIdleIo);
  EXPECT_FALSE(later.Believes(1, kHostTier, kPrefix));
  EXPECT_TRUE(later.Believes(0, kRemoteTier, kPrefix));
  EXPECT_TRUE(later.Believes(1, kRemoteTier, kPrefix));
}

// Lost events leave the view wrong both ways: a block stored then removed
// is believed present exactly when its store arrived and its removal was
// lost (a quarter of them at a loss of one half).
TEST(KvAwareRouterTest, ALostRemovalLeavesABlockBelievedPresent) {
  KvAwareRouter router(Params(0, 0.5));
  constexpr uint32_t kBlocks = 2000;
  for (uint32_t b = 0; b < kBlocks; ++b) {
    router.Publish({0, 0, kHostTier, b, true});
    router.Publish({1, 0, kHostTier, b, false});
  }
  router.Route(1, std::vector<RouteBlock>{}, 0, kIdleIo);
  uint32_t believed = 0;
  for (uint32_t b = 0; b < kBlocks; ++b) believed += router.Believes(0, kHostTier, b) ? 1 : 0;
  EXPECT_EQ(router.events_published(), 2u * kBlocks);
  EXPECT_NEAR(double(router.events_lost()) / (2.0 * kBlocks), 0.5, 0.05);
  EXPECT_NEAR(double(believed) / kBlocks, 0.25, 0.05) << "seed " << Params().event_seed;

  KvAwareRouter lossless(Params(0, 0));
  lossless.Publish({0, 0, kHostTier, 7, true});
  lossless.Publish({1, 0, kHostTier, 7, false});
  lossless.Route(1, std::vector<RouteBlock>{}, 0, kIdleIo);
  EXPECT_FALSE(lossless.Believes(0, kHostTier, 7));
}

}  // namespace
}  // namespace kvtier::tools

// The kv_aware router (docs/REPLAY.md "KV-aware routing"): a request's first
// token on a node starts at T_first = max(Q, R) + C, where Q is when the
// node's GPU is free for it, R when its prefix's KV is ready on the node and
// C the rest of the work (the prefill of the tokens not cached); the router
// sends each request to the node where T_first is least.
//
// The router knows only what it is told:
// - where blocks are: each node's KV events (a block stored in or removed
//   from one of its tiers; the remote tier's are one shared view), each
//   delivered `event_delay_us` after it happened, or never, with probability
//   `event_loss` (a seeded RNG draws per event). A lost BlockStored leaves a
//   block unknown; a lost BlockRemoved leaves it believed present;
// - Q: the requests it routed itself (it does not see the nodes' engines):
//   per node, `engines` engine slots, each busy until the T_first it
//   estimated for the last request it put there, and the prefill rate;
// - R: what the node's estimate answers: for the longest prefix the
//   router's view holds (a block on the node's host or NVMe tier, or in
//   the shared remote tier, the fastest it knows of), the bytes each tier
//   reads at its read bandwidth, after the reads already queued on that
//   tier's channel at the node (NodeIo); the tiers read side by side.
//
// Pure and deterministic; not thread-safe (one per replay run).
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <queue>
#include <random>
#include <span>
#include <vector>

#include "tools/replay/replay_sim.h"

namespace kvtier::tools {

// T_first relative to the request's arrival, all in the same unit.
// `queue`: Q, how long until the node's GPU is free for the request;
// `ready`: R, how long until its prefix's KV is on the node (the fetch,
// after the I/O queued before it); `compute`: C, the prefill of the rest.
// kOverlap: the fetch runs beside the queue, max(Q, R) + C; kSerial: the
// fetch starts when the GPU is free, Q + R + C.
double FirstTokenTime(double queue, double ready, double compute, FetchModel model);

// R in us after `now_us`: per tier, `bytes[t]` read at `bytes_per_s[t]`
// once the channel is free (`read_free_us[t]`, absolute; in the past:
// free now); tiers read side by side, so the slowest decides. A tier with
// no bytes to read adds nothing, however busy.
double ReadyTime(uint64_t now_us, const std::array<uint64_t, kSimTiers>& bytes,
                 const std::array<double, kSimTiers>& bytes_per_s, const std::array<uint64_t, kSimTiers>& read_free_us);

// One node's estimate of a request: Q, R, C in us after its arrival.
struct NodeEstimate {
  double queue_us = 0;
  double ready_us = 0;
  double compute_us = 0;
  uint64_t hit_tokens = 0;  // the prefix the router believes cached there
};

// The node with the least FirstTokenTime; among equal ones the lowest
// index. `nodes` must not be empty.
uint32_t ChooseNode(std::span<const NodeEstimate> nodes, FetchModel model);

// A block entered (`stored`) or left one of a node's tiers at `at_us`.
struct KvEvent {
  uint64_t at_us = 0;
  uint32_t node = 0;  // ignored for the remote tier: one view for all nodes
  uint8_t tier = kHostTier;
  uint32_t block = 0;  // the simulator's block id
  bool stored = true;
};

// A request's block as the router weighs it.
struct RouteBlock {
  uint32_t block = 0;
  uint64_t tokens = 0;
  uint64_t bytes = 0;
};

// A node's read channels: when each tier's is free (absolute us).
struct NodeIo {
  std::array<uint64_t, kSimTiers> read_free_us{};
};

struct KvAwareParams {
  uint32_t nodes = 1;
  uint32_t engines = 1;  // per node, at least 1
  double prefill_tps = 1;
  std::array<double, kSimTiers> read_bytes_per_s = {20e9, 5e9, 1e9};
  FetchModel model = FetchModel::kOverlap;
  uint64_t event_delay_us = 0;
  double event_loss = 0;  // [0, 1]
  uint64_t event_seed = 1;
};

class KvAwareRouter {
 public:
  explicit KvAwareRouter(const KvAwareParams& params);

  // A node's tier changed (events in the order they happened). It reaches
  // the router's view at at_us + event_delay_us, or never (event_loss).
  void Publish(const KvEvent& event);

  // Routes a request arriving at `now_us` (never earlier than the last
  // call's) with prompt `chain` and `input_tokens` tokens: delivers the
  // events due by now, estimates each node, and returns the node chosen;
  // that node's engine slot freeing first is then busy until the chosen
  // T_first. `io` has one entry per node. `estimates`, when not null, gets
  // every node's estimate.
  uint32_t Route(uint64_t now_us, std::span<const RouteBlock> chain, uint64_t input_tokens, std::span<const NodeIo> io,
                 std::vector<NodeEstimate>* estimates = nullptr);

  // Whether the router's view (events delivered by the last Route) holds
  // `block` in `tier` of `node` (the remote tier: any node).
  bool Believes(uint32_t node, int tier, uint32_t block) const;

  uint64_t events_published() const { return published_; }
  uint64_t events_lost() const { return lost_; }

 private:
  void Deliver(uint64_t now_us);
  NodeEstimate Estimate(uint32_t node, uint64_t now_us, std::span<const RouteBlock> chain, uint64_t input_tokens,
                        const NodeIo& io) const;
  uint8_t Bits(size_t view, uint32_t block) const { return block < views_[view].size() ? views_[view][block] : 0; }

  KvAwareParams params_;
  std::deque<KvEvent> in_flight_;  // published, not yet due, in publish order
  // Per node, then one for the remote tier: per block, a bit per tier.
  std::vector<std::vector<uint8_t>> views_;
  // Per node, when each engine slot is free, as the router estimated it.
  std::vector<std::priority_queue<double, std::vector<double>, std::greater<>>> engine_free_us_;
  std::mt19937_64 rng_;
  std::bernoulli_distribution lose_;
  uint64_t published_ = 0;
  uint64_t lost_ = 0;
};

}  // namespace kvtier::tools

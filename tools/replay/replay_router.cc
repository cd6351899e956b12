// The kv_aware router (replay_router.h): T_first per node from what the
// router knows, and the node where it is least.
#include "tools/replay/replay_router.h"

#include <algorithm>
#include <cmath>

#include "common/check.h"

namespace kvtier::tools {

double FirstTokenTime(double queue, double ready, double compute, FetchModel model) {
  return model == FetchModel::kOverlap ? std::max(queue, ready) + compute : queue + ready + compute;
}

double ReadyTime(uint64_t now_us, const std::array<uint64_t, kSimTiers>& bytes,
                 const std::array<double, kSimTiers>& bytes_per_s,
                 const std::array<uint64_t, kSimTiers>& read_free_us) {
  double ready = 0;
  for (int t = 0; t < kSimTiers; ++t) {
    if (bytes[t] == 0) continue;
    const double queued = read_free_us[t] > now_us ? double(read_free_us[t] - now_us) : 0;
    ready = std::max(ready, queued + double(bytes[t]) / bytes_per_s[t] * 1e6);
  }
  return ready;
}

uint32_t ChooseNode(std::span<const NodeEstimate> nodes, FetchModel model) {
  KVTIER_CHECK(!nodes.empty(), "a request is routed among at least one node");
  uint32_t best = 0;
  double best_time = 0;
  for (uint32_t k = 0; k < nodes.size(); ++k) {
    const NodeEstimate& e = nodes[k];
    const double t = FirstTokenTime(e.queue_us, e.ready_us, e.compute_us, model);
    if (k == 0 || t < best_time) {
      best = k;
      best_time = t;
    }
  }
  return best;
}

KvAwareRouter::KvAwareRouter(const KvAwareParams& params)
    : params_(params),
      views_(params.nodes + 1),
      engine_free_us_(params.nodes),
      rng_(params.event_seed),
      lose_(std::clamp(params.event_loss, 0.0, 1.0)) {
  KVTIER_CHECK(params.nodes >= 1 && params.engines >= 1 && params.prefill_tps > 0, "kv_aware needs the engine model");
  for (auto& slots : engine_free_us_) {
    for (uint32_t e = 0; e < params.engines; ++e) slots.push(0);
  }
}

void KvAwareRouter::Publish(const KvEvent& event) {
  ++published_;
  // Draw only when events can be lost, so a lossless run draws nothing.
  if (params_.event_loss > 0 && lose_(rng_)) {
    ++lost_;
    return;
  }
  in_flight_.push_back(event);
}

void KvAwareRouter::Deliver(uint64_t now_us) {
  while (!in_flight_.empty() && in_flight_.front().at_us + params_.event_delay_us <= now_us) {
    const KvEvent& e = in_flight_.front();
    std::vector<uint8_t>& view = views_[e.tier == kRemoteTier ? params_.nodes : e.node];
    if (view.size() <= e.block) view.resize(size_t{e.block} + 1, 0);
    const auto bit = static_cast<uint8_t>(1u << e.tier);
    view[e.block] = e.stored ? (view[e.block] | bit) : (view[e.block] & ~bit);
    in_flight_.pop_front();
  }
}

bool KvAwareRouter::Believes(uint32_t node, int tier, uint32_t block) const {
  return (Bits(tier == kRemoteTier ? params_.nodes : node, block) & (1u << tier)) != 0;
}

NodeEstimate KvAwareRouter::Estimate(uint32_t node, uint64_t now_us, std::span<const RouteBlock> chain,
                                     uint64_t input_tokens, const NodeIo& io) const {
  NodeEstimate e;
  std::array<uint64_t, kSimTiers> bytes{};
  for (const RouteBlock& b : chain) {
    const uint8_t bits =
        static_cast<uint8_t>(Bits(node, b.block) | (Bits(params_.nodes, b.block) & (1u << kRemoteTier)));
    if (bits == 0) break;  // the first block believed absent ends the prefix
    const int tier = (bits & (1u << kHostTier)) ? kHostTier : (bits & (1u << kNvmeTier)) ? kNvmeTier : kRemoteTier;
    bytes[tier] += b.bytes;
    e.hit_tokens += b.tokens;
  }
  const double free_us = engine_free_us_[node].top();
  e.queue_us = free_us > double(now_us) ? free_us - double(now_us) : 0;
  e.ready_us = ReadyTime(now_us, bytes, params_.read_bytes_per_s, io.read_free_us);
  const uint64_t missed = input_tokens > e.hit_tokens ? input_tokens - e.hit_tokens : 0;
  e.compute_us = double(missed) / params_.prefill_tps * 1e6;
  return e;
}

uint32_t KvAwareRouter::Route(uint64_t now_us, std::span<const RouteBlock> chain, uint64_t input_tokens,
                              std::span<const NodeIo> io, std::vector<NodeEstimate>* estimates) {
  KVTIER_CHECK(io.size() == params_.nodes, "one NodeIo per node");
  Deliver(now_us);
  std::vector<NodeEstimate> local;
  std::vector<NodeEstimate>& all = estimates != nullptr ? *estimates : local;
  all.clear();
  for (uint32_t k = 0; k < params_.nodes; ++k) all.push_back(Estimate(k, now_us, chain, input_tokens, io[k]));
  const uint32_t node = ChooseNode(all, params_.model);
  const NodeEstimate& e = all[node];
  auto& slots = engine_free_us_[node];
  slots.pop();
  slots.push(double(now_us) + FirstTokenTime(e.queue_us, e.ready_us, e.compute_us, params_.model));
  return node;
}

}  // namespace kvtier::tools

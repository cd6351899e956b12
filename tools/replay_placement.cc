// Where the replay's blocks go (replay_simulator.h): host eviction, demotion
// through the tiers' admission (daemon/engine_eviction.cc's rules),
// promotion, the NVMe log's hooks, and prefetch (Engine::Prefetch's plan).
#include <algorithm>
#include <array>
#include <cmath>

#include "policy/demotion_target.h"
#include "policy/prefetch_planner.h"
#include "tools/replay_simulator.h"

namespace kvtier::tools {

uint64_t Simulator::Cost(int tier, const SimBlock& b) const {
  return tiers_[tier].capacity->unit == Capacity::Unit::kBlocks ? 1 : b.tokens;
}

// Evicts from policy-run `tier` until `cost` more fits, offering each
// victim to the tiers below; false if it cannot (too large, or the rest is
// pinned).
bool Simulator::MakeRoom(int tier, uint64_t cost, uint64_t now) {
  SimTierState& t = tiers_[tier];
  if (t.capacity->infinite) return true;
  if (cost > t.capacity->amount) return false;
  while (t.used + cost > t.capacity->amount) {
    auto victim = t.policy->Victim();
    if (!victim) return false;
    const auto id = static_cast<uint32_t>(victim->handle);
    SimBlock& v = blocks_[id];
    // Asked before the victim leaves, as EvictOne does.
    const bool needed = tier == kHostTier && t.policy->NeededWithin(id, now, options_.lookahead_us);
    t.policy->OnRemove(id);
    v.in[tier] = false;
    t.used -= v.held[tier];
    v.held[tier] = 0;
    ++result_.tiers[tier].evictions;
    if (tier == kHostTier) EndPrefetched(v);
    Demote(tier, id, now, needed);
  }
  return true;
}

// The daemon's classes (policy/admission_policy.h's ClassifyBlock, as
// daemon/tier_admission.h runs it), from the times the block was found
// again and its conversation.
AdmissionClass Simulator::ClassOf(const SimBlock& b) const {
  const ConversationState conversation = b.session == 0                ? ConversationState::kUnknown
                                         : closed_.count(b.session) > 0 ? ConversationState::kClosed
                                                                        : ConversationState::kOpen;
  return ClassifyBlock(b.uses, conversation);
}

bool Simulator::NvmeAdmits(const SimBlock& b, bool forced, uint64_t now) {
  // TierAdmission: the device's bytes written and what copies forward
  // wrote are reported first; the candidate costs its record bytes.
  admission_->CatchUp(log_ ? log_->device_bytes_written() : result_.tiers[kNvmeTier].bytes_written,
                      log_ ? log_->reinserted_bytes() : 0, now);
  const uint64_t bytes = log_ ? log_->RecordBytesOf(Bytes(b)) : Bytes(b);
  if (forced) return admission_->Force(bytes, now);
  AdmissionCandidate c;
  c.bytes = bytes;
  c.cls = ClassOf(b);
  c.parent_cached = b.parent == kNoParent || blocks_[b.parent].anywhere();
  if (admission_->Decide(c, now) == AdmissionOutcome::kAdmitted) return true;
  ++result_.admission_refused;
  return false;
}

void Simulator::Demote(int from, uint32_t id, uint64_t now, bool needed) {
  // The daemon's rule (policy/demotion_target.h) over the tiers below
  // `from`; the remote tier admits everything.
  std::array<int, kSimTiers> below{};
  size_t levels = 0;
  for (int t = from + 1; t < kSimTiers; ++t) {
    if (Present(t)) below[levels++] = t;
  }
  SimBlock& b = blocks_[id];
  const DemotionTarget choice = ChooseDemotionTarget(
      levels, needed, [&](size_t level) { return b.in[below[level]]; },
      [&](size_t level) { return below[level] != kNvmeTier || NvmeAdmits(b, /*forced=*/true, now); },
      [&](size_t level) { return below[level] != kNvmeTier || NvmeAdmits(b, /*forced=*/false, now); });
  if (choice.forced) ++result_.forced_demotions;
  if (choice.level) WriteBelow(below[*choice.level], id, now);
}

bool Simulator::WriteBelow(int to, uint32_t id, uint64_t now) {
  SimBlock& b = blocks_[id];
  // The tier's write channel: a demotion waits behind earlier ones, and
  // one that would wait too long is dropped.
  const double rate = options_.write_bytes_per_s[to];
  if (rate > 0) {
    uint64_t& busy = write_busy_until_[to];
    const uint64_t start = std::max(now, busy);
    if (start - now > options_.max_write_backlog_us) {
      ++result_.tiers[to].dropped_busy;
      return false;
    }
    busy = start + static_cast<uint64_t>(std::ceil(double(Bytes(b)) / rate * 1e6));
  }
  if (to == kNvmeTier && log_) {
    if (!log_->Write(id, b.key, Bytes(b), now)) return false;
  } else {
    const uint64_t cost = Cost(to, b);
    if (!MakeRoom(to, cost, now)) return false;
    tiers_[to].policy->OnInsertKeyed(id, b.key, now);
    b.held[to] = cost;
    tiers_[to].used += cost;
  }
  b.in[to] = true;
  result_.tiers[to].bytes_written += Bytes(b);
  return true;
}

bool Simulator::Promote(uint32_t id, uint64_t now) {
  SimBlock& b = blocks_[id];
  if (!b.in[kNvmeTier] && !b.in[kRemoteTier]) return false;
  // Room first (Engine::Promote allocates, then reads): making it may
  // push the block out below, and then the read misses.
  const uint64_t cost = Cost(kHostTier, b);
  if (!MakeRoom(kHostTier, cost, now)) return false;
  const int from = b.in[kNvmeTier] ? kNvmeTier : b.in[kRemoteTier] ? kRemoteTier : -1;
  if (from < 0) return false;
  if (from == kNvmeTier && log_) {
    log_->Read(id, now);
  } else {
    tiers_[from].policy->OnAccess(id, now);
  }
  tiers_[kHostTier].policy->OnInsertKeyed(id, b.key, now);
  b.in[kHostTier] = true;
  b.held[kHostTier] = cost;
  tiers_[kHostTier].used += cost;
  result_.tiers[kHostTier].bytes_written += Bytes(b);
  return true;
}

void Simulator::EndPrefetched(SimBlock& b) {
  if (!b.prefetched) return;
  b.prefetched = false;
  still_prefetched_ -= Bytes(b);
}

void Simulator::Prefetch(uint64_t now) {
  if (options_.prefetch_share <= 0 || options_.bytes_per_token == 0 || options_.host.infinite) return;
  if (!Present(kNvmeTier) && !Present(kRemoteTier)) return;
  // The planner's channels: one per tier below, highest first.
  std::vector<BandwidthEstimate> below;
  std::array<int, kSimTiers> level_of{};
  for (int t = kNvmeTier; t < kSimTiers; ++t) {
    if (!Present(t)) continue;
    level_of[t] = static_cast<int>(below.size());
    below.emplace_back(options_.read_bytes_per_s[t]);
  }
  // The earliest queued requests, and where each chain block is now.
  std::vector<std::pair<uint64_t, size_t>> earliest;
  earliest.reserve(expected_start_.size());
  for (const auto& [r, at] : expected_start_) earliest.emplace_back(at, r);
  const size_t n = std::min(earliest.size(), kPrefetchPlanRequests);
  std::partial_sort(earliest.begin(), earliest.begin() + static_cast<ptrdiff_t>(n), earliest.end());
  std::vector<PrefetchRequest> requests;
  for (size_t k = 0; k < n; ++k) {
    PrefetchRequest q{earliest[k].second, earliest[k].first, {}};
    for (uint32_t id : queued_.at(earliest[k].second)) {
      const SimBlock& b = blocks_[id];
      PrefetchBlock p{b.key, Bytes(b), BlockPlace::kNowhere};
      if (b.in[kHostTier]) {
        p.place = BlockPlace::kHost;
      } else if (b.in[kNvmeTier] || b.in[kRemoteTier]) {
        p.place = BlockPlace::kBelow;
        p.level = static_cast<uint32_t>(level_of[b.in[kNvmeTier] ? kNvmeTier : kRemoteTier]);
      }
      q.chain.push_back(p);
      if (p.place == BlockPlace::kNowhere) break;
    }
    requests.push_back(std::move(q));
  }
  // The budget: a share of the host tier, less what earlier plans read in
  // that nobody used yet.
  const Capacity& host = options_.host;
  const double host_bytes = host.unit == Capacity::Unit::kTokens
                                ? double(host.amount) * double(options_.bytes_per_token)
                                : double(host.amount) * double(trace_.block_tokens) * double(options_.bytes_per_token);
  const PrefetchOptions plan_options{
      PrefetchBudget(options_.prefetch_share, static_cast<uint64_t>(host_bytes), still_prefetched_),
      options_.prefetch_min_blocks};
  const PrefetchPlan plan = PlanPrefetch(now, requests, below, plan_options);
  for (const PrefetchAction& a : plan.actions) {
    const uint32_t id = index_.at(a.key);
    SimBlock& b = blocks_[id];
    if (b.in[kHostTier]) continue;  // cached meanwhile
    if (!Promote(id, now)) continue;
    b.prefetched = true;
    b.arrives_us = a.done_us;
    still_prefetched_ += Bytes(b);
    ++result_.prefetches;
    result_.prefetch_bytes += Bytes(b);
  }
}

SimLog::Hooks Simulator::LogHooks() {
  SimLog::Hooks hooks;
  hooks.dropped = [this](uint32_t id) {
    blocks_[id].in[kNvmeTier] = false;
    ++result_.tiers[kNvmeTier].evictions;
  };
  hooks.offered = [this](uint32_t id) { Demote(kNvmeTier, id, now_us_, false); };
  hooks.needed = [this](uint32_t id) { return queued_count_.count(id) > 0; };
  hooks.has_below = Present(kRemoteTier);
  return hooks;
}

}  // namespace kvtier::tools

// Where the replay's blocks go (replay_simulator.h): host eviction, demotion
// through the tiers' admission (daemon/engine/evictor.cc's rules),
// promotion, the NVMe log's hooks, and prefetch (Engine::Prefetch's plan).
// Each runs for one node: its own host and NVMe tiers, the shared remote
// tier.
#include <algorithm>
#include <array>
#include <cmath>

#include "policy/demotion_target.h"
#include "policy/prefetch_planner.h"
#include "tiers/remote/remote_value.h"
#include "tools/replay/replay_simulator.h"

namespace kvtier::tools {

uint64_t Simulator::Cost(const SimTierState& t, const SimBlock& b) const {
  return t.capacity->unit == Capacity::Unit::kBlocks ? 1 : b.tokens;
}

// Evicts from policy-run `tier` (as `n` sees it) until `cost` more fits,
// offering each victim to the tiers below; false if it cannot (too large,
// or the rest is pinned).
bool Simulator::MakeRoom(SimNode& n, int tier, uint64_t cost, uint64_t now) {
  SimTierState& t = Tier(n, tier);
  if (t.capacity->infinite) return true;
  if (cost > t.capacity->amount) return false;
  while (t.used + cost > t.capacity->amount) {
    auto victim = t.policy->Victim();
    if (!victim) return false;
    const auto id = static_cast<uint32_t>(victim->handle);
    // Asked before the victim leaves, as Evictor::EvictOne does.
    const bool needed = tier == kHostTier && t.policy->NeededWithin(id, now, options_.lookahead_us);
    t.policy->OnRemove(id);
    t.in[id] = 0;
    Emit(n, tier, id, false, now);
    t.used -= t.held[id];
    t.held[id] = 0;
    ++result_.tiers[tier].evictions;
    if (tier == kHostTier) EndPrefetched(n, id);
    Demote(n, tier, id, now, needed);
  }
  return true;
}

// The daemon's classes (policy/admission_policy.h's ClassifyBlock, as
// daemon/engine/tier_admission.h runs it), from what `n` knows: the times it
// found the block again, and whether it closed the block's conversation.
AdmissionClass Simulator::ClassOf(const SimNode& n, uint32_t id, uint64_t uses) const {
  const uint64_t session = blocks_[id].session;
  const ConversationState conversation = session == 0                  ? ConversationState::kUnknown
                                         : n.closed.count(session) > 0 ? ConversationState::kClosed
                                                                       : ConversationState::kOpen;
  return ClassifyBlock(uses, conversation);
}

bool Simulator::NvmeAdmits(SimNode& n, uint32_t id, bool forced, uint64_t now, uint64_t uses) {
  // TierAdmission: the device's bytes written and what copies forward
  // wrote are reported first; the candidate costs its record bytes.
  const SimBlock& b = blocks_[id];
  n.admission->CatchUp(n.log ? n.log->device_bytes_written() : n.nvme_bytes_written,
                       n.log ? n.log->reinserted_bytes() : 0, now);
  const uint64_t bytes = n.log ? n.log->RecordBytesOf(Bytes(b)) : Bytes(b);
  if (forced) return n.admission->Force(bytes, now);
  AdmissionCandidate c;
  c.bytes = bytes;
  c.cls = ClassOf(n, id, uses);
  c.parent_cached = b.parent == kNoParent || HeldAnywhere(n, b.parent, now);
  if (n.admission->Decide(c, now) == AdmissionOutcome::kAdmitted) return true;
  ++result_.admission_refused;
  return false;
}

bool Simulator::RemoteAdmits(SimNode& n, uint32_t id, bool forced, uint64_t now, uint64_t uses) {
  // TierAdmission over the remote tier: StoredBytes is the payload and the
  // value's header. The rate policy keeps no device total, so there is
  // nothing to catch up. The class is by the uses Demote was given: the
  // NVMe log's reads since written for a block it hands down, as the
  // daemon's eviction sink weighs them.
  const SimBlock& b = blocks_[id];
  const uint64_t bytes = Bytes(b) + kRemoteHeaderBytes;
  if (forced) return n.remote_admission->Force(bytes, now);
  AdmissionCandidate c;
  c.bytes = bytes;
  c.cls = ClassOf(n, id, uses);
  c.parent_cached = b.parent == kNoParent || HeldAnywhere(n, b.parent, now);
  if (n.remote_admission->Decide(c, now) == AdmissionOutcome::kAdmitted) return true;
  ++result_.remote_admission_refused;
  return false;
}

void Simulator::Demote(SimNode& n, int from, uint32_t id, uint64_t now, bool needed, std::optional<uint64_t> uses) {
  const uint64_t counted = uses ? *uses : n.blocks[id].uses;
  // The daemon's rule (policy/demotion_target.h) over the tiers below
  // `from`, each through its admission. The peer tier (between the NVMe
  // and remote tiers) holds what `n` learned a peer holds, and admits
  // nothing, forced or not (admission "none").
  std::array<int, kSimTiers + 1> below{};
  size_t levels = 0;
  for (int t = from + 1; t < kSimTiers; ++t) {
    if (t == kRemoteTier && options_.peer) below[levels++] = kPeerLevel;
    if (Present(n, t)) below[levels++] = t;
  }
  const auto admits = [&](size_t level, bool forced) {
    return below[level] != kPeerLevel && Admits(n, below[level], id, forced, now, counted);
  };
  const DemotionTarget choice = ChooseDemotionTarget(
      levels, needed,
      [&](size_t level) {
        return below[level] == kPeerLevel ? PeerKnown(n, id, now) : Tier(n, below[level]).in[id] != 0;
      },
      [&](size_t level) { return admits(level, /*forced=*/true); },
      [&](size_t level) { return admits(level, /*forced=*/false); });
  if (choice.forced) ++result_.forced_demotions;
  if (choice.level) WriteBelow(n, below[*choice.level], id, now);
}

bool Simulator::WriteBelow(SimNode& n, int to, uint32_t id, uint64_t now) {
  const SimBlock& b = blocks_[id];
  // The node's write channel into the tier: a demotion waits behind
  // earlier ones, held as the daemon's demoter holds it, and one that would
  // wait too long, or would not fit the demotion buffer, is dropped.
  const double rate = options_.write_bytes_per_s[to];
  if (rate > 0) {
    uint64_t& busy = n.write_busy_until[to];
    const uint64_t start = std::max(now, busy);
    const uint64_t wait_us = start - now;
    const double queued_bytes = double(wait_us) * rate / 1e6 + double(Bytes(b));
    if (wait_us > 0 &&
        (wait_us > options_.max_write_backlog_us || queued_bytes > double(options_.demotion_buffer_bytes))) {
      ++result_.tiers[to].dropped_busy;
      return false;
    }
    busy = start + static_cast<uint64_t>(std::ceil(double(Bytes(b)) / rate * 1e6));
  }
  SimTierState& t = Tier(n, to);
  if (to == kNvmeTier && n.log) {
    if (!n.log->Write(id, b.key, Bytes(b), now)) return false;
  } else {
    const uint64_t cost = Cost(t, b);
    if (!MakeRoom(n, to, cost, now)) return false;
    t.policy->OnInsertKeyed(id, b.key, now);
    t.held[id] = cost;
    t.used += cost;
  }
  t.in[id] = 1;
  Emit(n, to, id, true, now);
  result_.tiers[to].bytes_written += Bytes(b);
  if (to == kNvmeTier) n.nvme_bytes_written += Bytes(b);
  return true;
}

bool Simulator::Promote(SimNode& n, uint32_t id, uint64_t now, bool from_peers) {
  const auto peer = [&] { return from_peers ? PeerSource(n, id) : nullptr; };
  if (!n.nvme.in[id] && !remote_.in[id] && peer() == nullptr) return false;
  // Room first (Promoter::Promote allocates, then reads): making it may
  // push the block out below, and then the read misses.
  const SimBlock& b = blocks_[id];
  const uint64_t cost = Cost(n.host, b);
  if (!MakeRoom(n, kHostTier, cost, now)) return false;
  SimNode* source = n.nvme.in[id] ? nullptr : peer();
  const int from = n.nvme.in[id] ? kNvmeTier : source != nullptr ? kPeerLevel : remote_.in[id] ? kRemoteTier : -1;
  if (from < 0) return false;
  if (from == kPeerLevel) {
    ServePull(*source, id, now);
    result_.peer_pulled_bytes += Bytes(b);
  } else if (from == kNvmeTier && n.log) {
    n.log->Read(id, now);
  } else {
    Tier(n, from).policy->OnAccess(id, now);
  }
  n.host.policy->OnInsertKeyed(id, b.key, now);
  n.host.in[id] = 1;
  Emit(n, kHostTier, id, true, now);
  n.host.held[id] = cost;
  n.host.used += cost;
  result_.tiers[kHostTier].bytes_written += Bytes(b);
  return true;
}

void Simulator::EndPrefetched(SimNode& n, uint32_t id) {
  NodeBlock& nb = n.blocks[id];
  if (!nb.prefetched) return;
  nb.prefetched = false;
  n.still_prefetched -= Bytes(blocks_[id]);
}

bool Simulator::Prefetch(SimNode& n, uint64_t now) {
  if (options_.prefetch_share <= 0 || options_.bytes_per_token == 0 || options_.host.infinite) return false;
  if (!Present(n, kNvmeTier) && !Present(n, kRemoteTier)) return false;
  if (n.expected_start.empty()) return false;  // nothing queued: an empty plan
  // The planner's channels: one per tier below, highest first.
  std::vector<BandwidthEstimate> below;
  std::array<int, kSimTiers> level_of{};
  for (int t = kNvmeTier; t < kSimTiers; ++t) {
    if (!Present(n, t)) continue;
    level_of[t] = static_cast<int>(below.size());
    below.emplace_back(options_.read_bytes_per_s[t]);
  }
  // n's earliest queued requests, and where each chain block is now.
  std::vector<std::pair<uint64_t, size_t>> earliest;
  earliest.reserve(n.expected_start.size());
  for (const auto& [r, at] : n.expected_start) earliest.emplace_back(at, r);
  const size_t count = std::min(earliest.size(), kPrefetchPlanRequests);
  std::partial_sort(earliest.begin(), earliest.begin() + static_cast<ptrdiff_t>(count), earliest.end());
  std::vector<PrefetchRequest> requests;
  for (size_t k = 0; k < count; ++k) {
    PrefetchRequest q{earliest[k].second, earliest[k].first, {}};
    for (uint32_t id : n.queued.at(earliest[k].second)) {
      const SimBlock& b = blocks_[id];
      PrefetchBlock p{b.key, Bytes(b), BlockPlace::kNowhere};
      if (n.host.in[id]) {
        p.place = BlockPlace::kHost;
      } else if (n.nvme.in[id] || remote_.in[id]) {
        p.place = BlockPlace::kBelow;
        p.level = static_cast<uint32_t>(level_of[n.nvme.in[id] ? kNvmeTier : kRemoteTier]);
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
      PrefetchBudget(options_.prefetch_share, static_cast<uint64_t>(host_bytes), n.still_prefetched),
      options_.prefetch_min_blocks};
  const PrefetchPlan plan = PlanPrefetch(now, requests, below, plan_options);
  // As the daemon's start_read: a block still held only below is claimed
  // and its read counted as it starts; the room made for it may push it
  // out below, and then the read misses (Promote). The engine plans again
  // when the last read lands.
  bool landed = false;
  for (const PrefetchAction& a : plan.actions) {
    const uint32_t id = index_.at(a.key);
    if (n.host.in[id]) continue;                      // cached meanwhile
    if (!n.nvme.in[id] && !remote_.in[id]) continue;  // evicted meanwhile
    ++result_.prefetches;
    result_.prefetch_bytes += Bytes(blocks_[id]);
    landed = Promote(n, id, now, /*from_peers=*/false);
    if (!landed) continue;
    NodeBlock& nb = n.blocks[id];
    nb.prefetched = true;
    nb.arrives_us = a.done_us;
    n.still_prefetched += Bytes(blocks_[id]);
  }
  return landed;
}

SimLog::Hooks Simulator::LogHooks(SimNode& n) {
  SimLog::Hooks hooks;
  SimNode* node = &n;  // nodes_ is never resized
  hooks.dropped = [this, node](uint32_t id) {
    node->nvme.in[id] = 0;
    Emit(*node, kNvmeTier, id, false, now_us_);
    ++result_.tiers[kNvmeTier].evictions;
  };
  hooks.offered = [this, node](uint32_t id, uint64_t hits) { Demote(*node, kNvmeTier, id, now_us_, false, hits); };
  hooks.needed = [node](uint32_t id) { return node->queued_count.count(id) > 0; };
  hooks.has_below = options_.remote.has_value() || options_.peer;  // the daemon's sink: any tier below
  return hooks;
}

}  // namespace kvtier::tools

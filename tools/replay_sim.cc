#include "tools/replay_sim.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "policy/admission_policy.h"
#include "policy/eviction_policy.h"
#include "tools/replay_belady.h"

namespace kvtier::tools {

Result<Capacity> ParseCapacity(const std::string& text, uint64_t bytes_per_token) {
  Capacity c;
  if (text == "inf") {
    c.infinite = true;
    return c;
  }
  size_t used = 0;
  double number = 0;
  try {
    number = std::stod(text, &used);
  } catch (...) {
    used = 0;
  }
  const std::string unit = text.substr(used);
  if (used == 0 || !std::isfinite(number) || number < 0) {
    return InvalidArgument("capacity '" + text + "': expected a number and a unit (1e6tok, 50000blk, 64GiB, inf)");
  }
  double scale = 1;
  if (unit == "tok") {
    c.unit = Capacity::Unit::kTokens;
  } else if (unit == "blk") {
    c.unit = Capacity::Unit::kBlocks;
  } else {
    const std::pair<const char*, double> bytes[] = {{"B", 1},          {"KiB", 1024.0},       {"MiB", 1048576.0},
                                                    {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}, {"KB", 1e3},
                                                    {"MB", 1e6},       {"GB", 1e9},           {"TB", 1e12}};
    bool found = false;
    for (const auto& [name, factor] : bytes) {
      if (unit == name) {
        found = true;
        scale = factor;
      }
    }
    if (!found) return InvalidArgument("capacity '" + text + "': unknown unit '" + unit + "' (tok, blk, B..TiB, inf)");
    if (bytes_per_token == 0) {
      return InvalidArgument("capacity '" + text + "' is in bytes: give --bytes-per-token to convert it to tokens");
    }
    c.unit = Capacity::Unit::kTokens;
    scale /= double(bytes_per_token);
  }
  const double amount = std::floor(number * scale);
  if (amount > 1.8e19) return InvalidArgument("capacity '" + text + "' is too large");
  c.amount = static_cast<uint64_t>(amount);
  return c;
}

std::string CapacityText(const Capacity& c) {
  if (c.infinite) return "inf";
  return std::to_string(c.amount) + (c.unit == Capacity::Unit::kTokens ? "tok" : "blk");
}

double Percentile(std::vector<double> samples, double p) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  const auto rank = static_cast<size_t>(std::ceil(p / 100.0 * double(samples.size())));
  return samples[std::min(samples.size(), std::max<size_t>(rank, 1)) - 1];
}

std::optional<double> ReplayResult::ttft_percentile(double p) const {
  if (ttft_ms.empty()) return std::nullopt;
  return Percentile(ttft_ms, p);
}

std::string_view SimTierName(int tier) {
  switch (tier) {
    case kHostTier:
      return "host";
    case kNvmeTier:
      return "nvme";
    case kRemoteTier:
      return "remote";
  }
  return "?";
}

namespace {

constexpr uint32_t kNoParent = UINT32_MAX;

struct SimBlock {
  BlockKey key;
  uint64_t tokens = 0;                  // from the latest request naming it
  std::array<bool, kSimTiers> in{};     // resident in each tier
  std::array<uint64_t, kSimTiers> held{};  // what it takes of each tier's capacity
  uint64_t pinned_by = 0;               // the request (1-based) pinning it in the host tier, 0: none
  uint64_t uses = 0;                    // requests that found it resident
  uint32_t parent = kNoParent;          // the block before it in the latest chain
  uint64_t session = 0;                 // the conversation of the latest request naming it
  bool anywhere() const { return in[0] || in[1] || in[2]; }
};

struct SimTierState {
  const Capacity* capacity = nullptr;  // null: the tier is absent
  std::unique_ptr<EvictionPolicy> policy;
  uint64_t used = 0;
};

class Simulator {
 public:
  Simulator(const Trace& trace, const ReplayOptions& options, std::unique_ptr<AdmissionPolicy> admission)
      : trace_(trace), options_(options), admission_(std::move(admission)) {
    const Capacity* caps[kSimTiers] = {&options_.host, options_.nvme ? &*options_.nvme : nullptr,
                                       options_.remote ? &*options_.remote : nullptr};
    for (int t = 0; t < kSimTiers; ++t) {
      tiers_[t].capacity = caps[t];
      if (caps[t] == nullptr) continue;
      if (options_.policy == "belady") {
        auto belady = std::make_unique<BeladyPolicy>(next_use_, depth_);
        belady_[t] = belady.get();
        tiers_[t].policy = std::move(belady);
      } else {
        tiers_[t].policy = MakeEvictionPolicy(options_.policy);
      }
    }
    if (options_.policy == "belady") IndexFuture();
  }

  ReplayResult Run() {
    const auto started = std::chrono::steady_clock::now();
    const size_t n = trace_.requests.size();
    const auto warm = static_cast<size_t>(std::floor(options_.warmup * double(n)));
    for (size_t r = 0; r < n; ++r) {
      if (trace_.requests[r].session != 0) last_turn_[trace_.requests[r].session] = r;
    }
    std::vector<uint32_t> ids;
    // Engine model: when each engine is free next (all at time 0).
    std::priority_queue<uint64_t, std::vector<uint64_t>, std::greater<>> free_at;
    for (uint32_t e = 0; e < options_.engines; ++e) free_at.push(0);
    size_t next_queued = 0;  // requests [.., next_queued) have been hinted (or started)
    std::priority_queue<Pending, std::vector<Pending>, std::greater<>> pending;  // prefills running
    double mean_service_us = 0;
    double queue_sum = 0;  // measured starts' waiting requests
    for (size_t r = 0; r < n; ++r) {
      const TraceRequest& req = trace_.requests[r];
      ids.clear();
      for (size_t i = 0; i < req.blocks.size(); ++i) {
        const uint32_t id = IdOf(req.blocks[i]);
        blocks_[id].tokens = BlockTokens(req, i, trace_.block_tokens);
        blocks_[id].parent = i > 0 ? ids.back() : kNoParent;
        blocks_[id].session = req.session;
        ids.push_back(id);
      }
      uint64_t start = req.arrival_us;
      if (options_.engines > 0) {
        start = std::max(start, free_at.top());
        // Requests that arrived while this one waited are queued now;
        // each is expected after the ones before it, a mean service per
        // engine apart.
        next_queued = std::max(next_queued, r + 1);
        for (; next_queued < n && trace_.requests[next_queued].arrival_us <= start; ++next_queued) {
          const double ahead = double(next_queued - r) * mean_service_us / options_.engines;
          Hint(next_queued, start + static_cast<uint64_t>(ahead));
        }
        Unhint(r);
      }
      // Prefills that ended by this start have made their blocks resident.
      while (!pending.empty() && pending.top().done_us <= start) CommitNext(pending);
      if (options_.engines > 0) {
        // The queue this start sees: arrived, not started.
        const uint64_t waiting = next_queued - (r + 1);
        if (r >= warm) queue_sum += double(waiting);
      }
      const double service_us = Lookup(r, ids, r >= warm);
      if (options_.engines == 0) {
        Commit(ids, r + 1, start);
        continue;
      }
      const uint64_t done = start + static_cast<uint64_t>(std::ceil(service_us));
      free_at.pop();
      free_at.push(done);
      pending.push(Pending{done, r, ids});
      mean_service_us += (service_us - mean_service_us) / double(r + 1);
      if (r >= warm) result_.ttft_ms.push_back((double(start - req.arrival_us) + service_us) / 1000.0);
    }
    while (!pending.empty()) CommitNext(pending);
    result_.options = options_;
    if (result_.requests > 0 && options_.engines > 0) result_.mean_queue = queue_sum / double(result_.requests);
    if (n > 0) result_.span_us = trace_.requests.back().arrival_us - trace_.requests.front().arrival_us;
    if (options_.admission == "dwpd") {
      const DwpdOptions& d = options_.dwpd;
      const double per_day = d.share * double(d.drive_capacity_bytes) * d.dwpd * d.warranty_years / d.planned_years;
      const double days = std::max(1.0, double(result_.span_us) / 86'400e6);
      result_.ssd_budget_bytes = static_cast<uint64_t>(per_day * days);
    }
    result_.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    return result_;
  }

 private:
  uint32_t IdOf(const BlockKey& key) {
    auto [it, fresh] = index_.try_emplace(key, static_cast<uint32_t>(blocks_.size()));
    if (fresh) {
      blocks_.push_back(SimBlock{key});
      next_use_.push_back(BeladyPolicy::kNever);
      depth_.push_back(0);
    }
    return it->second;
  }

  // Belady: the next request naming each block of each request (flattened
  // in request order; kNever when none), from one backward pass.
  void IndexFuture() {
    const auto& reqs = trace_.requests;
    future_begin_.resize(reqs.size() + 1, 0);
    for (size_t r = 0; r < reqs.size(); ++r) future_begin_[r + 1] = future_begin_[r] + reqs[r].blocks.size();
    future_.assign(future_begin_.back(), BeladyPolicy::kNever);
    std::unordered_map<BlockKey, uint64_t> later;  // key -> the earliest request after the pass's position
    for (size_t r = reqs.size(); r-- > 0;) {
      for (size_t i = 0; i < reqs[r].blocks.size(); ++i) {
        auto [it, fresh] = later.try_emplace(reqs[r].blocks[i], r);
        if (!fresh) {
          future_[future_begin_[r] + i] = it->second;
          it->second = r;
        }
      }
    }
  }

  // A running prefill: its blocks become resident when it ends.
  struct Pending {
    uint64_t done_us;
    size_t request;
    std::vector<uint32_t> ids;
    bool operator>(const Pending& o) const {
      return done_us != o.done_us ? done_us > o.done_us : request > o.request;
    }
  };
  void CommitNext(std::priority_queue<Pending, std::vector<Pending>, std::greater<>>& pending) {
    const Pending& p = pending.top();
    Commit(p.ids, p.request + 1, p.done_us);
    pending.pop();
  }

  // Queue hints for request `r` (its blocks, depth = position), to every
  // tier's policy (only queue_aware acts on them).
  void Hint(size_t r, uint64_t expected_start_us) {
    const TraceRequest& req = trace_.requests[r];
    hint_chain_.resize(req.blocks.size());  // reused across hints
    for (size_t i = 0; i < hint_chain_.size(); ++i) {
      hint_chain_[i] = QueuedBlock{req.blocks[i], static_cast<uint32_t>(i)};
    }
    for (SimTierState& t : tiers_) {
      if (t.policy) t.policy->OnEnqueue(r, hint_chain_, expected_start_us, req.session);
    }
  }
  void Unhint(size_t r) {
    for (SimTierState& t : tiers_) {
      if (t.policy) t.policy->OnDequeue(r);
    }
  }

  uint64_t Cost(int tier, const SimBlock& b) const {
    return tiers_[tier].capacity->unit == Capacity::Unit::kBlocks ? 1 : b.tokens;
  }
  uint64_t Bytes(const SimBlock& b) const { return b.tokens * options_.bytes_per_token; }

  // The start of `req`: finds its hit and counts it; returns its engine
  // time in us (KV load of the hit plus prefill of the rest; 0 without the
  // engine model).
  double Lookup(size_t r, const std::vector<uint32_t>& ids, bool measured) {
    const TraceRequest& req = trace_.requests[r];
    result_.lookups += ids.size();
    size_t hit = 0;
    uint64_t hit_tokens = 0;
    double load_us = 0;
    while (hit < ids.size() && blocks_[ids[hit]].anywhere()) {
      const SimBlock& b = blocks_[ids[hit]];
      const int from = b.in[kHostTier] ? kHostTier : b.in[kNvmeTier] ? kNvmeTier : kRemoteTier;
      hit_tokens += b.tokens;
      load_us += double(Bytes(b)) / options_.read_bytes_per_s[from] * 1e6;
      if (measured) {
        TierResult& t = result_.tiers[from];
        ++t.hits;
        t.hit_tokens += b.tokens;
        t.bytes_read += Bytes(b);
        result_.hit_tokens += b.tokens;
      }
      ++hit;
    }
    if (measured) {
      ++result_.requests;
      result_.blocks += ids.size();
      result_.tokens += req.input_tokens;
      result_.hit_blocks += hit;
    }
    for (uint32_t id : ids) {
      if (blocks_[id].anywhere()) ++blocks_[id].uses;
    }
    if (!future_.empty()) {
      // Belady: this lookup was each block's next use; the one after is next.
      for (size_t i = 0; i < ids.size(); ++i) {
        next_use_[ids[i]] = future_[future_begin_[r] + i];
        depth_[ids[i]] = static_cast<uint32_t>(i);
        for (BeladyPolicy* b : belady_) {
          if (b != nullptr) b->Reorder(ids[i]);
        }
      }
    }
    if (options_.engines == 0) return 0;
    const uint64_t missed = req.input_tokens > hit_tokens ? req.input_tokens - hit_tokens : 0;
    return load_us + double(missed) / options_.prefill_tps * 1e6;
  }

  // The end of request `request`'s prefill at `now`: all its blocks are
  // resident in the host tier. After a conversation's last turn, the
  // conversation is closed (what an engine's scheduler would hint).
  void Commit(const std::vector<uint32_t>& ids, uint64_t request, uint64_t now) {
    CommitBlocks(ids, request, now);
    const uint64_t session = trace_.requests[request - 1].session;
    auto last = last_turn_.find(session);
    if (session == 0 || last == last_turn_.end() || last->second != request - 1) return;
    closed_.insert(session);
    for (SimTierState& t : tiers_) {
      if (t.policy) t.policy->OnSessionClosed(session);
    }
  }

  void CommitBlocks(const std::vector<uint32_t>& ids, uint64_t request, uint64_t now) {
    // In the host tier, as a client drives the daemon (tools/replay_live.h):
    // its resident blocks are pinned (a read); room is made root first for
    // the others (new, or promoted from a slower tier), so a request larger
    // than the tier keeps its prefix; they are inserted leaf first; then
    // the pins end leaf first (each a use), so the root is the most recent.
    EvictionPolicy& host = *tiers_[kHostTier].policy;
    std::vector<size_t>& pinned = scratch_pinned_;
    pinned.clear();
    for (size_t i = 0; i < ids.size(); ++i) {
      SimBlock& b = blocks_[ids[i]];
      if (!b.in[kHostTier] || b.pinned_by == request) continue;
      host.OnPin(ids[i]);
      b.pinned_by = request;
      pinned.push_back(i);
    }
    size_t kept = 0;
    for (; kept < ids.size(); ++kept) {
      SimBlock& b = blocks_[ids[kept]];
      if (b.in[kHostTier] || b.pinned_by == request) continue;
      const uint64_t cost = Cost(kHostTier, b);
      if (!MakeRoom(kHostTier, cost, now)) break;
      b.held[kHostTier] = cost;
      b.pinned_by = request;  // reserved: not resident yet
      tiers_[kHostTier].used += cost;
    }
    for (size_t i = kept; i < ids.size(); ++i) {
      const SimBlock& b = blocks_[ids[i]];
      if (!b.in[kHostTier] && b.pinned_by != request) ++result_.not_kept;
    }
    for (size_t i = kept; i-- > 0;) {
      SimBlock& b = blocks_[ids[i]];
      if (b.in[kHostTier] || b.pinned_by != request) continue;
      host.OnInsertKeyed(ids[i], b.key, now);
      b.in[kHostTier] = true;
      b.pinned_by = 0;
      result_.tiers[kHostTier].bytes_written += Bytes(b);
    }
    for (size_t k = pinned.size(); k-- > 0;) {
      SimBlock& b = blocks_[ids[pinned[k]]];
      host.OnUnpin(ids[pinned[k]], now);
      b.pinned_by = 0;
    }
  }

  // Evicts from `tier` until `cost` more fits, offering each victim to the
  // next tier; false if it cannot (too large, or the rest is pinned).
  bool MakeRoom(int tier, uint64_t cost, uint64_t now) {
    SimTierState& t = tiers_[tier];
    if (t.capacity->infinite) return true;
    if (cost > t.capacity->amount) return false;
    while (t.used + cost > t.capacity->amount) {
      auto victim = t.policy->Victim();
      if (!victim) return false;
      const auto id = static_cast<uint32_t>(victim->handle);
      SimBlock& v = blocks_[id];
      t.policy->OnRemove(id);
      v.in[tier] = false;
      t.used -= v.held[tier];
      v.held[tier] = 0;
      ++result_.tiers[tier].evictions;
      Demote(tier, id, now);
    }
    return true;
  }

  // The daemon's classes (policy/admission_policy.h's ClassifyBlock, as
  // daemon/tier_admission.h runs it), from the times the block was found
  // again and its conversation.
  AdmissionClass ClassOf(const SimBlock& b) const {
    const ConversationState conversation = b.session == 0                ? ConversationState::kUnknown
                                           : closed_.count(b.session) > 0 ? ConversationState::kClosed
                                                                          : ConversationState::kOpen;
    return ClassifyBlock(b.uses, conversation);
  }

  // A victim of `from` goes to the next tier present, if it admits it.
  void Demote(int from, uint32_t id, uint64_t now) {
    int to = from + 1;
    while (to < kSimTiers && tiers_[to].capacity == nullptr) ++to;
    if (to >= kSimTiers) return;
    SimBlock& b = blocks_[id];
    if (b.in[to]) return;  // the slower copy is still there: no write
    if (to == kNvmeTier) {
      AdmissionCandidate c;
      c.bytes = Bytes(b);
      c.cls = ClassOf(b);
      c.parent_cached = b.parent == kNoParent || blocks_[b.parent].anywhere();
      admission_->OnDeviceWritten(result_.tiers[kNvmeTier].bytes_written, now);
      if (admission_->Decide(c, now) != AdmissionOutcome::kAdmitted) {
        ++result_.admission_refused;
        return;
      }
    }
    // The tier's write channel: a demotion waits behind earlier ones, and
    // one that would wait too long is dropped.
    const double rate = options_.write_bytes_per_s[to];
    if (rate > 0) {
      uint64_t& busy = write_busy_until_[to];
      const uint64_t start = std::max(now, busy);
      if (start - now > options_.max_write_backlog_us) {
        ++result_.tiers[to].dropped_busy;
        return;
      }
      busy = start + static_cast<uint64_t>(std::ceil(double(Bytes(b)) / rate * 1e6));
    }
    const uint64_t cost = Cost(to, b);
    if (!MakeRoom(to, cost, now)) return;
    tiers_[to].policy->OnInsertKeyed(id, b.key, now);
    b.in[to] = true;
    b.held[to] = cost;
    tiers_[to].used += cost;
    result_.tiers[to].bytes_written += Bytes(b);
  }

  const Trace& trace_;
  const ReplayOptions& options_;
  std::unique_ptr<AdmissionPolicy> admission_;
  std::array<SimTierState, kSimTiers> tiers_;
  std::unordered_map<BlockKey, uint32_t> index_;
  std::vector<SimBlock> blocks_;
  std::unordered_map<uint64_t, size_t> last_turn_;  // conversation -> its last request
  std::unordered_set<uint64_t> closed_;             // conversations whose last turn ran
  std::vector<QueuedBlock> hint_chain_;             // Hint's scratch
  std::vector<size_t> scratch_pinned_;              // CommitBlocks' scratch
  std::array<uint64_t, kSimTiers> write_busy_until_{};  // each tier's write channel
  // Belady only: per block, its next use (a request index) and depth; per
  // request block, the request after it naming the block.
  std::vector<uint64_t> next_use_;
  std::vector<uint32_t> depth_;
  std::vector<uint64_t> future_;
  std::vector<size_t> future_begin_;
  std::array<BeladyPolicy*, kSimTiers> belady_{};
  ReplayResult result_;
};

}  // namespace

bool SameSetting(const ReplayOptions& a, const ReplayOptions& b) {
  auto same_cap = [](const Capacity& x, const Capacity& y) {
    return x.infinite == y.infinite && (x.infinite || (x.unit == y.unit && x.amount == y.amount));
  };
  auto same_opt = [&](const std::optional<Capacity>& x, const std::optional<Capacity>& y) {
    return x.has_value() == y.has_value() && (!x || same_cap(*x, *y));
  };
  const DwpdOptions& d = a.dwpd;
  const DwpdOptions& e = b.dwpd;
  return same_cap(a.host, b.host) && same_opt(a.nvme, b.nvme) && same_opt(a.remote, b.remote) &&
         a.admission == b.admission && d.drive_capacity_bytes == e.drive_capacity_bytes && d.dwpd == e.dwpd &&
         d.share == e.share && d.warranty_years == e.warranty_years && d.planned_years == e.planned_years &&
         a.bytes_per_token == b.bytes_per_token && a.warmup == b.warmup && a.engines == b.engines &&
         a.prefill_tps == b.prefill_tps && a.read_bytes_per_s == b.read_bytes_per_s &&
         a.write_bytes_per_s == b.write_bytes_per_s && a.max_write_backlog_us == b.max_write_backlog_us;
}

void SetGapClosed(std::vector<ReplayResult>& runs) {
  for (ReplayResult& run : runs) {
    const ReplayResult* lru = nullptr;
    const ReplayResult* belady = nullptr;
    for (const ReplayResult& other : runs) {
      if (!SameSetting(run.options, other.options)) continue;
      if (other.options.policy == "lru") lru = &other;
      if (other.options.policy == "belady") belady = &other;
    }
    run.gap_closed.reset();
    if (lru == nullptr || belady == nullptr) continue;
    const double gap = belady->token_hit_rate() - lru->token_hit_rate();
    if (gap >= kMinGap) run.gap_closed = (run.token_hit_rate() - lru->token_hit_rate()) / gap;
  }
}

Result<ReplayResult> Replay(const Trace& trace, const ReplayOptions& options) {
  if (options.policy != "belady" && MakeEvictionPolicy(options.policy) == nullptr) {
    return InvalidArgument("unknown policy '" + options.policy + "' (lru, fifo, lru2, s3fifo, arc, queue_aware, belady)");
  }
  if (!(options.warmup >= 0 && options.warmup < 1)) {
    return InvalidArgument("warm-up fraction must be in [0, 1), got " + std::to_string(options.warmup));
  }
  if ((options.nvme || options.remote || options.admission == "dwpd") && options.bytes_per_token == 0) {
    return InvalidArgument("an nvme or remote tier, and dwpd admission, need bytes per token (--bytes-per-token)");
  }
  if (options.engines > 0 && !(options.prefill_tps > 0)) {
    return InvalidArgument("the engine model needs a prefill rate above 0 (--prefill-tps)");
  }
  for (double bw : options.read_bytes_per_s) {
    if (!(bw > 0)) return InvalidArgument("read bandwidths must be above 0");
  }
  for (double bw : options.write_bytes_per_s) {
    if (!(bw >= 0)) return InvalidArgument("write bandwidths must be 0 (no limit) or above");
  }
  std::unique_ptr<AdmissionPolicy> admission;
  if (options.admission == "all") {
    admission = MakeAdmitAllPolicy();
  } else if (options.admission == "second_hit") {
    admission = MakeSecondHitPolicy();
  } else if (options.admission == "dwpd") {
    const uint64_t t0 = trace.requests.empty() ? 0 : trace.requests.front().arrival_us;
    auto made = MakeDwpdPolicy(options.dwpd, t0);
    if (!made.ok()) return made.status();
    admission = std::move(made).value();
  } else {
    return InvalidArgument("unknown admission '" + options.admission + "' (all, second_hit, dwpd)");
  }
  Simulator sim(trace, options, std::move(admission));
  return sim.Run();
}

}  // namespace kvtier::tools

// The replay's request loop (replay_simulator.h): the engine model, queue
// hints, lookups, and each request's pins, promotions and new blocks.
#include <algorithm>
#include <chrono>
#include <cmath>

#include "common/check.h"
#include "tools/replay_simulator.h"

namespace kvtier::tools {

Simulator::Simulator(const Trace& trace, const ReplayOptions& options, std::unique_ptr<AdmissionPolicy> admission,
                     const std::optional<SimLogOptions>& log)
    : trace_(trace), options_(options), admission_(std::move(admission)) {
  const Capacity* caps[kSimTiers] = {&options_.host, options_.nvme ? &*options_.nvme : nullptr,
                                     options_.remote ? &*options_.remote : nullptr};
  for (int t = 0; t < kSimTiers; ++t) tiers_[t].capacity = caps[t];
  for (int t = 0; t < kSimTiers; ++t) {
    if (caps[t] == nullptr) continue;
    if (t == kNvmeTier && log) {
      auto made = SimLog::Create(*log, LogHooks());
      KVTIER_CHECK(made.ok(), "the NVMe log's options were validated");
      log_ = std::move(made).value();
    } else if (options_.policy == "belady") {
      auto belady = std::make_unique<BeladyPolicy>(next_use_, depth_);
      belady_[t] = belady.get();
      tiers_[t].policy = std::move(belady);
    } else {
      tiers_[t].policy = MakeEvictionPolicy(options_.policy);
    }
  }
  if (options_.policy == "belady") IndexFuture();
}

ReplayResult Simulator::Run() {
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
  PendingQueue pending;    // prefills running
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
    now_us_ = start;
    const double service_us = Lookup(r, ids, start, r >= warm);
    if (options_.engines == 0) {
      Commit(ids, r + 1, start);
      continue;
    }
    Prefetch(start);
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
  result_.nvme_device_bytes = result_.tiers[kNvmeTier].bytes_written;
  if (log_) {
    result_.nvme_reinserted = log_->reinserted();
    result_.nvme_device_bytes = log_->device_bytes_written();
  }
  result_.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return result_;
}

uint32_t Simulator::IdOf(const BlockKey& key) {
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
void Simulator::IndexFuture() {
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

void Simulator::CommitNext(PendingQueue& pending) {
  const Pending& p = pending.top();
  now_us_ = p.done_us;
  Commit(p.ids, p.request + 1, p.done_us);
  pending.pop();
}

// Queue hints for request `r` (its blocks, depth = position), to every
// policy-run tier (only queue_aware acts on them) and the queued keys the
// NVMe log's queue_aware order asks about.
void Simulator::Hint(size_t r, uint64_t expected_start_us) {
  const TraceRequest& req = trace_.requests[r];
  hint_chain_.resize(req.blocks.size());  // reused across hints
  std::vector<uint32_t>& ids = queued_[r];
  for (size_t i = 0; i < hint_chain_.size(); ++i) {
    hint_chain_[i] = QueuedBlock{req.blocks[i], static_cast<uint32_t>(i)};
    const uint32_t id = IdOf(req.blocks[i]);
    ids.push_back(id);
    ++queued_count_[id];
  }
  expected_start_[r] = expected_start_us;
  for (SimTierState& t : tiers_) {
    if (t.policy) t.policy->OnEnqueue(r, hint_chain_, expected_start_us, req.session);
  }
}

void Simulator::Unhint(size_t r) {
  for (SimTierState& t : tiers_) {
    if (t.policy) t.policy->OnDequeue(r);
  }
  auto it = queued_.find(r);
  if (it == queued_.end()) return;
  for (uint32_t id : it->second) {
    auto c = queued_count_.find(id);
    if (--c->second == 0) queued_count_.erase(c);
  }
  queued_.erase(it);
  expected_start_.erase(r);
}

// The start of `req` at `start`: finds its hit and counts it; returns its
// engine time in us (KV load of the hit, a wait for prefetch reads still
// landing included, plus prefill of the rest; 0 without the engine model).
double Simulator::Lookup(size_t r, const std::vector<uint32_t>& ids, uint64_t start, bool measured) {
  const TraceRequest& req = trace_.requests[r];
  result_.lookups += ids.size();
  size_t hit = 0;
  uint64_t hit_tokens = 0;
  double load_us = 0;
  uint64_t landing_us = start;  // the last prefetch read the hit waits for
  while (hit < ids.size() && blocks_[ids[hit]].anywhere()) {
    SimBlock& b = blocks_[ids[hit]];
    const int from = b.in[kHostTier] ? kHostTier : b.in[kNvmeTier] ? kNvmeTier : kRemoteTier;
    hit_tokens += b.tokens;
    load_us += double(Bytes(b)) / options_.read_bytes_per_s[from] * 1e6;
    if (b.prefetched && from == kHostTier) {
      landing_us = std::max(landing_us, b.arrives_us);
      ++result_.prefetch_used;
      EndPrefetched(b);
    }
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
  return double(landing_us - start) + load_us + double(missed) / options_.prefill_tps * 1e6;
}

// The end of request `request`'s prefill at `now`: all its blocks are
// resident in the host tier. After a conversation's last turn, the
// conversation is closed (what an engine's scheduler would hint).
void Simulator::Commit(const std::vector<uint32_t>& ids, uint64_t request, uint64_t now) {
  CommitBlocks(ids, request, now);
  const uint64_t session = trace_.requests[request - 1].session;
  auto last = last_turn_.find(session);
  if (session == 0 || last == last_turn_.end() || last->second != request - 1) return;
  closed_.insert(session);
  for (SimTierState& t : tiers_) {
    if (t.policy) t.policy->OnSessionClosed(session);
  }
}

void Simulator::CommitBlocks(const std::vector<uint32_t>& ids, uint64_t request, uint64_t now) {
  // In the host tier, as a client drives the daemon (tools/replay_live.h):
  // root first, each block is pinned: a resident one at once, one held
  // only below once promoted (room made, read, inserted), as the daemon
  // answers a Pin; room is made root first for the others, so a request
  // larger than the tier keeps its prefix; they are inserted leaf first;
  // then the pins end leaf first (each a use), so the root is the most
  // recent.
  EvictionPolicy& host = *tiers_[kHostTier].policy;
  std::vector<size_t>& pinned = scratch_pinned_;
  pinned.clear();
  for (size_t i = 0; i < ids.size(); ++i) {
    SimBlock& b = blocks_[ids[i]];
    if (b.pinned_by == request) continue;
    if (!b.in[kHostTier] && !Promote(ids[i], now)) continue;
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

}  // namespace kvtier::tools

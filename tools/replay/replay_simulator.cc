// The replay's request loop (replay_simulator.h): routing, the engine
// model, queue hints, lookups, and each request's pins, promotions and new
// blocks.
#include <algorithm>
#include <chrono>
#include <cmath>

#include "common/check.h"
#include "policy/dwpd_budget.h"
#include "tools/replay/replay_simulator.h"

namespace kvtier::tools {

Simulator::Simulator(const Trace& trace, const ReplayOptions& options,
                     std::vector<std::unique_ptr<AdmissionPolicy>> admissions,
                     std::vector<std::unique_ptr<AdmissionPolicy>> remote_admissions,
                     const std::optional<SimLogOptions>& log)
    : trace_(trace),
      options_(options),
      route_(options.router == Router::kKvAware
                 ? std::vector<uint32_t>(trace.requests.size(), UINT32_MAX)
                 : RouteRequests(trace, options.nodes, options.router, options.affinity_blocks)),
      nodes_(options.nodes) {
  KVTIER_CHECK(admissions.size() == nodes_.size(), "one NVMe admission per node");
  KVTIER_CHECK(remote_admissions.size() == (options.remote ? nodes_.size() : 0), "one remote admission per node");
  for (size_t k = 0; k < nodes_.size(); ++k) {
    nodes_[k].index = static_cast<uint32_t>(k);
    nodes_[k].admission = std::move(admissions[k]);
    if (options.remote) nodes_[k].remote_admission = std::move(remote_admissions[k]);
    MakeTiers(nodes_[k], log);
    for (uint32_t e = 0; e < options_.engines; ++e) nodes_[k].free_at.push(0);
  }
  if (options_.router == Router::kKvAware) {
    KvAwareParams p{options_.nodes,         options_.engines,        options_.prefill_tps, options_.read_bytes_per_s,
                    FetchModelOf(options_), options_.event_delay_us, options_.event_loss,  options_.event_seed};
    router_ = std::make_unique<KvAwareRouter>(p);
  } else {
    for (size_t r = 0; r < route_.size(); ++r) nodes_[route_[r]].requests.push_back(r);
  }
  if (options_.remote) {
    remote_.capacity = &*options_.remote;
    if (options_.policy == "belady") {
      auto belady = std::make_unique<BeladyPolicy>(next_use_, depth_);
      remote_belady_ = belady.get();
      remote_.policy = std::move(belady);
    } else {
      remote_.policy = MakeEvictionPolicy(options_.policy);
    }
  }
  result_.nodes.resize(nodes_.size());
  if (options_.policy == "belady") IndexFuture();
}

// `n`'s host and NVMe tiers: the NVMe log when the NVMe tier is one, each
// other tier run by the policy (belady: Belady's rule over the node's own
// future).
void Simulator::MakeTiers(SimNode& n, const std::optional<SimLogOptions>& log) {
  n.host.capacity = &options_.host;
  n.nvme.capacity = options_.nvme ? &*options_.nvme : nullptr;
  for (int t : {kHostTier, kNvmeTier}) {
    SimTierState& tier = Tier(n, t);
    if (tier.capacity == nullptr) continue;
    if (t == kNvmeTier && log) {
      auto made = SimLog::Create(*log, LogHooks(n));
      KVTIER_CHECK(made.ok(), "the NVMe log's options were validated");
      n.log = std::move(made).value();
    } else if (options_.policy == "belady") {
      // kv_aware routes in the run: no node's own future is known, so its
      // tiers read every node's (the one next use the lookups keep).
      auto belady =
          std::make_unique<BeladyPolicy>(options_.router == Router::kKvAware ? next_use_ : n.next_use, depth_);
      n.belady[t] = belady.get();
      tier.policy = std::move(belady);
    } else {
      tier.policy = MakeEvictionPolicy(options_.policy);
    }
  }
}

ReplayResult Simulator::Run() {
  const auto started = std::chrono::steady_clock::now();
  const size_t n = trace_.requests.size();
  const auto warm = static_cast<size_t>(std::floor(options_.warmup * double(n)));
  for (size_t r = 0; r < n; ++r) {
    if (trace_.requests[r].session != 0) last_turn_[trace_.requests[r].session] = r;
  }
  PendingQueue pending;  // prefills running
  double queue_sum = 0;  // measured starts' waiting requests
  while (true) {
    if (router_) RouteArrivals(pending);
    SimNode* node = NextToStart();
    if (node == nullptr) break;
    Start(*node, pending, warm, queue_sum);
  }
  while (!pending.empty()) CommitNext(pending);
  if (result_.requests > 0 && options_.engines > 0) result_.mean_queue = queue_sum / double(result_.requests);
  Finish();
  if (router_) {
    result_.events_published = router_->events_published();
    result_.events_lost = router_->events_lost();
  }
  result_.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return result_;
}

// The run's totals over the nodes: the span, the DWPD budget (one drive
// per node), the NVMe tiers' writes.
void Simulator::Finish() {
  result_.options = options_;
  if (!trace_.requests.empty()) {
    result_.span_us = trace_.requests.back().arrival_us - trace_.requests.front().arrival_us;
  }
  if (options_.admission == "dwpd") {
    const double per_day = DwpdBytesPerDay(options_.dwpd);  // the daemon's budget's
    const double days = std::max(1.0, double(result_.span_us) / 86'400e6);
    result_.ssd_budget_bytes = static_cast<uint64_t>(per_day * days) * nodes_.size();
  }
  for (const SimNode& node : nodes_) {
    result_.nvme_device_bytes += node.log ? node.log->device_bytes_written() : node.nvme_bytes_written;
    if (node.log) result_.nvme_reinserted += node.log->reinserted();
  }
}

uint64_t Simulator::StartOf(const SimNode& n) const {
  const uint64_t arrival = trace_.requests[n.requests[n.next]].arrival_us;
  return options_.engines > 0 ? std::max(arrival, n.free_at.top()) : arrival;
}

SimNode* Simulator::NextToStart() {
  SimNode* best = nullptr;
  uint64_t best_start = 0;
  for (SimNode& n : nodes_) {
    if (n.next == n.requests.size()) continue;
    const uint64_t start = options_.engines > 0 ? StartOf(n) : 0;
    // Equal starts (always, without the engine model): file order.
    if (best == nullptr || start < best_start ||
        (start == best_start && n.requests[n.next] < best->requests[best->next])) {
      best = &n;
      best_start = start;
    }
  }
  return best;
}

void Simulator::RouteArrivals(PendingQueue& pending) {
  for (; next_route_ < trace_.requests.size(); ++next_route_) {
    const uint64_t arrival = trace_.requests[next_route_].arrival_us;
    // An arrival at a start's time is routed first: it may be queued there.
    if (const SimNode* next = NextToStart(); next != nullptr && StartOf(*next) < arrival) return;
    while (!pending.empty() && pending.top().done_us <= arrival) CommitNext(pending);
    now_us_ = arrival;
    RouteOne(next_route_);
  }
}

void Simulator::RouteOne(size_t r) {
  const TraceRequest& req = trace_.requests[r];
  std::vector<RouteBlock> chain;
  chain.reserve(req.blocks.size());
  for (size_t i = 0; i < req.blocks.size(); ++i) {
    const uint64_t tokens = BlockTokens(req, i, trace_.block_tokens);
    chain.push_back(RouteBlock{IdOf(req.blocks[i]), tokens, tokens * options_.bytes_per_token});
  }
  std::vector<NodeIo> io;
  io.reserve(nodes_.size());
  for (const SimNode& n : nodes_) io.push_back(n.io);
  const uint32_t node = router_->Route(req.arrival_us, chain, req.input_tokens, io);
  route_[r] = node;
  nodes_[node].requests.push_back(r);
}

double Simulator::OverlapWait(SimNode& n, uint64_t arrival_us, uint64_t start, const Load& load) {
  double ready = double(start) + load.landing_us;
  for (int t = 0; t < kSimTiers; ++t) {
    if (load.bytes[t] == 0) continue;
    uint64_t& free = n.io.read_free_us[t];
    const uint64_t begin = std::max(arrival_us, free);
    free = begin + static_cast<uint64_t>(std::ceil(double(load.bytes[t]) / options_.read_bytes_per_s[t] * 1e6));
    ready = std::max(ready, double(free));
  }
  if (load.peer_bytes > 0) ready = std::max(ready, double(PeerReadDone(n, arrival_us, load.peer_bytes)));
  return std::max(0.0, ready - double(start));
}

void Simulator::Start(SimNode& n, PendingQueue& pending, size_t warm, double& queue_sum) {
  const size_t at = n.next++;  // the request's position among n's
  const size_t r = n.requests[at];
  const TraceRequest& req = trace_.requests[r];
  std::vector<uint32_t>& ids = scratch_ids_;
  ids.clear();
  for (size_t i = 0; i < req.blocks.size(); ++i) {
    const uint32_t id = IdOf(req.blocks[i]);
    blocks_[id].tokens = BlockTokens(req, i, trace_.block_tokens);
    blocks_[id].parent = i > 0 ? ids.back() : kNoParent;
    blocks_[id].session = req.session;
    ids.push_back(id);
  }
  const uint64_t start = options_.engines > 0 ? std::max(req.arrival_us, n.free_at.top()) : req.arrival_us;
  // Prefills (on any node) that ended by this start have made their
  // blocks resident.
  while (!pending.empty() && pending.top().done_us <= start) CommitNext(pending);
  now_us_ = start;
  if (options_.engines > 0) {
    // n's requests that arrived while this one waited are queued now;
    // each is expected after the ones before it, a mean service per
    // engine apart.
    n.next_queued = std::max(n.next_queued, at + 1);
    for (; n.next_queued < n.requests.size() && trace_.requests[n.requests[n.next_queued]].arrival_us <= start;
         ++n.next_queued) {
      const double ahead = double(n.next_queued - at) * n.mean_service_us / options_.engines;
      Hint(n, n.requests[n.next_queued], start, start + static_cast<uint64_t>(ahead));
    }
    Unhint(n, r, start);
  }
  // The queue this start sees: arrived at n, not started.
  if (options_.engines > 0 && r >= warm) queue_sum += double(n.next_queued - (at + 1));
  Record(ScheduleEvent::Kind::kStart, start, r);
  const Load load = Lookup(n, r, ids, start, r >= warm);
  if (options_.engines == 0) {
    Commit(n, ids, r + 1, start);
    return;
  }
  const double service_us = FetchModelOf(options_) == FetchModel::kSerial
                                ? load.landing_us + load.load_us + load.prefill_us
                                : OverlapWait(n, req.arrival_us, start, load) + load.prefill_us;
  const uint64_t done = start + static_cast<uint64_t>(std::ceil(service_us));
  n.free_at.pop();
  n.free_at.push(done);
  pending.push(Pending{done, r, ids});
  n.mean_service_us += (service_us - n.mean_service_us) / double(at + 1);
  if (r >= warm) result_.ttft_ms.push_back((double(start - req.arrival_us) + service_us) / 1000.0);
}

uint32_t Simulator::IdOf(const BlockKey& key) {
  auto [it, fresh] = index_.try_emplace(key, static_cast<uint32_t>(blocks_.size()));
  if (fresh) {
    blocks_.push_back(SimBlock{key});
    next_use_.push_back(BeladyPolicy::kNever);
    depth_.push_back(0);
    remote_.in.push_back(0);
    remote_.held.push_back(0);
    for (SimNode& n : nodes_) {
      for (SimTierState* t : {&n.host, &n.nvme}) {
        t->in.push_back(0);
        t->held.push_back(0);
      }
      n.blocks.emplace_back();
      if (!node_future_.empty()) n.next_use.push_back(BeladyPolicy::kNever);
    }
  }
  return it->second;
}

// Belady: the next request naming each block of each request (flattened
// in request order; kNever when none), on any node and (routes known
// before the run) on the request's own node, from one backward pass.
void Simulator::IndexFuture() {
  const auto& reqs = trace_.requests;
  const bool per_node = router_ == nullptr;
  future_begin_.resize(reqs.size() + 1, 0);
  for (size_t r = 0; r < reqs.size(); ++r) future_begin_[r + 1] = future_begin_[r] + reqs[r].blocks.size();
  future_.assign(future_begin_.back(), BeladyPolicy::kNever);
  if (per_node) node_future_.assign(future_begin_.back(), BeladyPolicy::kNever);
  // key -> the earliest request after the pass's position: on any node, on each node
  std::unordered_map<BlockKey, uint64_t> later;
  std::vector<std::unordered_map<BlockKey, uint64_t>> later_on(per_node ? nodes_.size() : 0);
  auto link = [&](std::unordered_map<BlockKey, uint64_t>& map, std::vector<uint64_t>& out, size_t r, size_t i) {
    auto [it, fresh] = map.try_emplace(reqs[r].blocks[i], r);
    if (!fresh) {
      out[future_begin_[r] + i] = it->second;
      it->second = r;
    }
  };
  for (size_t r = reqs.size(); r-- > 0;) {
    for (size_t i = 0; i < reqs[r].blocks.size(); ++i) {
      link(later, future_, r, i);
      if (per_node) link(later_on[route_[r]], node_future_, r, i);
    }
  }
}

void Simulator::CommitNext(PendingQueue& pending) {
  const Pending& p = pending.top();
  now_us_ = p.done_us;
  Record(ScheduleEvent::Kind::kCommit, p.done_us, p.request);
  Commit(nodes_[route_[p.request]], p.ids, p.request + 1, p.done_us);
  pending.pop();
}

void Simulator::Record(ScheduleEvent::Kind kind, uint64_t at_us, size_t request, uint64_t start_us) {
  if (options_.record_schedule) result_.schedule.push_back(ScheduleEvent{kind, at_us, request, start_us});
}

// Queue hints for request `r` (its blocks, depth = position) queued at
// `n` at `now`, to the policies of `n`'s tiers and of the remote tier
// (only queue_aware acts on them), and the queued keys `n`'s NVMe log's
// queue_aware order asks about; then the plans the daemon's Enqueue
// starts.
void Simulator::Hint(SimNode& n, size_t r, uint64_t now, uint64_t expected_start_us) {
  Record(ScheduleEvent::Kind::kEnqueue, now, r, expected_start_us);
  const TraceRequest& req = trace_.requests[r];
  hint_chain_.resize(req.blocks.size());  // reused across hints
  std::vector<uint32_t>& ids = n.queued[r];
  for (size_t i = 0; i < hint_chain_.size(); ++i) {
    hint_chain_[i] = QueuedBlock{req.blocks[i], static_cast<uint32_t>(i)};
    const uint32_t id = IdOf(req.blocks[i]);
    ids.push_back(id);
    ++n.queued_count[id];
  }
  n.expected_start[r] = expected_start_us;
  for (SimTierState* t : {&n.host, &n.nvme, &remote_}) {
    if (t->policy) t->policy->OnEnqueue(r, hint_chain_, expected_start_us, req.session);
  }
  PlanPrefetches(n, now);
}

// Request `r` starts at `now`: it leaves `n`'s queue, and the daemon's
// Dequeue plans (the queue changed) when it was queued.
void Simulator::Unhint(SimNode& n, size_t r, uint64_t now) {
  for (SimTierState* t : {&n.host, &n.nvme, &remote_}) {
    if (t->policy) t->policy->OnDequeue(r);
  }
  auto it = n.queued.find(r);
  if (it == n.queued.end()) return;
  Record(ScheduleEvent::Kind::kDequeue, now, r);
  for (uint32_t id : it->second) {
    auto c = n.queued_count.find(id);
    if (--c->second == 0) n.queued_count.erase(c);
  }
  n.queued.erase(it);
  n.expected_start.erase(r);
  PlanPrefetches(n, now);
}

// The start of `req` on `n` at `start`: finds its hit in the tiers `n`
// sees and counts it; returns its KV load (the hit's bytes and read time
// by tier, the wait for prefetch reads still landing) and the prefill of
// the rest (zeros without the engine model). A prefetched block it finds is used
// when the request pins it (CommitBlocks), as the daemon counts a use.
Simulator::Load Simulator::Lookup(SimNode& n, size_t r, const std::vector<uint32_t>& ids, uint64_t start,
                                  bool measured) {
  const TraceRequest& req = trace_.requests[r];
  NodeResult& node_result = result_.nodes[n.index];
  result_.lookups += ids.size();
  size_t hit = 0;
  uint64_t hit_tokens = 0;
  Load load;
  uint64_t landing_us = start;  // the last prefetch read the hit waits for
  bool probed = false;          // the peer tier: the rest of the chain was probed
  while (hit < ids.size()) {
    const uint32_t id = ids[hit];
    const int from = Place(n, ids, hit, start, probed);
    if (from < 0) break;
    const SimBlock& b = blocks_[id];
    NodeBlock& nb = n.blocks[id];
    hit_tokens += b.tokens;
    const double bw = from == kPeerLevel ? options_.peer_bytes_per_s : options_.read_bytes_per_s[from];
    load.load_us += double(Bytes(b)) / bw * 1e6;
    (from == kPeerLevel ? load.peer_bytes : load.bytes[from]) += Bytes(b);
    if (nb.prefetched && from == kHostTier) landing_us = std::max(landing_us, nb.arrives_us);
    if (measured) {
      TierResult& t = from == kPeerLevel ? result_.peer : result_.tiers[from];
      ++t.hits;
      t.hit_tokens += b.tokens;
      t.bytes_read += Bytes(b);
      result_.hit_tokens += b.tokens;
      (from == kRemoteTier  ? node_result.shared_hit_tokens
       : from == kPeerLevel ? node_result.peer_hit_tokens
                            : node_result.local_hit_tokens) += b.tokens;
    }
    ++hit;
  }
  // One round trip for the request's pins at the peers, before their bytes.
  if (load.peer_bytes > 0) load.load_us += double(options_.peer_rtt_us);
  if (load.peer_bytes > 0 && measured) ++result_.peer_pulls;
  if (measured) {
    ++result_.requests;
    result_.blocks += ids.size();
    result_.tokens += req.input_tokens;
    result_.hit_blocks += hit;
    ++node_result.requests;
    node_result.tokens += req.input_tokens;
  }
  if (!future_.empty()) {
    // Belady: this lookup was each block's next use; the one after is
    // next, on any node (the remote tier's) and on n (n's tiers'). Under
    // kv_aware every node's tiers read the one next use, so every node's
    // refile it: a node that kept the use this lookup just spent would
    // hold the block as needed next, for good.
    for (size_t i = 0; i < ids.size(); ++i) {
      next_use_[ids[i]] = future_[future_begin_[r] + i];
      if (!node_future_.empty()) n.next_use[ids[i]] = node_future_[future_begin_[r] + i];
      depth_[ids[i]] = static_cast<uint32_t>(i);
      for (SimNode& m : nodes_) {
        if (&m != &n && router_ == nullptr) continue;
        for (BeladyPolicy* b : m.belady) {
          if (b != nullptr) b->Reorder(ids[i]);
        }
      }
      if (remote_belady_ != nullptr) remote_belady_->Reorder(ids[i]);
    }
  }
  if (options_.engines == 0) return Load{};
  const uint64_t missed = req.input_tokens > hit_tokens ? req.input_tokens - hit_tokens : 0;
  load.landing_us = double(landing_us - start);
  load.prefill_us = double(missed) / options_.prefill_tps * 1e6;
  return load;
}

// The end of request `request`'s prefill on `n` at `now`: all its blocks
// are resident in `n`'s host tier. After a conversation's last turn, the
// conversation is closed for `n` (what its engine's scheduler would hint:
// to its tiers and the remote tier; other nodes are not told).
void Simulator::Commit(SimNode& n, const std::vector<uint32_t>& ids, uint64_t request, uint64_t now) {
  CommitBlocks(n, ids, request, now);
  const uint64_t session = trace_.requests[request - 1].session;
  auto last = last_turn_.find(session);
  if (session == 0 || last == last_turn_.end() || last->second != request - 1) return;
  n.closed.insert(session);
  for (SimTierState* t : {&n.host, &n.nvme, &remote_}) {
    if (t->policy) t->policy->OnSessionClosed(session);
  }
}

void Simulator::CommitBlocks(SimNode& n, const std::vector<uint32_t>& ids, uint64_t request, uint64_t now) {
  // In the host tier, as a client drives the daemon (tools/replay/replay_live.h):
  // root first, each block is pinned: a resident one at once, one held
  // only below once promoted (room made, read, inserted), as the daemon
  // answers a Pin; room is made root first for the others, so a request
  // larger than the tier keeps its prefix; they are inserted leaf first;
  // then the pins end leaf first (each a use), so the root is the most
  // recent.
  SimTierState& host_tier = n.host;
  EvictionPolicy& host = *host_tier.policy;
  std::vector<size_t>& pinned = scratch_pinned_;
  pinned.clear();
  //
  // Each block's uses are counted as the daemon's host entry counts them
  // (BlockEntry::hits, what its admission classes a victim by), when its
  // pin lands: one more for a block in the host tier; one for a block
  // promoted (a new entry that this pin uses); none for a block put anew,
  // also one that the lookup found below and the room made for the blocks
  // before it pushed out.
  //
  // A pin of a prefetched block is its use (the daemon's BlockIndex::Pin):
  // its bytes leave the prefetch budget, and the daemon plans again.
  for (size_t i = 0; i < ids.size(); ++i) {
    SimBlock& b = blocks_[ids[i]];
    if (b.pinned_by == request) continue;
    uint64_t& uses = n.blocks[ids[i]].uses;
    const bool prefetched = host_tier.in[ids[i]] && n.blocks[ids[i]].prefetched;
    if (host_tier.in[ids[i]]) {
      ++uses;
    } else if (Promote(n, ids[i], now)) {
      uses = 1;
    } else {
      uses = 0;
      continue;
    }
    host.OnPin(ids[i]);
    b.pinned_by = request;
    pinned.push_back(i);
    if (prefetched) {
      ++result_.prefetch_used;
      EndPrefetched(n, ids[i]);
      PlanPrefetches(n, now);
    }
  }
  size_t kept = 0;
  for (; kept < ids.size(); ++kept) {
    SimBlock& b = blocks_[ids[kept]];
    if (host_tier.in[ids[kept]] || b.pinned_by == request) continue;
    const uint64_t cost = Cost(host_tier, b);
    if (!MakeRoom(n, kHostTier, cost, now)) break;
    host_tier.held[ids[kept]] = cost;
    b.pinned_by = request;  // reserved: not resident yet
    host_tier.used += cost;
  }
  for (size_t i = kept; i < ids.size(); ++i) {
    if (!host_tier.in[ids[i]] && blocks_[ids[i]].pinned_by != request) ++result_.not_kept;
  }
  for (size_t i = kept; i-- > 0;) {
    SimBlock& b = blocks_[ids[i]];
    if (host_tier.in[ids[i]] || b.pinned_by != request) continue;
    host.OnInsertKeyed(ids[i], b.key, now);
    host_tier.in[ids[i]] = 1;
    Emit(n, kHostTier, ids[i], true, now);
    b.pinned_by = 0;
    result_.tiers[kHostTier].bytes_written += Bytes(b);
  }
  for (size_t k = pinned.size(); k-- > 0;) {
    host.OnUnpin(ids[pinned[k]], now);
    blocks_[ids[pinned[k]]].pinned_by = 0;
  }
}

}  // namespace kvtier::tools

// Engine queue hints: requests queued by an inference engine's scheduler,
// split by shard and handed to each shard's eviction policy; and prefetch
// of their prefixes held below the host tier into it.
#include <algorithm>
#include <unordered_map>

#include "daemon/engine/engine.h"
#include "daemon/engine/block_index.h"

namespace kvtier {

Status Engine::Enqueue(ConnectionId connection, const NamespaceFingerprint& ns, uint64_t request,
                       std::span<const BlockKey> chain, uint64_t start_in_us, uint64_t conversation) {
  // Clamped: a far-off (or wrapped-around) start would overflow the clock.
  start_in_us = std::min(start_in_us, kMaxStartInUs);
  if (Status s = RegisterQueued(connection, ns, request, chain, clock_.NowUs() + start_in_us, conversation); !s.ok()) {
    return s;
  }
  lineage_.Record(chain, conversation);
  counters_.enqueues.fetch_add(1, std::memory_order_relaxed);
  SchedulePrefetch();
  return Status::Ok();
}

Status Engine::RegisterQueued(ConnectionId connection, const NamespaceFingerprint& ns, uint64_t request,
                              std::span<const BlockKey> chain, uint64_t start_us, uint64_t conversation) {
  std::vector<std::vector<QueuedBlock>> parts(shards_.size());
  for (size_t i = 0; i < chain.size(); ++i) {
    parts[ShardIndex(chain[i])].push_back(QueuedBlock{chain[i], static_cast<uint32_t>(i)});
  }
  MutexLock queue_lock(queue_mu_);
  ConnectionQueue& mine = queued_per_connection_[connection];
  // Not a structured binding: the lambda below captures both, which clang
  // before 16 refuses (the fuzz build's clang 14).
  const auto emplaced = queued_.try_emplace({connection, request});
  const auto it = emplaced.first;
  const bool inserted = emplaced.second;
  const size_t keys_after = mine.keys - it->second.chain.size() + chain.size();
  const auto refuse = [&](Status busy) {
    queue_mu_.AssertHeld();  // runs only here, under queue_lock
    if (inserted) queued_.erase(it);
    if (mine.requests == 0) queued_per_connection_.erase(connection);
    return busy;
  };
  if (inserted && queued_.size() > kMaxQueuedRequests) {
    return refuse(Busy("more than " + std::to_string(kMaxQueuedRequests) +
                       " requests queued; report Started/Finished for the ones that left the queue"));
  }
  if (inserted && mine.requests + 1 > max_queued_requests_per_connection_) {
    return refuse(Busy("this connection has " + std::to_string(mine.requests) +
                       " requests queued, its limit; report Started/Finished for the ones that left the queue"));
  }
  if (keys_after > max_queued_keys_per_connection_) {
    return refuse(Busy("this connection's queued requests would name " + std::to_string(keys_after) +
                       " blocks, over its limit of " + std::to_string(max_queued_keys_per_connection_)));
  }
  if (inserted) ++mine.requests;
  mine.keys = keys_after;
  QueuedRequest& q = it->second;
  if (inserted) q.id = next_queue_id_++;
  // A replaced request leaves the shards its old chain touched.
  for (size_t s : q.shards) {
    if (!parts[s].empty()) continue;
    MutexLock lock(shards_[s]->mu);
    shards_[s]->policy->OnDequeue(q.id);
  }
  q.shards.clear();
  for (size_t s = 0; s < parts.size(); ++s) {
    if (parts[s].empty()) continue;
    MutexLock lock(shards_[s]->mu);
    shards_[s]->policy->OnEnqueue(q.id, parts[s], start_us, conversation);
    q.shards.push_back(s);
  }
  q.ns = ns;
  queued_keys_.Remove(q.chain);  // empty for a new request
  queued_keys_.Add(chain);
  q.chain.assign(chain.begin(), chain.end());
  q.start_us = start_us;
  return Status::Ok();
}

Status Engine::Dequeue(ConnectionId connection, uint64_t request) {
  {
    MutexLock queue_lock(queue_mu_);
    auto it = queued_.find({connection, request});
    if (it == queued_.end()) return NotFound("request " + std::to_string(request) + " is not queued");
    for (size_t s : it->second.shards) {
      MutexLock lock(shards_[s]->mu);
      shards_[s]->policy->OnDequeue(it->second.id);
    }
    queued_keys_.Remove(it->second.chain);
    ConnectionQueue& mine = queued_per_connection_[connection];
    mine.keys -= it->second.chain.size();
    if (--mine.requests == 0) queued_per_connection_.erase(connection);
    queued_.erase(it);
  }
  counters_.dequeues.fetch_add(1, std::memory_order_relaxed);
  // Blocks prefetched for it that it used no longer hold the budget: the
  // next requests may have it.
  SchedulePrefetch();
  return Status::Ok();
}

void Engine::DropQueuedRequests(ConnectionId connection) {
  MutexLock queue_lock(queue_mu_);
  auto it = queued_.lower_bound({connection, 0});
  while (it != queued_.end() && it->first.first == connection) {
    for (size_t s : it->second.shards) {
      MutexLock lock(shards_[s]->mu);
      shards_[s]->policy->OnDequeue(it->second.id);
    }
    queued_keys_.Remove(it->second.chain);
    it = queued_.erase(it);
  }
  queued_per_connection_.erase(connection);
}

void Engine::SchedulePrefetch() {
  if (below_.empty() || prefetch_share_ <= 0) return;
  if (prefetch_scheduled_.exchange(true, std::memory_order_acq_rel)) return;
  IoStarted();  // the plan's, so WaitForIdle covers it
  const bool queued = reader_->TrySubmit([this] {
    // Cleared first: a change from here on schedules the next plan.
    prefetch_scheduled_.store(false, std::memory_order_release);
    Prefetch();
    IoFinished();
  });
  if (!queued) {
    prefetch_scheduled_.store(false, std::memory_order_release);
    Bump(counters_.prefetch_plans_busy);
    IoFinished();
  }
}

size_t Engine::Prefetch() {
  if (below_.empty() || prefetch_share_ <= 0) return 0;
  struct Queued {
    uint64_t id;
    NamespaceFingerprint ns;
    std::vector<BlockKey> chain;
    uint64_t start_us;
  };
  std::vector<Queued> queued;
  {
    // Copy only the chains of the earliest kPrefetchPlanRequests.
    MutexLock lock(queue_mu_);
    std::vector<const QueuedRequest*> earliest;
    earliest.reserve(queued_.size());
    for (const auto& [who, q] : queued_) earliest.push_back(&q);
    const auto sooner = [](const QueuedRequest* a, const QueuedRequest* b) {
      return a->start_us != b->start_us ? a->start_us < b->start_us : a->id < b->id;
    };
    const size_t n = std::min(earliest.size(), kPrefetchPlanRequests);
    std::partial_sort(earliest.begin(), earliest.begin() + static_cast<ptrdiff_t>(n), earliest.end(), sooner);
    queued.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      queued.push_back(Queued{earliest[i]->id, earliest[i]->ns, earliest[i]->chain, earliest[i]->start_us});
    }
  }
  // Where each chain block is now: in DRAM (or on its way), below (the
  // first tier below is the planner's nvme channel, any lower one its
  // remote channel), or nowhere (which ends the usable prefix).
  std::vector<PrefetchRequest> requests;
  std::unordered_map<uint64_t, NamespaceFingerprint> ns_of;
  for (const Queued& q : queued) {
    PrefetchRequest r{q.id, q.start_us, {}};
    for (const BlockKey& key : q.chain) {
      PrefetchBlock b{key, 0, BlockPlace::kNowhere};
      {
        BlockIndex& shard = ShardFor(key);
        MutexLock lock(shard.mu);
        auto it = shard.index.find(key);
        if (it != shard.index.end() && it->second.ns == q.ns && (it->second.cached() || it->second.promoting())) {
          b.place = BlockPlace::kHost;
        }
      }
      if (b.place != BlockPlace::kHost) {
        if (std::optional<Located> below = FindBelow(key, q.ns)) {
          b.place = BlockPlace::kBelow;
          b.level = static_cast<uint32_t>(below->level);
          b.bytes = below->info.payload_bytes;
        }
      }
      r.chain.push_back(b);
      if (b.place == BlockPlace::kNowhere) break;
    }
    ns_of[q.id] = q.ns;
    requests.push_back(std::move(r));
  }
  std::vector<BandwidthEstimate> bandwidths;  // one read channel per tier below
  {
    MutexLock lock(bandwidth_mu_);
    for (const auto& b : below_) bandwidths.push_back(b->read_bandwidth);
  }
  // The budget holds what earlier plans read in and nobody used yet.
  uint64_t still_prefetched = 0;
  for (auto& shard : shards_) {
    MutexLock lock(shard->mu);
    still_prefetched += shard->prefetched_bytes;
  }
  const PrefetchOptions options{PrefetchBudget(prefetch_share_, host_.capacity_bytes(), still_prefetched),
                                prefetch_min_blocks_};
  const PrefetchPlan plan = PlanPrefetch(clock_.NowUs(), requests, bandwidths, options);
  counters_.prefetch_plans.fetch_add(1, std::memory_order_relaxed);
  counters_.prefetch_skipped_short.fetch_add(plan.skipped_short, std::memory_order_relaxed);
  size_t started = 0;
  for (const PrefetchAction& a : plan.actions) {
    const NamespaceFingerprint ns = ns_of.at(a.request);
    std::optional<Located> below = FindBelow(a.key, ns);
    if (!below) continue;  // evicted meanwhile
    {
      // Claim the key as a Pin's promotion does: pins wait for this read.
      BlockIndex& shard = ShardFor(a.key);
      MutexLock lock(shard.mu);
      if (shard.index.count(a.key) != 0) continue;  // cached or being written meanwhile
      shard.BeginPromotion(a.key, ns, below->info.payload_bytes, /*prefetched=*/true);
    }
    prefetch_reads_.fetch_add(1, std::memory_order_acq_rel);
    Promote(a.key, *below);
    counters_.prefetches.fetch_add(1, std::memory_order_relaxed);
    counters_.prefetch_bytes.fetch_add(static_cast<int64_t>(below->info.payload_bytes), std::memory_order_relaxed);
    ++started;
  }
  return started;
}

void Engine::ConversationHint(uint64_t conversation, bool open) {
  lineage_.SetConversation(conversation, open);
  for (auto& shard : shards_) {
    MutexLock lock(shard->mu);
    if (open) {
      shard->policy->OnSessionOpened(conversation);
    } else {
      shard->policy->OnSessionClosed(conversation);
    }
  }
}

}  // namespace kvtier

// Engine queue hints: requests queued by an inference engine's scheduler,
// split by shard and handed to each shard's eviction policy.
#include <algorithm>

#include "daemon/engine.h"
#include "daemon/engine_shard.h"

namespace kvtier {

Status Engine::Enqueue(SessionId session, const NamespaceFingerprint& ns, uint64_t request,
                       std::span<const BlockKey> chain, uint64_t start_in_us, uint64_t conversation) {
  (void)ns;  // keys already carry the model, adapter and position (DESIGN.md section 2)
  const uint64_t start = clock_.NowUs() + start_in_us;
  std::vector<std::vector<QueuedBlock>> parts(shards_.size());
  for (size_t i = 0; i < chain.size(); ++i) {
    parts[ShardIndex(chain[i])].push_back(QueuedBlock{chain[i], static_cast<uint32_t>(i)});
  }
  std::lock_guard queue_lock(queue_mu_);
  auto [it, inserted] = queued_.try_emplace({session, request});
  if (inserted && queued_.size() > kMaxQueuedRequests) {
    queued_.erase(it);
    return Busy("more than " + std::to_string(kMaxQueuedRequests) +
                             " requests queued; report Started/Finished for the ones that left the queue");
  }
  QueuedRequest& q = it->second;
  if (inserted) q.id = next_queue_id_++;
  // A replaced request leaves the shards its old chain touched.
  for (size_t s : q.shards) {
    if (!parts[s].empty()) continue;
    std::lock_guard lock(shards_[s]->mu);
    shards_[s]->policy->OnDequeue(q.id);
  }
  q.shards.clear();
  for (size_t s = 0; s < parts.size(); ++s) {
    if (parts[s].empty()) continue;
    std::lock_guard lock(shards_[s]->mu);
    shards_[s]->policy->OnEnqueue(q.id, parts[s], start, conversation);
    q.shards.push_back(s);
  }
  counters_.enqueues.fetch_add(1, std::memory_order_relaxed);
  return Status::Ok();
}

Status Engine::Dequeue(SessionId session, uint64_t request) {
  std::lock_guard queue_lock(queue_mu_);
  auto it = queued_.find({session, request});
  if (it == queued_.end()) return NotFound("request " + std::to_string(request) + " is not queued");
  for (size_t s : it->second.shards) {
    std::lock_guard lock(shards_[s]->mu);
    shards_[s]->policy->OnDequeue(it->second.id);
  }
  queued_.erase(it);
  counters_.dequeues.fetch_add(1, std::memory_order_relaxed);
  return Status::Ok();
}

void Engine::DropQueuedRequests(SessionId session) {
  std::lock_guard queue_lock(queue_mu_);
  auto it = queued_.lower_bound({session, 0});
  while (it != queued_.end() && it->first.first == session) {
    for (size_t s : it->second.shards) {
      std::lock_guard lock(shards_[s]->mu);
      shards_[s]->policy->OnDequeue(it->second.id);
    }
    it = queued_.erase(it);
  }
}

void Engine::ConversationHint(uint64_t conversation, bool open) {
  for (auto& shard : shards_) {
    std::lock_guard lock(shard->mu);
    if (open) {
      shard->policy->OnSessionOpened(conversation);
    } else {
      shard->policy->OnSessionClosed(conversation);
    }
  }
}

}  // namespace kvtier

#include "daemon/engine/request_queue.h"

#include <algorithm>
#include <string>

#include "daemon/engine/block_index.h"

namespace kvtier {

RequestQueue::RequestQueue(const std::vector<std::unique_ptr<BlockIndex>>& shards, Limits limits)
    : shards_(shards), limits_(limits) {}

Status RequestQueue::Add(ConnectionId connection, const NamespaceFingerprint& ns, uint64_t request,
                         std::span<const BlockKey> chain, uint64_t start_us, uint64_t conversation) {
  std::vector<std::vector<QueuedBlock>> parts(shards_.size());
  for (size_t i = 0; i < chain.size(); ++i) {
    parts[ShardIndexOf(chain[i], shards_.size())].push_back(QueuedBlock{chain[i], static_cast<uint32_t>(i)});
  }
  MutexLock queue_lock(mu_);
  PerConnection& mine = per_connection_[connection];
  // Not a structured binding: the lambda below captures both, which clang
  // before 16 refuses (the fuzz build's clang 14).
  const auto emplaced = requests_.try_emplace({connection, request});
  const auto it = emplaced.first;
  const bool inserted = emplaced.second;
  const size_t keys_after = mine.keys - it->second.chain.size() + chain.size();
  const auto refuse = [&](Status busy) {
    mu_.AssertHeld();  // runs only here, under queue_lock
    if (inserted) requests_.erase(it);
    if (mine.requests == 0) per_connection_.erase(connection);
    return busy;
  };
  if (inserted && requests_.size() > limits_.max_requests) {
    return refuse(Busy("more than " + std::to_string(limits_.max_requests) +
                       " requests queued; report Started/Finished for the ones that left the queue"));
  }
  if (inserted && mine.requests + 1 > limits_.max_requests_per_connection) {
    return refuse(Busy("this connection has " + std::to_string(mine.requests) +
                       " requests queued, its limit; report Started/Finished for the ones that left the queue"));
  }
  if (keys_after > limits_.max_keys_per_connection) {
    return refuse(Busy("this connection's queued requests would name " + std::to_string(keys_after) +
                       " blocks, over its limit of " + std::to_string(limits_.max_keys_per_connection)));
  }
  if (inserted) ++mine.requests;
  mine.keys = keys_after;
  Request& q = it->second;
  if (inserted) q.id = next_id_++;
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
  keys_.Remove(q.chain);  // empty for a new request
  keys_.Add(chain);
  q.chain.assign(chain.begin(), chain.end());
  q.start_us = start_us;
  return Status::Ok();
}

void RequestQueue::Forget(const Request& request) {
  for (size_t s : request.shards) {
    MutexLock lock(shards_[s]->mu);
    shards_[s]->policy->OnDequeue(request.id);
  }
  keys_.Remove(request.chain);
}

Status RequestQueue::Remove(ConnectionId connection, uint64_t request) {
  MutexLock queue_lock(mu_);
  auto it = requests_.find({connection, request});
  if (it == requests_.end()) return NotFound("request " + std::to_string(request) + " is not queued");
  Forget(it->second);
  PerConnection& mine = per_connection_[connection];
  mine.keys -= it->second.chain.size();
  if (--mine.requests == 0) per_connection_.erase(connection);
  requests_.erase(it);
  return Status::Ok();
}

void RequestQueue::DropConnection(ConnectionId connection) {
  MutexLock queue_lock(mu_);
  auto it = requests_.lower_bound({connection, 0});
  while (it != requests_.end() && it->first.first == connection) {
    Forget(it->second);
    it = requests_.erase(it);
  }
  per_connection_.erase(connection);
}

void RequestQueue::SetConversation(uint64_t conversation, bool open) {
  for (const auto& shard : shards_) {
    MutexLock lock(shard->mu);
    if (open) {
      shard->policy->OnSessionOpened(conversation);
    } else {
      shard->policy->OnSessionClosed(conversation);
    }
  }
}

std::vector<RequestQueue::Queued> RequestQueue::Earliest(size_t n) const {
  MutexLock lock(mu_);
  std::vector<const Request*> earliest;
  earliest.reserve(requests_.size());
  for (const auto& [who, q] : requests_) earliest.push_back(&q);
  const auto sooner = [](const Request* a, const Request* b) {
    return a->start_us != b->start_us ? a->start_us < b->start_us : a->id < b->id;
  };
  n = std::min(earliest.size(), n);
  std::partial_sort(earliest.begin(), earliest.begin() + static_cast<ptrdiff_t>(n), earliest.end(), sooner);
  std::vector<Queued> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    out.push_back(Queued{earliest[i]->id, earliest[i]->ns, earliest[i]->chain, earliest[i]->start_us});
  }
  return out;
}

size_t RequestQueue::size() const {
  MutexLock lock(mu_);
  return requests_.size();
}

}  // namespace kvtier

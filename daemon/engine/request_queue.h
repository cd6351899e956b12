// RequestQueue: the requests an inference engine's scheduler says are
// queued (queue hints), by connection and request id. Each request's chain
// is handed, split by shard, to the eviction policy of every shard it
// touches (EvictionPolicy::OnEnqueue / OnDequeue under an engine-wide id),
// and the keys the chains name are counted (QueuedKeys) so a tier below
// can ask whether a queued request needs a key. The prefetcher reads the
// earliest requests from here.
//
// Bounded: at most Limits::max_requests requests in all, and per
// connection at most max_requests_per_connection requests naming at most
// max_keys_per_connection chain keys; past a bound the call is refused
// (Busy) and nothing changes.
//
// Thread-safe. One mutex, taken before a shard's lock (the policies are
// called under it, one shard at a time) and never while a shard lock is
// held; QueuedKeys' lock is a leaf under it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "daemon/engine/engine_types.h"
#include "daemon/engine/queued_keys.h"
#include "kvtier/block_key.h"
#include "kvtier/result.h"

namespace kvtier {

class BlockIndex;

class RequestQueue {
 public:
  struct Limits {
    size_t max_requests = 0;  // queued at once, every connection together
    size_t max_requests_per_connection = 0;
    size_t max_keys_per_connection = 0;  // chain keys of one connection's requests
  };
  // `shards` is borrowed (it outlives the queue, and is not resized after
  // the first call); a key belongs to shard ShardIndexOf(key, size).
  RequestQueue(const std::vector<std::unique_ptr<BlockIndex>>& shards, Limits limits);
  RequestQueue(const RequestQueue&) = delete;
  RequestQueue& operator=(const RequestQueue&) = delete;

  // Queues `request` of `connection`: it will need `chain` (root first) of
  // `ns`, expected to start at `start_us`, for conversation `conversation`
  // (0: none). Again with the same ids replaces it (the shards its old
  // chain touched and the new one does not forget it). Busy past a limit,
  // with what to do in the message.
  Status Add(ConnectionId connection, const NamespaceFingerprint& ns, uint64_t request, std::span<const BlockKey> chain,
             uint64_t start_us, uint64_t conversation);
  // The request left the queue: the shards' policies forget it. NotFound
  // when it is not queued.
  Status Remove(ConnectionId connection, uint64_t request);
  // Every request of `connection` leaves the queue (its connection closed).
  void DropConnection(ConnectionId connection);
  // A conversation opened or closed: told to every shard's policy.
  void SetConversation(uint64_t conversation, bool open);

  // A queued request as the prefetcher plans with it (a copy).
  struct Queued {
    uint64_t id = 0;  // engine-wide, what the policies know it by
    NamespaceFingerprint ns;
    std::vector<BlockKey> chain;
    uint64_t start_us = 0;
  };
  // The `n` requests expected to start first (ties: first queued first),
  // soonest first. Copies only those chains.
  std::vector<Queued> Earliest(size_t n) const;
  // Whether a queued request's chain names `key`. Takes only a leaf lock:
  // callable under any lock (a tier asks from under its own).
  bool Needs(const BlockKey& key) const { return keys_.Contains(key); }
  size_t size() const;

 private:
  struct Request {
    uint64_t id = 0;
    std::vector<size_t> shards;  // those holding a part of its chain
    NamespaceFingerprint ns;
    std::vector<BlockKey> chain;
    uint64_t start_us = 0;
  };
  // What each connection holds in requests_: requests and chain keys.
  struct PerConnection {
    size_t requests = 0;
    size_t keys = 0;
  };
  // The shards' policies forget `request` (its id) and its keys go.
  void Forget(const Request& request) REQUIRES(mu_);

  const std::vector<std::unique_ptr<BlockIndex>>& shards_;
  const Limits limits_;
  QueuedKeys keys_;
  mutable Mutex mu_;
  std::map<std::pair<ConnectionId, uint64_t>, Request> requests_ GUARDED_BY(mu_);
  std::unordered_map<ConnectionId, PerConnection> per_connection_ GUARDED_BY(mu_);
  uint64_t next_id_ GUARDED_BY(mu_) = 1;
};

}  // namespace kvtier

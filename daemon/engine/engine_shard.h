// EngineShard: one slice of the engine's index and its policy instance.
// A plain record guarded by `mu`, with the helpers below that keep its maps
// consistent (engine_shard.cc); the logic lives in Engine (engine.cc,
// engine_tiers.cc, engine_queue.cc), which never holds two shard locks at
// once.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "daemon/engine/block_entry.h"
#include "daemon/engine/engine.h"
#include "daemon/engine/lease_table.h"
#include "kvtier/block_key.h"
#include "policy/eviction_policy.h"
#include "tiers/host/host_tier.h"

namespace kvtier {

// One PinAsync call: its grants fill in as keys resolve; the last key to
// resolve (outstanding reaches 0) runs `done`.
struct PinBatch {
  ConnectionId connection = 0;
  std::vector<PinGrant> grants;
  // With on_resolve (a load): waiting[i] says key i was not settled
  // inline (it waits for a promotion, a demotion or a layer read) and
  // resolves through Resolve. Empty otherwise.
  std::vector<bool> waiting;
  std::atomic<int> outstanding{1};  // keys in flight + 1 for the call itself
  // Whole-block grants carry every layer's checksum (a load that verifies).
  bool with_layers = false;
  Engine::PinDone done;
  // Runs as each waiting key resolves, before `done` (a layer-wise load
  // follows its blocks one by one). Called with no shard lock held.
  std::function<void(size_t index, const PinGrant& grant)> on_resolve;
};

// A PinAsync call waiting for a block being promoted: slot `index` of `batch`.
struct PromotionWaiter {
  std::shared_ptr<PinBatch> batch;
  size_t index = 0;
};


struct EngineShard {
  // `first_lease` starts the shard's lease numbers (LeaseTable).
  EngineShard(size_t shard_index, uint64_t first_lease, std::unique_ptr<EvictionPolicy> p)
      : leases(shard_index, first_lease), policy(std::move(p)) {}

  std::mutex mu;
  // All members below are guarded by mu.
  std::unordered_map<BlockKey, BlockEntry> index;
  // Blocks erased while pinned: invisible, freed when the last lease goes.
  std::unordered_map<BlockHandle, BlockEntry> zombies;
  // Committed blocks by handle (what the policy names as victims).
  std::unordered_map<BlockHandle, BlockKey> committed;
  LeaseTable leases;
  // Each connection's reservations (kReserved entries it wrote).
  std::unordered_map<ConnectionId, std::unordered_set<BlockKey>> reserved;
  // Pins waiting per block being promoted.
  std::unordered_map<BlockKey, std::vector<PromotionWaiter>> promotion_waiters;
  // Blocks evicted to NVMe whose write is still in flight (in neither
  // tier's index meanwhile); pins of them wait and retry when it ends.
  struct Demoting {
    NamespaceFingerprint ns;
    size_t level = 0;  // the tier below being written
    // kDemoting, or kErasedWhileDemoting once an Erase came: nothing of it may stay.
    BlockState state = BlockState::kDemoting;
    std::vector<std::function<void()>> waiters;
  };
  std::unordered_map<BlockKey, Demoting> demoting;
  std::unique_ptr<EvictionPolicy> policy;  // tracks committed blocks; pins via OnPin/OnUnpin
  uint64_t stored_bytes = 0;               // sizes of committed blocks
  uint64_t prefetched_bytes = 0;           // sizes of entries with `prefetched` (being read or resident)
};


inline void Bump(std::atomic<int64_t>& counter, int64_t by = 1) {
  counter.fetch_add(by, std::memory_order_relaxed);
}

// Resolves one key of a batch; the last one to resolve completes it.
inline void Resolve(const std::shared_ptr<PinBatch>& batch, size_t index, PinGrant grant) {
  batch->grants[index] = std::move(grant);
  if (batch->on_resolve) batch->on_resolve(index, batch->grants[index]);
  if (batch->outstanding.fetch_sub(1, std::memory_order_acq_rel) == 1) batch->done(std::move(batch->grants));
}

// Each helper below runs with shard.mu held.

// Removes `key`'s reservation by `connection` from `shard`, freeing its space.
// Returns false if there was no such reservation.
bool DropReservation(EngineShard& shard, HostTier& host, ConnectionId connection, const BlockKey& key);
// Forgets `key` among `connection`'s reservations (committed or dropped).
void EndReservation(EngineShard& shard, ConnectionId connection, const BlockKey& key);
// Drops one pin of the block `lease` refers to, freeing a zombie when its
// last pin goes. The caller has removed the lease record. Returns the bytes
// of a transient layer read it freed (to return to the engine's pool), else 0.
uint64_t Unpin(EngineShard& shard, HostTier& host, const LeaseRecord& lease, uint64_t now_us);
// Makes the just-committed `entry` of `key` visible to clients' directory
// reads (when the host tier has a directory).
void Publish(HostTier& host, const BlockKey& key, BlockEntry& entry);
// Takes the committed `entry` of `key` out of the directory. Must run before
// its extent is freed or can be reused (the directory's extent-safety rule).
void Withdraw(HostTier& host, const BlockKey& key, BlockEntry& entry);
// A prefetched block was used or leaves: its bytes stop counting against
// the prefetch budget. Returns whether it was prefetched.
bool EndPrefetched(EngineShard& shard, BlockEntry& entry);
// Removes the committed block `key` (evicted or erased); a pinned one
// becomes a zombie.
void RemoveCommitted(EngineShard& shard, HostTier& host, std::unordered_map<BlockKey, BlockEntry>::iterator it);

}  // namespace kvtier

// BlockIndex: one shard of the host tier's index, where every block
// changes state (block_index.cc), and the records of a pin in flight
// (PinBatch, PromotionWaiter) that its promotions wake.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/mutex.h"
#include "daemon/engine/block_entry.h"
#include "daemon/engine/block_events.h"
#include "daemon/engine/quarantine.h"
#include "daemon/engine/engine_types.h"
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
  PinDone done;
  // Runs as each waiting key resolves, before `done` (a layer-wise load
  // follows its blocks one by one). Called with no shard lock held.
  std::function<void(size_t index, const PinGrant& grant)> on_resolve;
};

// A PinAsync call waiting for a block being promoted: slot `index` of `batch`.
struct PromotionWaiter {
  std::shared_ptr<PinBatch> batch;
  size_t index = 0;
};

// The shard of `shard_count` that holds `key`.
inline size_t ShardIndexOf(const BlockKey& key, size_t shard_count) { return std::hash<BlockKey>{}(key) % shard_count; }

// One shard of the host tier's block index: its blocks (BlockEntry) by key,
// its leases, reservations, promotions' waiters and demotions in flight,
// and the eviction policy instance that ranks its committed blocks.
//
// Every change of a block's BlockState is a method of this class
// (block_index.cc), and each checks that the block is in the state the
// diagram in block_entry.h says it leaves (KVTIER_CHECK: a broken
// invariant, not an error); BlockEntry::state() is read-only elsewhere.
// The maps are readable by the engine for lookups and for fields other
// than the state (hits, checksums).
//
// Not thread-safe: every member and method needs `mu` held. Engine never
// holds two shards' locks at once, and takes a shard's lock before the
// host tier's (a leaf).
class BlockIndex {
 public:
  using Entries = std::unordered_map<BlockKey, BlockEntry>;
  // `first_lease` starts the shard's lease numbers (LeaseTable); `host`
  // (borrowed, outlives the index) owns the extents its blocks hold.
  // `events` (borrowed, outlives the index; may be null) hears each block
  // that becomes visible or stops being so (block_events.h).
  // `quarantine` (borrowed, outlives the index; may be null): the host
  // tier's (quarantine.h), whose key a block that becomes visible leaves.
  BlockIndex(size_t shard_index, uint64_t first_lease, std::unique_ptr<EvictionPolicy> p, HostTier& host,
             const EventTap* events = nullptr, Quarantine* quarantine = nullptr)
      : leases(shard_index, first_lease), policy(std::move(p)), host_(host), events_(events), quarantine_(quarantine) {}

  Mutex mu;
  // The members below are guarded by mu, and every method needs it held.
  Entries index GUARDED_BY(mu);
  // Blocks erased while pinned: invisible, freed when the last lease goes.
  std::unordered_map<BlockHandle, BlockEntry> zombies GUARDED_BY(mu);
  // Committed blocks by handle (what the policy names as victims).
  std::unordered_map<BlockHandle, BlockKey> committed GUARDED_BY(mu);
  LeaseTable leases GUARDED_BY(mu);
  // Each connection's reservations (kReserved entries it wrote).
  std::unordered_map<ConnectionId, std::unordered_set<BlockKey>> reserved GUARDED_BY(mu);
  // Pins waiting per block being promoted.
  std::unordered_map<BlockKey, std::vector<PromotionWaiter>> promotion_waiters GUARDED_BY(mu);
  // Blocks evicted to a tier below whose write is still in flight (in
  // neither tier's index meanwhile); pins of them wait and retry when it
  // ends.
  class Demoting {
   public:
    NamespaceFingerprint ns;
    size_t level = 0;    // the tier below being written
    uint64_t bytes = 0;  // the block's (its entry's size)
    std::vector<std::function<void()>> waiters;
    // kDemoting, or kErasedWhileDemoting once an Erase came: nothing of it may stay.
    BlockState state() const { return state_; }

   private:
    friend class BlockIndex;
    BlockState state_ = BlockState::kDemoting;
  };
  std::unordered_map<BlockKey, Demoting> demoting GUARDED_BY(mu);
  std::unique_ptr<EvictionPolicy> policy GUARDED_BY(mu)
      PT_GUARDED_BY(mu);                         // tracks committed blocks; pins via OnPin/OnUnpin
  uint64_t stored_bytes GUARDED_BY(mu) = 0;      // sizes of committed blocks
  uint64_t prefetched_bytes GUARDED_BY(mu) = 0;  // sizes of entries with `prefetched` (being read or resident)

  // --- Transitions (block_entry.h's diagram), each with mu held. ---

  // (none) -> kReserved: claims `key` for `connection`'s write of `size`
  // bytes under `ns` (no extent yet). AlreadyExists, saying what holds
  // the key, when the index has it in any state.
  Status Reserve(const BlockKey& key, const NamespaceFingerprint& ns, uint64_t size, ConnectionId connection)
      REQUIRES(mu);
  // kReserved -> (none): drops `connection`'s reservation of `key`, freeing
  // its extent if it has one. False when there is no such reservation.
  bool DropReservation(ConnectionId connection, const BlockKey& key) REQUIRES(mu);
  // Every reservation of `connection` -> (none) (its connection closed).
  void DropReservations(ConnectionId connection) REQUIRES(mu);
  // kReserved -> kCommitted: publishes `connection`'s written block `it`
  // with its checksums under policy handle `handle`.
  void CommitReserved(Entries::iterator it, ConnectionId connection, uint64_t checksum,
                      std::vector<uint64_t> layer_checksums, BlockHandle handle, uint64_t now_us) REQUIRES(mu);
  // (none) -> kCommitted: a kept arena's block, its bytes verified
  // (adopter.h), with its journal slot and `layer_checksums` (empty, or
  // one per layer). False, changing nothing, when the index already has
  // the key (the caller gives the block back: HostTier::FreeAdopted).
  bool CommitAdopted(const AdoptedBlock& block, std::vector<uint64_t> layer_checksums, BlockHandle handle,
                     uint64_t now_us) REQUIRES(mu);
  // kCommitted | kPinned -> kPinned: one more pin of `entry` of `key` for
  // `connection`, a use (hits, recency). Returns the lease; *was_prefetched
  // says the pin was the first use of a prefetched block.
  LeaseId Pin(const BlockKey& key, BlockEntry& entry, ConnectionId connection, uint64_t now_us, bool* was_prefetched)
      REQUIRES(mu);
  // kPinned -> kCommitted at its last pin, or a zombie's pin dropped (freed
  // at its last): one pin of the block `lease` refers to. The caller has
  // removed the lease record. Returns the bytes of a transient layer read
  // it freed (to return to the engine's pool), else 0.
  uint64_t Unpin(const LeaseRecord& lease, uint64_t now_us) REQUIRES(mu);
  // (none) -> kPromoting: claims `key` for a read of its `size` bytes from
  // a tier below (a pin's promotion, or a prefetch when `prefetched`).
  // Precondition: the index has no entry of `key`.
  BlockEntry& BeginPromotion(const BlockKey& key, const NamespaceFingerprint& ns, uint64_t size, bool prefetched)
      REQUIRES(mu);
  // kPromoting -> kCommitted: the read landed in `extent`, verified.
  void CommitPromoted(Entries::iterator it, HostTier::Extent extent, uint64_t checksum,
                      std::vector<uint64_t> layer_checksums, BlockHandle handle, uint64_t now_us) REQUIRES(mu);
  // kPromoting | kErasedWhilePromoting -> (none): the read failed or the
  // block was erased meanwhile; `extent` (if allocated) is freed.
  void FailPromotion(Entries::iterator it, HostTier::Extent extent) REQUIRES(mu);
  // kPromoting -> kErasedWhilePromoting (an Erase during the read).
  void EraseWhilePromoting(Entries::iterator it) REQUIRES(mu);
  // kCommitted | kPinned -> (none), or kErasedWhilePinned when pinned:
  // the block `it` is evicted or erased; its extent is freed unless pinned.
  void RemoveCommitted(Entries::iterator it) REQUIRES(mu);
  // kCommitted -> kDemoting: the victim `it` leaves the index for tier
  // `level` below; its entry is returned so the caller can copy its bytes
  // out before freeing its extent (the caller frees it).
  BlockEntry BeginDemotion(Entries::iterator it, size_t level) REQUIRES(mu);
  // kDemoting -> kErasedWhileDemoting (an Erase during the write).
  void EraseWhileDemoting(std::unordered_map<BlockKey, Demoting>::iterator it) REQUIRES(mu);
  // kDemoting | kErasedWhileDemoting -> (none): the write ended; returns
  // the record (its waiters, whether it was erased), if there was one.
  std::optional<Demoting> EndDemotion(const BlockKey& key) REQUIRES(mu);
  // (none) -> kLayerRead: a layer-range read of `key` landed in `extent`
  // (`bytes` long); held by one lease of `connection`, returned.
  LeaseId AddLayerRead(const BlockKey& key, HostTier::Extent extent, uint64_t bytes, BlockHandle handle,
                       ConnectionId connection) REQUIRES(mu);

  // A prefetched block was used or leaves: its bytes stop counting against
  // the prefetch budget. Returns whether it was prefetched.
  bool EndPrefetched(BlockEntry& entry) REQUIRES(mu);

 private:
  // Forgets `key` among `connection`'s reservations (committed or dropped).
  void EndReservation(ConnectionId connection, const BlockKey& key) REQUIRES(mu);
  // `entry` of `key` becomes kCommitted under `handle`: the policy, the
  // committed map and the byte count learn of it and the directory shows
  // it. The one way into kCommitted (CommitReserved, CommitPromoted).
  void Insert(const BlockKey& key, BlockEntry& entry, BlockHandle handle, uint64_t now_us) REQUIRES(mu);
  // Makes the just-committed `entry` of `key` visible to clients' directory
  // reads (when the host tier has a directory).
  void Publish(const BlockKey& key, BlockEntry& entry) REQUIRES(mu);
  // Takes the committed `entry` of `key` out of the directory. Must run
  // before its extent is freed or can be reused.
  void Withdraw(const BlockKey& key, BlockEntry& entry) REQUIRES(mu);

  HostTier& host_;
  const EventTap* const events_;
  Quarantine* const quarantine_;
};

// Resolves one key of a batch; the last one to resolve completes it.
inline void Resolve(const std::shared_ptr<PinBatch>& batch, size_t index, PinGrant grant) {
  batch->grants[index] = std::move(grant);
  if (batch->on_resolve) batch->on_resolve(index, batch->grants[index]);
  if (batch->outstanding.fetch_sub(1, std::memory_order_acq_rel) == 1) batch->done(std::move(batch->grants));
}

// The shard of `shards` that holds `key`.
inline BlockIndex& ShardOf(const std::vector<std::unique_ptr<BlockIndex>>& shards, const BlockKey& key) {
  return *shards[ShardIndexOf(key, shards.size())];
}

}  // namespace kvtier

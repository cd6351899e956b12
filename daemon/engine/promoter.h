// Promoter: moves blocks up from the tiers below (or the tier above) into
// the host arena. Promote reads a whole block a pin or a prefetch claimed
// (a kPromoting entry, BlockIndex::BeginPromotion) into new arena space;
// FinishPromotion commits it in its shard (BlockIndex::CommitPromoted)
// and pins it for every pin that waited, or fails it (its space freed,
// the waiters get the failure). ReadLayers reads a layer range of a block
// into transient arena space that one lease owns (BlockIndex::
// AddLayerRead); the block is not promoted.
//
// The tier reading a block verifies it (BlockTier::Read's contract): a
// read that does not verify (Corruption), or fails otherwise, is a miss
// for the waiters (NotFound, saying why); NoSpace (no arena room) and
// Busy are not misses and pass as they are. A read the tier answers
// NotFound (it no longer holds the block: its reclaim handed the block to
// the tier under it between the pin's find and the read) is followed
// down: when a lower tier holds the block now, the promotion reads it
// from there instead (engine.promotions_followed_down), on the retry
// scheduler, never on the tier's completion thread; a layer read the same
// way (engine.layer_reads_followed_down). A tier out of read staging
// (a Busy start) is tried again kPromotionRetryPauseUs later on the
// retry scheduler, on the injected clock, until kPromotionBusyWaitUs from
// the first try (engine.promotion_retries each); then, or when the retry
// queue is full, the waiters get Busy. A layer read fails as the
// promotion does; one that would take the transient pool past
// `layer_read_pool_bytes` is Busy at once (engine.layer_reads_busy).
//
// Each promotion and layer read counts as I/O in flight from its start to
// its end (Hooks::io_started / io_finished), and so does each retry
// waiting for its time, so the engine's WaitForIdle covers them.
//
// Thread-safe, and no thread of its own: it runs on the caller's thread,
// the tiers' completion threads and the retry scheduler's. It takes one
// shard lock at a time and never holds one across I/O or a hook other
// than `pin` and `next_handle`; the transient pool is an atomic.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "common/clock.h"
#include "common/retry_scheduler.h"
#include "daemon/engine/engine_counters.h"
#include "daemon/engine/engine_levels.h"
#include "daemon/engine/engine_types.h"
#include "kvtier/block_key.h"
#include "kvtier/result.h"
#include "policy/eviction_policy.h"
#include "tiers/host/host_tier.h"

namespace kvtier {

class BlockIndex;
struct PinBatch;

class Promoter {
 public:
  struct Hooks {
    // I/O in flight: one io_started before each promotion, layer read or
    // waiting retry, one io_finished after its end.
    std::function<void()> io_started, io_finished;
    // `bytes` of arena space, evicting to make room (Evictor::Allocate);
    // NoSpace when there is none.
    std::function<Result<HostTier::Extent>(uint64_t bytes)> allocate;
    // The record of the level a Located names (a tier below, or the tier
    // above the host); it outlives the Promoter.
    std::function<TierLevel&(size_t level)> source;
    // The highest tier below the host holding `key` under `ns`, now
    // (Engine::FindBelow); called with no lock held.
    std::function<std::optional<Located>(const BlockKey& key, const NamespaceFingerprint& ns)> find_below;
    // Pins the committed block `key` of `shard` for `connection` (every
    // layer's checksum when `with_layers`), as any pin of a host block;
    // called with the shard's lock held (Pinner::PinLocked).
    std::function<PinGrant(BlockIndex& shard, ConnectionId connection, const BlockKey& key, uint64_t now_us,
                           bool with_layers)>
        pin;
    // How many layers a block of `size` bytes of `ns` has (its namespace's
    // layout; 1 for another size). Called with no lock held.
    std::function<uint32_t(const NamespaceFingerprint& ns, uint64_t size)> layer_count;
    // A fresh handle for a block entering the index (a policy handle, or a
    // layer read's zombie entry); called with a shard's lock held, so it
    // takes no lock.
    std::function<BlockHandle()> next_handle;
    // The read of a prefetched block ended (`landed`: committed); called
    // with no lock held.
    std::function<void(bool landed)> prefetch_read_ended;
  };
  static constexpr uint64_t kPromotionBusyWaitUs = 2'000'000;
  static constexpr uint64_t kPromotionRetryPauseUs = 1'000;

  // Every reference is borrowed and outlives the Promoter: the shards of
  // the host tier's index, the arena they hold, the clock and the retry
  // scheduler (stopped, and its jobs run, before the Promoter goes).
  Promoter(const std::vector<std::unique_ptr<BlockIndex>>& shards, HostTier& host, const Clock& clock,
           RetryScheduler& retries, uint64_t layer_read_pool_bytes, EngineCounters& counters, Hooks hooks);
  Promoter(const Promoter&) = delete;
  Promoter& operator=(const Promoter&) = delete;

  // Reads the block `key` claimed for promotion (kPromoting) from the tier
  // it was found in, `from`, into new arena space, then ends the
  // promotion with FinishPromotion. A Busy tier is retried until
  // `deadline_us` on the clock; the first overload allows
  // kPromotionBusyWaitUs from now. No lock held on entry.
  void Promote(const BlockKey& key, const Located& from);
  void Promote(const BlockKey& key, const Located& from, uint64_t deadline_us);
  // Ends the promotion of `key` with the read's `status`: ok commits the
  // bytes at `extent` (its whole checksum `checksum`; `layer_checksums`,
  // of the layers the tier verified, kept when they fit the namespace's
  // layout) and pins it for each waiter (engine.promotions); else, or
  // when the block was erased meanwhile (NotFound), the entry goes,
  // `extent` (if any) is freed and each waiter gets the failure
  // (engine.promotion_failures, engine.pin_misses). Ends one io_started.
  void FinishPromotion(const BlockKey& key, Status status, HostTier::Extent extent, uint64_t checksum,
                       std::vector<uint64_t> layer_checksums = {});
  // Reads `layers` of `key` from `from` into transient arena space and
  // resolves slot `index` of `batch` with a lease of `batch`'s connection
  // on it (engine.pins, engine.layer_reads), with the tier's checksum of
  // each layer; Busy when the transient pool is full; NoSpace, Busy or
  // NotFound as a promotion fails. No lock held on entry.
  void ReadLayers(const std::shared_ptr<PinBatch>& batch, size_t index, const BlockKey& key, const Located& from,
                  LayerSpan layers);

  // The transient pool: TakeTransient takes `bytes` (false: the pool
  // would go past its size); EndTransient gives them back (a layer read's
  // lease ended: BlockIndex::Unpin's answer, 0 for anything else).
  bool TakeTransient(uint64_t bytes);
  void EndTransient(uint64_t bytes);
  // Bytes layer reads hold now (engine.layer_read_pool_bytes).
  uint64_t transient_bytes() const { return transient_bytes_.load(std::memory_order_relaxed); }

 private:
  BlockIndex& ShardFor(const BlockKey& key) const;
  // The layer checksums of a promotion of `key` to record: kept when they
  // are one per layer of its namespace's layout, else none.
  std::vector<uint64_t> FittingLayerChecksums(const BlockKey& key, std::vector<uint64_t> layer_checksums);
  // A whole-block read from `from` ended with a failure `status` (its
  // arena space `extent`): a NotFound is followed down, anything else (or
  // a block no lower tier holds) ends the promotion.
  void EndRead(const BlockKey& key, const Located& from, uint64_t deadline_us, Status status, HostTier::Extent extent);
  // Starts a promotion of `key` from a tier under `from` that holds it
  // now; false when none does (or the retry queue is full).
  bool FollowDown(const BlockKey& key, const Located& from, uint64_t deadline_us);
  // ReadLayers' FollowDown: when a lower tier than `from` holds the block,
  // gives back this attempt's `extent` and pool share and reads the layers
  // from there (on the retry scheduler); true when it took the read over
  // (a full retry queue then resolves it Busy).
  bool FollowLayersDown(const std::shared_ptr<PinBatch>& batch, size_t index, const BlockKey& key, const Located& from,
                        LayerSpan layers, HostTier::Extent extent);

  const std::vector<std::unique_ptr<BlockIndex>>& shards_;
  HostTier& host_;
  const Clock& clock_;
  RetryScheduler& retries_;
  const uint64_t layer_read_pool_bytes_;
  std::atomic<uint64_t> transient_bytes_{0};  // layer reads' arena bytes held now
  EngineCounters& counters_;
  const Hooks hooks_;
};

}  // namespace kvtier

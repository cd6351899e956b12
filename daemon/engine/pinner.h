// Pinner: hands out leases on blocks (pins), ends them (Release) and
// counts the uses clients report after the fact (RecordUses).
//
// A pin claims its keys one shard lock at a time (ClaimPins): a committed
// host block of the namespace is pinned at once (a lease, BlockIndex::Pin);
// a key whose demotion is still being written waits for it to end and is
// pinned again then (RetryPin, from the demotion's waiters); a key being
// promoted waits for that promotion; a block found only outside the host
// tier (Hooks::find_outside) is claimed for promotion (BlockIndex::
// BeginPromotion), and the Promoter reads it, commits it and pins it for
// every pin that waited. With a layer span, a host block's grant covers
// only those layers in place; a block found only outside has just those
// layers read into transient space owned by the lease (Promoter::
// ReadLayers). Everything else is a miss (NotFound).
//
// Thread-safe, and no thread of its own: it runs on the caller's thread
// and, for waiting keys, on the threads that end a demotion or a read. It
// takes one shard lock at a time and never holds one across I/O; under a
// shard lock it calls only the hooks find_outside, layer_count and
// note_prefetch_use, which take leaf locks (the tiers', the namespace
// registry's) or none.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "common/clock.h"
#include "daemon/engine/block_index.h"
#include "daemon/engine/engine_counters.h"
#include "daemon/engine/engine_levels.h"
#include "daemon/engine/engine_types.h"
#include "daemon/engine/promoter.h"
#include "kvtier/block_key.h"
#include "kvtier/result.h"

namespace kvtier {

struct BlockEntry;

class Pinner {
 public:
  using PinDone = ::kvtier::PinDone;
  struct Hooks {
    // Where a key missing from the host tier is read from (the tier above
    // if it holds it, else the highest tier below: Engine::FindOutside).
    // Called under a shard lock: takes only the tiers' leaf locks.
    std::function<std::optional<Located>(const BlockKey& key, const NamespaceFingerprint& ns)> find_outside;
    // How many layers a block of `size` bytes of `ns` has (its namespace's
    // layout; 1 for another size). Called under a shard lock.
    std::function<uint32_t(const NamespaceFingerprint& ns, uint64_t size)> layer_count;
    // Lets the tiers that probe (Prober::Probe) learn of `keys`, which no
    // tier knows. Null when no tier of the stack probes. No lock held.
    std::function<void(const NamespaceFingerprint& ns, std::span<const BlockKey> keys)> probe;
    // A prefetched block was used (Prefetcher::NoteUse). Called under a
    // shard lock; takes no lock.
    std::function<void()> note_prefetch_use;
    // A pin or a use report ended: prefetch may plan again if a
    // prefetched block was used (Prefetcher::TakeUse). No lock held.
    std::function<void()> uses_noted;
  };

  // Every reference is borrowed and outlives the Pinner: the shards of the
  // host tier's index, the clock, the promoter and the counters.
  Pinner(const std::vector<std::unique_ptr<BlockIndex>>& shards, const Clock& clock, Promoter& promoter,
         EngineCounters& counters, Hooks hooks);
  Pinner(const Pinner&) = delete;
  Pinner& operator=(const Pinner&) = delete;

  // Pins committed blocks and hands out one lease per block, promoting
  // blocks found only outside the host tier into it first. Per key: ok,
  // NotFound (a miss, also when a promotion read fails or does not
  // verify), NoSpace (no arena room for a promotion). A pin is a use
  // (recency, hits). `done` runs exactly once: inline when no key needed
  // I/O, else on the thread that settled the last key.
  //
  // With a layer span (not whole), each grant covers only those layers: a
  // host block's bytes in place; for a block found only below, only those
  // layers are read, into transient arena space owned by the lease (freed
  // at Release; the block is not promoted). Such grants carry the
  // checksums of their layers (PinGrant::layer_checksums) when they are
  // known (a block read from below: always; a host block: when its writer
  // sent them or it was promoted), and for a host block the whole block's
  // checksum and place. Also InvalidArgument per key when the span is not
  // within the block's layers.
  void PinAsync(ConnectionId connection, const NamespaceFingerprint& ns, std::vector<BlockKey> keys, PinDone done,
                LayerSpan layers = {});
  // PinAsync, waiting for the outcome.
  std::vector<PinGrant> Pin(ConnectionId connection, const NamespaceFingerprint& ns, std::span<const BlockKey> keys,
                            LayerSpan layers = {});

  // Per lease: ok, NotFound (unknown or already released), PermissionDenied
  // (held by another connection: it stays held). A layer read's transient
  // space goes back to the promoter's pool at its lease's end.
  std::vector<Status> Release(ConnectionId connection, std::span<const LeaseId> leases);
  // A closing connection's hold on the host tier ends, in one walk over
  // the shards (one lock at a time): its reservations, never committed
  // (the Writer's: their space returns to the arena), and its leases, each
  // ended as Release ends it. Not counted as releases.
  void EndConnection(ConnectionId connection);

  // Uses clients made of host blocks through the block directory, reported
  // after the fact: each block of `keys` still committed under `ns` counts
  // a use (recency, hits), the others (evicted, erased, another
  // namespace's, not yet committed) are skipped. Returns how many counted
  // (engine.directory_uses; the rest engine.directory_stale_uses).
  size_t RecordUses(const NamespaceFingerprint& ns, std::span<const BlockKey> keys);

  // The steps of a pin, for the engine's other pins (loads, holds, the
  // corruption check), which start the claimed reads themselves.
  //
  // Pins the committed entry of `key` for `connection`, with every layer's
  // checksum when `with_layers`. The caller holds `shard.mu`.
  PinGrant PinLocked(BlockIndex& shard, ConnectionId connection, const BlockKey& key, uint64_t now_us,
                     bool with_layers = false) REQUIRES(shard.mu);
  // Lets the tiers that probe learn of the keys no tier knows, before a
  // pin claims them. No lock held.
  void ProbeUnknown(const NamespaceFingerprint& ns, std::span<const BlockKey> keys);
  // Settles every key of `keys` it can inline into `batch` (host hits,
  // misses, bad spans) and counts in batch->outstanding those that wait
  // for a promotion, a demotion or a layer read; returns the promotions
  // and layer reads it claimed, for the caller to start. With
  // batch->on_resolve, batch->waiting says which keys wait.
  PinClaims ClaimPins(const std::shared_ptr<PinBatch>& batch, const NamespaceFingerprint& ns,
                      std::span<const BlockKey> keys, LayerSpan layers);
  // Ends the claiming of `batch`, once the claimed reads started: runs its
  // `done` unless a key still waits, and lets prefetch plan again if a
  // prefetched block was used (Hooks::uses_noted). No lock held.
  void EndClaims(const std::shared_ptr<PinBatch>& batch);

  // The checksums of layers [first, last) of `entry`, a block of
  // `layer_count` layers (for one layer: its whole checksum); empty when
  // the block has none recorded or the range is not within its layers.
  static std::vector<uint64_t> LayerChecksumsOf(const BlockEntry& entry, uint32_t layer_count, uint32_t first,
                                                uint32_t last);

 private:
  BlockIndex& ShardFor(const BlockKey& key) const;
  // PinAsync once its batch is made: claims, starts the reads, settles.
  void RunPins(const std::shared_ptr<PinBatch>& batch, const NamespaceFingerprint& ns, std::span<const BlockKey> keys,
               LayerSpan layers);
  // Pins `key` again for slot `index` of `batch` once its demotion ended.
  void RetryPin(const std::shared_ptr<PinBatch>& batch, size_t index, const BlockKey& key,
                const NamespaceFingerprint& ns, LayerSpan layers);

  const std::vector<std::unique_ptr<BlockIndex>>& shards_;
  const Clock& clock_;
  Promoter& promoter_;
  EngineCounters& counters_;
  const Hooks hooks_;
};

}  // namespace kvtier

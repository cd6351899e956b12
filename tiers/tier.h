// BlockTier: what every tier offers (host, NVMe, and the remote and test
// tiers). The engine keeps an ordered stack of them under the host tier and
// moves blocks between adjacent ones (daemon/engine/engine.h); it never names a
// concrete tier. The host tier, which the engine indexes itself, offers
// this face through Engine::host_tier() (daemon/engine/host_block_tier.h). A tier stores bytes
// and reports usage: it decides nothing (admission and eviction order are
// policies the engine runs, policy/).
//
// A block is `payload` bytes split into `layer_count` equal layers, stored
// layer-major under (namespace, key), with the xxh3-64 of its payload
// (common/checksum.h) recorded from the bytes the tier actually stored.
//
// The core below is what every tier offers and the engine uses on every
// level. What only some tiers offer is an optional capability, a small
// interface of its own (after BlockTier): probes (Prober), in-place holds
// (InPlaceHolds), reclaim hooks (ReclaimHooks: eviction sink and needed
// hint), protected shares (ReclaimShares) and kept per-namespace sums
// (NamespaceSums). A caller reaches one through its accessor on the core
// (prober(), ...), which answers nullptr for a tier that lacks it; a tier
// that has one answers the same non-null pointer for its whole life
// (usually itself), valid as long as the tier. Wrappers forward them all
// (tiers/forwarding_tier.h).
//
// Thread-safety: implementations are thread-safe; every method may be
// called from any thread. Completions (`WriteDone`, `ReadDone`) run exactly
// once, never inline, on a thread of the tier's own; they must not wait
// for tier resources (they are what frees them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/checksum.h"
#include "common/counters.h"
#include "common/health_findings.h"
#include "kvtier/block_key.h"
#include "kvtier/result.h"
#include "policy/share_guard.h"

namespace kvtier {

class Prober;
class InPlaceHolds;
class ReclaimHooks;
class ReclaimShares;
class NamespaceSums;

class BlockTier {
 public:
  virtual ~BlockTier() = default;

  // The prefix of this tier's counters and log lines ("nvme").
  virtual std::string_view name() const = 0;
  // Whether Write and Read complete on another thread after returning
  // (device or network I/O). A synchronous tier still calls `done` on a
  // thread of its own, never inline.
  virtual bool asynchronous() const = 0;
  virtual uint64_t capacity_bytes() const = 0;
  virtual uint64_t used_bytes() const = 0;
  // Bytes a block of `payload_bytes` takes on the medium (headers and
  // padding included): what admission charges a write budget.
  virtual uint64_t StoredBytes(uint64_t payload_bytes) const { return payload_bytes; }

  struct BlockInfo {
    NamespaceFingerprint ns;
    uint64_t payload_bytes = 0;
    uint32_t layer_count = 0;
    uint64_t payload_checksum = 0;  // xxh3-64 of the whole payload as stored
  };
  // The block stored under `key`, if it is readable now, as far as this
  // tier knows without I/O: Find is called under engine locks, so it never
  // waits for a device or the network.
  virtual std::optional<BlockInfo> Find(const BlockKey& key) const = 0;
  using WriteDone = std::function<void(Status)>;
  // Stores `payload` (layer-major, `layer_count` equal layers) under `key`;
  // the bytes are copied before Write returns. The tier records the
  // checksum of the bytes it stored; `payload_checksum`, when given, is
  // what the caller expects them to hash to, and a mismatch fails the write
  // with Corruption (nothing visible). Rejections (`done` never runs):
  // InvalidArgument (empty, uneven layers, too large), AlreadyExists
  // (stored or being stored), Busy (out of staging room now: retry later),
  // NoSpace (full), Unavailable or IoError. `done`: Ok once the block is
  // readable; otherwise nothing of it is visible.
  virtual Status Write(const NamespaceFingerprint& ns, const BlockKey& key, uint32_t layer_count,
                       std::span<const std::byte> payload, WriteDone done,
                       std::optional<uint64_t> payload_checksum = std::nullopt) = 0;

  using ReadDone = std::function<void(Result<size_t>)>;
  // Copies layers [first_layer, last_layer) of `key` into `dst` (borrowed
  // until `done` runs), verifying the checksums of the bytes it returns.
  // Rejections: NotFound, InvalidArgument (bad range, `dst` too small),
  // Busy. `done`: the bytes copied; NotFound (gone meanwhile), Corruption
  // (did not verify: the block is dropped, later reads miss), IoError.
  virtual Status Read(const BlockKey& key, uint32_t first_layer, uint32_t last_layer, std::span<std::byte> dst,
                      ReadDone done) = 0;

  // Read that also hands `done` the xxh3-64 of each layer it returned
  // (last_layer - first_layer of them, first_layer first), as the tier
  // verified the bytes: what a reader checks them against later (the
  // engine records them for promoted blocks and hands them to clients
  // with layer reads). Same rejections and outcomes as Read. The default
  // calls Read and hashes the layers of `dst` once they are in (one more
  // pass over them, on the tier's thread); a tier that stores per-layer
  // checksums (NVMe) hands out its own at no cost.
  struct LayerRead {
    size_t bytes = 0;
    std::vector<uint64_t> layer_checksums;
  };
  // Whether the tier stores per-layer checksums, so that
  // ReadWithLayerChecksums costs no more than Read (the engine asks for
  // them only then, or when a reader that verifies needs them).
  virtual bool keeps_layer_checksums() const { return false; }
  using LayerReadDone = std::function<void(Result<LayerRead>)>;
  virtual Status ReadWithLayerChecksums(const BlockKey& key, uint32_t first_layer, uint32_t last_layer,
                                        std::span<std::byte> dst, LayerReadDone done) {
    const uint32_t layers = last_layer > first_layer ? last_layer - first_layer : 0;
    return Read(key, first_layer, last_layer, dst, [dst, layers, done = std::move(done)](Result<size_t> read) {
      if (!read.ok()) return done(read.status());
      LayerRead out{*read, {}};
      if (layers > 0 && *read % layers == 0 && *read <= dst.size()) {
        const size_t layer_bytes = *read / layers;
        for (uint32_t i = 0; i < layers; ++i) {
          out.layer_checksums.push_back(BlockChecksum(dst.subspan(i * layer_bytes, layer_bytes)));
        }
      }
      done(std::move(out));
    });
  }

  // Calls `visit` for every block readable now, in no particular order
  // (what `kvtier ls` counts and `kvtier drop` erases). O(blocks), under
  // the tier's own lock: `visit` must not call the tier.
  using BlockVisitor = std::function<void(const BlockKey& key, const BlockInfo& info)>;
  virtual void ForEachBlock(const BlockVisitor& visit) const = 0;
  // What NamespaceSums and VisitNamespaceBytes (below) hand out.
  using NamespaceBytesVisitor = std::function<void(const NamespaceFingerprint& ns, uint64_t payload_bytes)>;
  // Forgets `key`; NotFound if it is neither stored nor being written. A
  // write of it in flight is cancelled and leaves nothing visible.
  virtual Status Erase(const BlockKey& key) = 0;

  // Bytes sent to the medium since open (headers and padding included),
  // and the part of them the tier wrote on its own (reinsertion), which no
  // admission decided. What a write budget counts.
  struct WriteTotals {
    uint64_t device_bytes = 0;
    uint64_t reinserted_bytes = 0;
  };
  virtual WriteTotals write_totals() const = 0;

  // Types the capabilities below use, kept here so that callers name them
  // as they always have (BlockTier::Evicted, ...).
  using NeededHint = std::function<bool(const BlockKey&)>;  // ReclaimHooks::SetNeededHint
  // A block this tier is about to drop to make room, offered to the tier
  // below it (ReclaimHooks::SetEvictionSink). `payload` is valid only
  // during the call and has been verified; `hits` counts reads since the
  // block was written here.
  struct Evicted {
    NamespaceFingerprint ns;
    BlockKey key;
    uint32_t layer_count = 0;
    uint64_t payload_checksum = 0;
    uint64_t hits = 0;
  };
  using EvictionSink = std::function<void(const Evicted& block, std::span<const std::byte> payload)>;
  using ShareOf = std::function<ShareOwner(const NamespaceFingerprint& ns)>;  // ReclaimShares::SetShares
  // Where InPlaceHolds::HoldInPlace holds a block.
  struct InPlace {
    uint64_t offset = 0;  // of the payload, layer-major, in the tier's exported memory
    BlockInfo info;
  };

  // The optional capabilities (see the top of this file): nullptr when the
  // tier lacks one, else the same pointer for the tier's whole life. Any
  // thread; no lock, no I/O.
  virtual Prober* prober() { return nullptr; }
  virtual InPlaceHolds* in_place_holds() { return nullptr; }
  virtual ReclaimHooks* reclaim_hooks() { return nullptr; }
  virtual ReclaimShares* reclaim_shares() { return nullptr; }
  virtual const NamespaceSums* namespace_sums() const { return nullptr; }

  // <name>.* counters.
  virtual void VisitCounters(CounterVisitor& visitor) const = 0;
  // Adds what is wrong with the tier to `out` (common/health_findings.h):
  // problems (it is failing: the daemon is not healthy) and warnings.
  // Any thread; its own lock at most, briefly, no I/O. A tier with
  // nothing to report keeps this default, which adds nothing.
  virtual void CheckHealth(HealthFindings& out) const {}
};

// Probes: for a tier whose contents change behind its back (the remote
// tier, which every node writes).
class Prober {
 public:
  // Learns which of `keys` (blocks of `ns`) the tier holds, so that its
  // Find answers for them. May do I/O, bounded by the tier's own deadline;
  // the engine calls it with no lock held, before it looks the keys up (a
  // Lookup's keys not found above). Any thread; returns nothing: a key it
  // could not learn about stays unknown (Find misses it).
  virtual void Probe(const NamespaceFingerprint& ns, std::span<const BlockKey> keys) = 0;

 protected:
  ~Prober() = default;  // not owned through this interface
};

// In-place holds: for a tier whose memory clients map themselves (the HBM
// tier's device pool, exported over CUDA IPC).
class InPlaceHolds {
 public:
  // Holds `key` where it is and says where. Its bytes stay there,
  // unchanged, until the matching ReleaseInPlace, even when the block is
  // erased or dropped meanwhile (the range is reused only after the last
  // release). Holds nest. Not counted as a read. Any thread, no I/O.
  // NotFound when the block is not readable now.
  virtual Result<BlockTier::InPlace> HoldInPlace(const BlockKey& key) = 0;
  // Ends one HoldInPlace of `key` that answered `offset`; a release that
  // matches no hold is ignored. Any thread.
  virtual void ReleaseInPlace(const BlockKey& key, uint64_t offset) = 0;

 protected:
  ~InPlaceHolds() = default;
};

// Reclaim hooks: for a tier that makes room on its own (the NVMe tier's
// region reclaim), so that its owner says where the blocks it drops go and
// which blocks it should keep.
class ReclaimHooks {
 public:
  // Installs where evicted blocks go (the engine, for the next tier down).
  // The sink is called on a thread of the tier's own with no tier lock
  // held; it must not wait for this tier. Empty clears it (and the tier
  // stops reading its victims back); the owner clears it before going
  // away. Any thread.
  virtual void SetEvictionSink(BlockTier::EvictionSink sink) = 0;
  // Installs whether a queued request needs `key` (the engine's queue
  // hints), for the tier's reclaim order. The hint is called with the
  // tier's lock held: it may take only leaf locks. Empty clears it; its
  // owner clears it before going away. Any thread.
  virtual void SetNeededHint(BlockTier::NeededHint needed) = 0;
  // Installs who hears of each block the tier drops on its own (a reclaimed
  // region's blocks, whether or not they were offered to the sink first; a
  // record found unreadable), for KV events: called with the tier's lock
  // held, so it may take only leaf locks; never for an Erase (its caller
  // knows). Empty clears it; its owner clears it before going away. Any
  // thread. A tier whose blocks never leave on their own keeps the default.
  using DropListener = std::function<void(const NamespaceFingerprint& ns, const BlockKey& key)>;
  virtual void SetDropListener(DropListener listener) {}

 protected:
  ~ReclaimHooks() = default;
};

// Protected shares: for a tier several owners share that reclaims on its
// own (the NVMe tier under tenants: daemon/tenants/tenant_tier.h,
// policy/share_guard.h). Shares change the tier for every owner: only the
// one that owns the tier as a whole (SharedTier) installs them, never a
// view of one owner.
class ReclaimShares {
 public:
  // `shares` says whose a block of namespace `ns` is and what that owner's
  // share is; the tier's reclaim then drops a block only when its owner
  // holds more than its share (the others are copied forward first), and a
  // write that would need room held by shares is NoSpace. `shares` is
  // called with the tier's lock held: it may take only leaf locks, and must
  // answer the same for a namespace until it is installed again
  // (installing re-reads every namespace). Empty clears it; its owner
  // clears it before going away. Any thread.
  virtual void SetShares(BlockTier::ShareOf shares) = 0;
  // The payload bytes the shares may add up to: what the tier can protect
  // while its reclaim keeps working (0: nothing). Any thread.
  virtual uint64_t shareable_bytes() const = 0;

 protected:
  ~ReclaimShares() = default;
};

// Kept per-namespace sums: for a tier that keeps, per namespace, the sum
// of its blocks' payload bytes, so that what scrapes read (Engine stats,
// metrics, per-tenant quotas) costs O(namespaces), not O(blocks).
class NamespaceSums {
 public:
  // Calls `visit` once per namespace with blocks readable now, with the
  // sum of their payload bytes, from the kept sums: it never walks the
  // blocks. Under the tier's own lock: `visit` must not call the tier.
  virtual void ForEachNamespaceBytes(const BlockTier::NamespaceBytesVisitor& visit) const = 0;

 protected:
  ~NamespaceSums() = default;
};

// Calls `visit` once per namespace with blocks readable in `tier` now,
// with the sum of their payload bytes (what per-tenant quotas count,
// daemon/tenants/tenant_tier.h): the tier's NamespaceSums when it has
// them, O(namespaces); else one ForEachBlock pass, O(blocks). Same locking
// rule as ForEachBlock: `visit` must not call the tier.
inline void VisitNamespaceBytes(const BlockTier& tier, const BlockTier::NamespaceBytesVisitor& visit) {
  if (const NamespaceSums* sums = tier.namespace_sums()) return sums->ForEachNamespaceBytes(visit);
  std::unordered_map<NamespaceFingerprint, uint64_t> walked;
  tier.ForEachBlock(
      [&walked](const BlockKey&, const BlockTier::BlockInfo& info) { walked[info.ns] += info.payload_bytes; });
  for (const auto& [ns, bytes] : walked) visit(ns, bytes);
}

}  // namespace kvtier

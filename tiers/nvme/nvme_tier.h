// NvmeTier: blocks on a local drive. Records (block_record.h) are appended
// log-structured into regions (region_manager.h) through a BlockDevice,
// staged in registered aligned memory (staging_pool.h), and indexed in
// memory and in RocksDB (nvme_index.h) so they survive a restart.
//
// Guarantees:
// - A block is readable (and indexed) only after its record's write
//   completed; a failed or short write leaves nothing visible.
// - Every read checks the record header (key, generation, geometry) and the
//   checksums of the bytes it returns; a mismatch is a miss, counted, and
//   the entry is dropped. No fault makes it return a wrong byte.
// - Open() reloads the index, drops entries whose region was reused since
//   (generation mismatch), and fully verifies every record of the region
//   that was open when the daemon stopped (the only one a crash can tear).
// - ENOSPC marks the tier full: writes fail fast with NoSpace for
//   full_retry, then one write probes again; success clears it.
//
// The tier implements BlockTier (tiers/tier.h) with three of its
// capabilities: ReclaimHooks, ReclaimShares and NamespaceSums (kept per
// namespace as entries come and go, so a scrape is O(namespaces) and takes
// the tier's lock once); what follows adds to that contract. With an eviction sink installed, the blocks of the region
// that reclaim takes next are read back (verified) when the last free region opens, and those reinsertion does not keep
// are offered to the sink while they are still readable here.
//
// With shares installed (SetShares: tenants, daemon/tenants/tenant_tier.h) the
// reclaim protects them (policy/share_guard.h; an owner's bytes are the
// records of its blocks, headers and padding included, so shares count
// what blocks take on the device): one region is kept free
// for copies forward; before a region is reclaimed, the blocks of its
// owners within their shares are copied forward (outside the reinsertion
// budget, counted in nvme.share_copies) and the region is reclaimed only
// once they are; only blocks of owners over their shares (or of none) are
// dropped. A client write that would add to the protected bytes past
// shareable_bytes() on the device is NoSpace (nvme.share_refusals): the
// log could no longer make room without dropping a protected block.
//
// Thread-safe. Write/Read return a Status at once: not ok means rejected
// (`done` never runs); ok means `done` runs exactly once, never inline: a
// write's on the index writer thread, a read's on a verifier thread
// (checksumming stays off the I/O threads). The destructor waits for I/O
// in flight.
//
// Nothing a caller does waits on I/O, and no lock is held across RocksDB
// or device I/O: index mutations (an entry once its record is written, a
// region's state, an Erase's delete) are decided under the tier's mutex
// and applied in that order by one index writer thread. Writes and reads
// each take at most 3/4 of the staging pool, so neither starves the other.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/clock.h"
#include "common/counters.h"
#include "common/mutex.h"
#include "common/worker_pool.h"
#include "kvtier/block_key.h"
#include "policy/option_defaults.h"
#include "policy/reclaim_policy.h"
#include "tiers/nvme/block_device.h"
#include "tiers/nvme/block_record.h"
#include "tiers/nvme/nvme_index.h"
#include "tiers/nvme/region_manager.h"
#include "tiers/nvme/staging_pool.h"
#include "tiers/tier.h"

namespace kvtier {

struct NvmeTierOptions {
  uint64_t region_bytes = defaults::kNvmeRegionBytes;
  uint64_t staging_bytes = defaults::kNvmeStagingBytes;  // aligned I/O memory; bounds the bytes in flight
  std::chrono::milliseconds full_retry{1000};
  // Threads verifying read records (checksums) off the I/O threads; they
  // also run reinsertion.
  unsigned verify_threads = 2;
  // Reinsertion: when no region is free (the next write reclaims the oldest
  // sealed one), blocks of that region read since they were written are
  // copied forward into the open region, so reclaim drops only cold blocks.
  // The bytes rewritten are capped at this share of the bytes written by
  // Write (a token bucket holding at most one region). 0 turns it off.
  double reinsert_share = defaults::kNvmeReinsertPercent / 100.0;
  // Which blocks reinsertion copies (policy/reclaim_policy.h): fifo none,
  // lru those read since written, queue_aware those a queued request needs
  // (SetNeededHint) and then lru's; lru2, s3fifo and arc those the eviction
  // policy of that name, fed the tier's writes, reads and drops, spares
  // when it evicts as many blocks as the region holds.
  ReclaimOrder reclaim = ReclaimOrder::kLru;
};

// What Open() found.
struct NvmeRecovery {
  int64_t entries_loaded = 0;
  int64_t dropped_stale = 0;    // region reused or gone since the entry was written
  int64_t dropped_corrupt = 0;  // header or checksum did not verify
  int64_t regions_resealed = 0;
};

class NvmeTier final : public BlockTier, public ReclaimHooks, public ReclaimShares, public NamespaceSums {
 public:
  // Takes the device and the index; recovers as described above. `clock` is
  // borrowed. Errors: InvalidArgument (geometry), NoSpace (staging memory),
  // IoError (index), each naming the cause.
  static Result<std::unique_ptr<NvmeTier>> Open(std::unique_ptr<BlockDevice> device, std::unique_ptr<NvmeIndex> index,
                                                const NvmeTierOptions& options, Clock& clock);
  ~NvmeTier() override;

  std::string_view name() const override { return "nvme"; }
  bool asynchronous() const override { return true; }
  uint64_t capacity_bytes() const override { return device_->capacity_bytes(); }
  uint64_t used_bytes() const override;
  uint64_t StoredBytes(uint64_t payload_bytes) const override {
    return RecordBytes(payload_bytes, device_->alignment_bytes());
  }

  // BlockTier::Write. Also InvalidArgument when larger than a region, and
  // Corruption when `payload_checksum` is given and the bytes copied into
  // staging do not hash to it (counted in nvme.write_checksum_mismatches:
  // the source changed after its checksum was taken). `done`: Ok once
  // durable on the device and indexed.
  Status Write(const NamespaceFingerprint& ns, const BlockKey& key, uint32_t layer_count,
               std::span<const std::byte> payload, WriteDone done,
               std::optional<uint64_t> payload_checksum = std::nullopt) override;

  // BlockTier::Read. A whole-block read of 1 MiB or more into a 4 KiB-aligned
  // `dst` with room for the payload rounded up to 4 KiB lands there
  // directly (no staging copy). `done` runs on a verifier thread; an
  // IoError keeps the entry.
  Status Read(const BlockKey& key, uint32_t first_layer, uint32_t last_layer, std::span<std::byte> dst,
              ReadDone done) override;
  // Read, with the per-layer checksums of the record header the bytes were
  // verified against (no extra pass; hashed from the verified bytes only
  // for a block of more than kMaxLayerChecksums layers, whose header has
  // none).
  Status ReadWithLayerChecksums(const BlockKey& key, uint32_t first_layer, uint32_t last_layer,
                                std::span<std::byte> dst, LayerReadDone done) override;
  bool keeps_layer_checksums() const override { return true; }

  std::optional<BlockInfo> Find(const BlockKey& key) const override;
  void ForEachBlock(const BlockVisitor& visit) const override;
  Status Erase(const BlockKey& key) override;

  ReclaimHooks* reclaim_hooks() override { return this; }
  ReclaimShares* reclaim_shares() override { return this; }
  const NamespaceSums* namespace_sums() const override { return this; }
  // NamespaceSums: from namespace_bytes_, under mu_ once.
  void ForEachNamespaceBytes(const NamespaceBytesVisitor& visit) const override;
  // For the queue_aware reclaim order (policy/reclaim_policy.h).
  void SetNeededHint(NeededHint needed) override;
  void SetEvictionSink(EvictionSink sink) override;
  void SetDropListener(DropListener listener) override;
  // ReclaimShares::SetShares; see above. O(namespaces) once.
  void SetShares(ShareOf shares) override;
  // The device less 3 regions: the open one, the one kept free for copies
  // and one for the ends of regions records do not fill.
  uint64_t shareable_bytes() const override;

  // Blocks until no I/O and no background job (reinsertion, eviction scan)
  // of the tier is in flight. Not on a tier thread.
  void WaitForIdle() const;

  bool full() const;
  WriteTotals write_totals() const override;
  const NvmeRecovery& recovery() const { return recovery_; }
  const BlockDevice& device() const { return *device_; }
  // nvme.* counters, the device's and the staging pool's included.
  void VisitCounters(CounterVisitor& visitor) const override;
  // Problems: the tier is full (its file system has no room) or its index
  // failed writes; a warning: the device reported I/O errors
  // (nvme_health.cc).
  void CheckHealth(HealthFindings& out) const override;

 private:
  struct ReadOp;
  // Read and ReadWithLayerChecksums: exactly one of `done`, `layer_done` is set.
  Status StartRead(const BlockKey& key, uint32_t first_layer, uint32_t last_layer, std::span<std::byte> dst,
                   ReadDone done, LayerReadDone layer_done);
  NvmeTier(std::unique_ptr<BlockDevice> device, std::unique_ptr<NvmeIndex> index, std::unique_ptr<StagingPool> staging,
           const NvmeTierOptions& options, Clock& clock);
  Status Recover() EXCLUDES(mu_);
  // Sync check of one record (start-up): header and payload checksum.
  Status VerifyRecord(const BlockKey& key, const IndexEntry& entry);
  // Reads `entry`'s whole record into `staging` (RecordBytes long) and
  // verifies it. Blocking; never on a device thread.
  Status ReadRecordSync(const BlockKey& key, const IndexEntry& entry, std::span<std::byte> staging);
  // Write, or (with `replaces`) a reinsertion that moves `key` from the
  // record `*replaces` to a new one.
  Status WriteRecord(const NamespaceFingerprint& ns, const BlockKey& key, uint32_t layer_count,
                     std::span<const std::byte> payload, WriteDone done, std::optional<uint64_t> payload_checksum,
                     const IndexEntry* replaces);
  // Caller holds mu_, after an allocation: when no region is free, takes
  // the next victim region's turn: its hit blocks are reinserted (budget
  // allowing) and, with an eviction sink, the others are offered to it.
  void MaybeScanNextVictim() REQUIRES(mu_);
  using Blocks = std::vector<std::pair<BlockKey, IndexEntry>>;
  // What one reclaim turn does with the blocks of region `scan`.
  struct Turn {
    Blocks guarded;                      // within their owners' shares: must be copied forward
    Blocks reinsert;                     // chosen by the reclaim order, within the budget
    Blocks evict;                        // offered to the sink
    std::pair<uint32_t, uint64_t> scan;  // region, generation
  };
  // Copies `turn`'s guarded and reinsert blocks forward and hands each of
  // its evict blocks to `sink`; then, with shares, marks the region
  // reclaimable (or to be scanned again, if a guarded copy failed). Runs
  // on a verifier thread.
  void ReinsertAndEvict(Turn turn, EvictionSink sink);
  // Reads `entry`'s record and writes it forward. Not under mu_.
  Status CopyForward(const BlockKey& key, const IndexEntry& entry);
  // With shares: the blocks of `keys` (a region's) within their owners'
  // shares go to `guarded`; the rest are returned. Caller holds mu_.
  std::vector<BlockKey> SplitGuarded(const std::vector<BlockKey>& keys, Blocks& guarded) REQUIRES(mu_);
  // With shares: whether a client write in `ns` of `record_bytes` on the
  // device leaves the protected bytes within shareable_bytes(). Caller
  // holds mu_.
  bool ShareRoomFor(const NamespaceFingerprint& ns, uint64_t record_bytes) REQUIRES(mu_);
  // What may be reclaimed. A tier that takes turns: only a region whose
  // turn was taken in its current generation (its blocks copied forward
  // or handed down), and with shares only the one whose protected blocks
  // have been copied (cleared_); one that does not: any. Caller holds mu_.
  RegionManager::ReclaimGate Gate() const REQUIRES(mu_);
  // Whether regions get a turn before their reclaim: with a reinsertion
  // budget, an eviction sink or shares. Caller holds mu_.
  bool TakesTurns() const REQUIRES(mu_) { return reinsert_budget_.enabled() || eviction_sink_ || shares_; }
  // Drops a reclaimed region's entries from memory and queues the
  // allocation's region changes for the index writer. Caller holds mu_.
  void PersistRegions(const RegionManager::Allocation& allocation) REQUIRES(mu_);
  // Queues one index mutation behind those queued before (counts as I/O in
  // flight; a failure is logged and counted). Caller holds mu_.
  void PostIndex(std::function<Status()> mutation) REQUIRES(mu_);
  // The most staging bytes writes (or reads) may hold at once.
  uint64_t StagingShare() const { return options_.staging_bytes / 4 * 3; }
  void OnWritten(const BlockKey& key, const IndexEntry& entry, std::span<std::byte> staging, Result<size_t> result,
                 const WriteDone& done, std::optional<IndexEntry> replaces);
  void OnRead(std::shared_ptr<ReadOp> op);
  // Drops `key` if its entry is still `entry` (memory and index). Caller holds mu_.
  void DropIfCurrent(const BlockKey& key, const IndexEntry& entry) REQUIRES(mu_);
  // Keeps `header`, read and verified from `entry`'s record, in the header
  // cache (the oldest entry leaves when it is full). Takes mu_.
  void CacheHeader(const BlockKey& key, const IndexEntry& entry, const RecordHeader& header) EXCLUDES(mu_);
  void BeginIo() REQUIRES(mu_);
  void EndIo() EXCLUDES(mu_);

  std::unique_ptr<BlockDevice> device_;
  std::unique_ptr<NvmeIndex> index_;
  std::unique_ptr<StagingPool> staging_;
  const NvmeTierOptions options_;
  Clock& clock_;
  NvmeRecovery recovery_;

  mutable Mutex mu_;
  mutable CondVar idle_cv_;
  RegionManager regions_ GUARDED_BY(mu_);
  std::unordered_map<BlockKey, IndexEntry> entries_ GUARDED_BY(mu_);
  // Payload bytes (ForEachNamespaceBytes) and record bytes of entries_ per
  // namespace, and per share owner (with shares); changed only through
  // Account, with counters_.stored_bytes.
  struct HeldBytes {
    uint64_t payload = 0;
    uint64_t record = 0;
  };
  std::unordered_map<NamespaceFingerprint, HeldBytes> namespace_bytes_ GUARDED_BY(mu_);
  struct OwnerBytes {
    HeldBytes held;
    uint64_t share_bytes = 0;
  };
  std::unordered_map<uint32_t, OwnerBytes> owner_bytes_ GUARDED_BY(mu_);
  // Adds (`sign` +1) or removes (-1) `bytes` of namespace `ns` to its
  // owner's. Caller holds mu_.
  void AccountOwner(const NamespaceFingerprint& ns, const HeldBytes& bytes, int sign) REQUIRES(mu_);
  // Adds (`sign` +1) or removes (-1) `entry` from stored_bytes and
  // namespace_bytes_, where entries_ gains or loses it. Caller holds mu_.
  void Account(const IndexEntry& entry, int sign) REQUIRES(mu_);
  ShareOf shares_ GUARDED_BY(mu_);
  // The region (and generation) whose protected blocks have been copied
  // forward: the only one reclaim may take, with shares.
  std::pair<uint32_t, uint64_t> cleared_ GUARDED_BY(mu_){~0u, 0};
  std::vector<std::unordered_set<BlockKey>> region_keys_ GUARDED_BY(mu_);
  const uint64_t shareable_bytes_;  // see shareable_bytes()
  std::unordered_set<BlockKey> writing_ GUARDED_BY(mu_);
  std::unordered_set<BlockKey> cancelled_ GUARDED_BY(mu_);  // erased while writing
  bool full_ GUARDED_BY(mu_) = false;
  ReinsertBudget reinsert_budget_ GUARDED_BY(mu_);
  bool reinserting_ GUARDED_BY(mu_) = false;  // a scan job runs
  NeededHint needed_ GUARDED_BY(mu_);
  DropListener dropped_ GUARDED_BY(mu_);   // SetDropListener: hears each block reclaimed or dropped as bad
  ReclaimPolicy reclaim_ GUARDED_BY(mu_);  // sees every block's life
  EvictionSink eviction_sink_ GUARDED_BY(mu_);
  std::pair<uint32_t, uint64_t> reinsert_scanned_ GUARDED_BY(mu_){~0u, 0};  // region, generation
  // Per region: 1 + the generation whose turn was taken (0: none yet). A
  // tier that takes turns (TakesTurns) reclaims only such a region (Gate).
  std::vector<uint64_t> turn_taken_ GUARDED_BY(mu_);
  int64_t full_until_us_ GUARDED_BY(mu_) = 0;
  int64_t io_in_flight_ GUARDED_BY(mu_) = 0;
  uint64_t staged_for_writes_ GUARDED_BY(mu_) = 0;
  uint64_t staged_for_reads_ GUARDED_BY(mu_) = 0;
  // Record headers of recent layer-range reads (their per-layer
  // checksums), so that reading a block layer by layer costs one I/O a
  // layer, not two. An entry is used only for the record it was read
  // from (same offset and region generation); at most kHeaderCacheEntries,
  // the oldest leaving first. The payload is still verified per layer.
  static constexpr size_t kHeaderCacheEntries = 4096;
  struct CachedHeader {
    uint64_t offset = 0;
    uint64_t region_generation = 0;
    RecordHeader header;
  };
  std::unordered_map<BlockKey, CachedHeader> header_cache_ GUARDED_BY(mu_);
  std::deque<BlockKey> header_cache_order_ GUARDED_BY(mu_);  // insertion order
  struct Counters {
    int64_t writes = 0, write_failures = 0, write_rejections = 0, reads = 0, read_failures = 0;
    int64_t corrupt_reads = 0, reclaimed_reads = 0, erases = 0, stored_bytes = 0, enospc = 0;
    int64_t reinserted = 0, reinserted_bytes = 0, reinsert_failures = 0, reinsert_over_budget = 0;
    int64_t reinserted_needed = 0;  // chosen because a queued request needs them
    int64_t evictions_offered = 0, eviction_read_failures = 0, write_checksum_mismatches = 0;
    int64_t evictions_missed = 0;     // reclaimed before the eviction scan read them
    int64_t reclaim_dropped = 0;      // blocks dropped by region reclaims (capacity evictions)
    int64_t index_failures = 0;       // index mutations RocksDB refused
    int64_t header_cache_hits = 0;    // layer reads that needed no header I/O
    int64_t share_copies = 0;         // blocks copied forward to keep an owner's share
    int64_t share_copy_failures = 0;  // such copies that failed (the region waits for another try)
    int64_t share_refusals = 0;       // client writes refused: the room is held by shares
    WriteTotals submitted;
  } counters_ GUARDED_BY(mu_);
  // Entries ForEachBlock handed out one by one (nvme.blocks_listed): what
  // `kvtier ls` and drops walk; the namespace sums never add to it.
  mutable std::atomic<int64_t> blocks_listed_{0};
  // Runs OnRead. Declared last: destroyed (joined) first, once the
  // destructor has seen io_in_flight_ reach 0.
  WorkerPool verifiers_;
  // Applies index mutations in the order they were queued. Declared after
  // the verifiers (destroyed first): its jobs may be queued by them.
  WorkerPool index_writer_{1};
};

}  // namespace kvtier

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
// Thread-safe. Write/Read return a Status at once: not ok means rejected
// (`done` never runs); ok means `done` runs exactly once, never inline: a
// write's on a device thread, a read's on a verifier thread (checksumming
// stays off the I/O threads). The destructor waits for I/O in flight.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/clock.h"
#include "common/counters.h"
#include "common/worker_pool.h"
#include "kvtier/block_key.h"
#include "policy/reclaim_policy.h"
#include "tiers/nvme/block_device.h"
#include "tiers/nvme/block_record.h"
#include "tiers/nvme/nvme_index.h"
#include "tiers/nvme/region_manager.h"
#include "tiers/nvme/staging_pool.h"

namespace kvtier {

struct NvmeTierOptions {
  uint64_t region_bytes = 64ull << 20;
  uint64_t staging_bytes = 256ull << 20;  // aligned I/O memory; bounds the bytes in flight
  std::chrono::milliseconds full_retry{1000};
  // Threads verifying read records (checksums) off the I/O threads; they
  // also run reinsertion.
  unsigned verify_threads = 2;
  // Reinsertion: when no region is free (the next write reclaims the oldest
  // sealed one), blocks of that region read since they were written are
  // copied forward into the open region, so reclaim drops only cold blocks.
  // The bytes rewritten are capped at this share of the bytes written by
  // Write (a token bucket holding at most one region). 0 turns it off.
  double reinsert_share = 0.1;
  // Which blocks reinsertion copies (policy/reclaim_policy.h): fifo none,
  // lru those read since written, queue_aware those a queued request needs
  // (SetNeededHint) and then lru's.
  ReclaimOrder reclaim = ReclaimOrder::kLru;
};

// What Open() found.
struct NvmeRecovery {
  int64_t entries_loaded = 0;
  int64_t dropped_stale = 0;    // region reused or gone since the entry was written
  int64_t dropped_corrupt = 0;  // header or checksum did not verify
  int64_t regions_resealed = 0;
};

class NvmeTier {
 public:
  // Takes the device and the index; recovers as described above. `clock` is
  // borrowed. Errors: InvalidArgument (geometry), NoSpace (staging memory),
  // IoError (index), each naming the cause.
  static Result<std::unique_ptr<NvmeTier>> Open(std::unique_ptr<BlockDevice> device, std::unique_ptr<NvmeIndex> index,
                                                const NvmeTierOptions& options, Clock& clock);
  ~NvmeTier();

  using WriteDone = std::function<void(Status)>;
  // Stores `payload` (layer-major, layer_count equal layers) under `key`;
  // the bytes are copied before Write returns. Rejections: InvalidArgument
  // (empty, layers uneven, larger than a region), AlreadyExists (stored or
  // being stored), Busy (no staging memory or reclaimable region now),
  // NoSpace (the tier is full), IoError (index). `done`: Ok once durable on
  // the device and indexed; IoError / NoSpace otherwise (nothing visible).
  // `payload_checksum`: its xxh3-64 if the caller knows it (saves a pass).
  Status Write(const NamespaceFingerprint& ns, const BlockKey& key, uint32_t layer_count,
               std::span<const std::byte> payload, WriteDone done,
               std::optional<uint64_t> payload_checksum = std::nullopt);

  using ReadDone = std::function<void(Result<size_t>)>;
  // Copies layers [first_layer, last_layer) of `key` into `dst` (borrowed
  // until `done`). A whole-block read of 1 MiB or more into a 4 KiB-aligned
  // `dst` with room for the payload rounded up to 4 KiB lands there
  // directly (no staging copy). Rejections: NotFound, InvalidArgument (bad range, `dst`
  // too small), Busy (no staging memory now). `done`: the bytes copied;
  // NotFound (reclaimed meanwhile), Corruption (the record did not verify;
  // the entry is dropped), IoError (the entry is kept).
  Status Read(const BlockKey& key, uint32_t first_layer, uint32_t last_layer, std::span<std::byte> dst,
              ReadDone done);

  struct BlockInfo {
    NamespaceFingerprint ns;
    uint64_t payload_bytes = 0;
    uint32_t layer_count = 0;
    uint64_t payload_checksum = 0;  // xxh3-64 of the whole payload
  };
  std::optional<BlockInfo> Find(const BlockKey& key) const;
  // Forgets `key` (NotFound if absent); its bytes become dead space. A
  // write of `key` still in flight (or a reinsertion of it) is cancelled:
  // it completes with Cancelled and leaves nothing visible.
  Status Erase(const BlockKey& key);

  // For the queue_aware reclaim order: whether a queued request needs a
  // key. Called with the tier's mutex held, so it must not call the tier
  // and may take only leaf locks; empty clears it (its owner must clear it
  // before it goes away).
  using NeededHint = std::function<bool(const BlockKey&)>;
  void SetNeededHint(NeededHint needed);

  bool full() const;
  // Record bytes (headers and padding included) sent to the device since
  // Open, whatever their outcome; and the part of them that reinsertion
  // wrote (the tier's own writes, which no admission decided). What a
  // write budget counts.
  struct WriteTotals {
    uint64_t device_bytes = 0;
    uint64_t reinserted_bytes = 0;
  };
  WriteTotals write_totals() const;
  const NvmeRecovery& recovery() const { return recovery_; }
  const BlockDevice& device() const { return *device_; }
  // nvme.* counters, the device's and the staging pool's included.
  void VisitCounters(CounterVisitor& visitor) const;

 private:
  struct ReadOp;
  NvmeTier(std::unique_ptr<BlockDevice> device, std::unique_ptr<NvmeIndex> index, std::unique_ptr<StagingPool> staging,
           const NvmeTierOptions& options, Clock& clock);
  Status Recover();
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
  // Caller holds mu_, after an allocation: when no region is free, starts
  // reinserting the hit blocks of the next victim region (budget allowing).
  void MaybeStartReinsertion();
  // Copies each of `keys` (records `entries`) forward. Runs on a verifier thread.
  void Reinsert(std::vector<std::pair<BlockKey, IndexEntry>> blocks);
  // Persists region changes of an allocation; drops a reclaimed region's
  // entries from memory. Caller holds mu_.
  Status PersistRegions(const RegionManager::Allocation& allocation);
  void OnWritten(const BlockKey& key, const IndexEntry& entry, std::span<std::byte> staging, Result<size_t> result,
                 const WriteDone& done, std::optional<IndexEntry> replaces);
  void OnRead(std::shared_ptr<ReadOp> op);
  // Drops `key` if its entry is still `entry` (memory and index). Caller holds mu_.
  void DropIfCurrent(const BlockKey& key, const IndexEntry& entry);
  void BeginIo();
  void EndIo();

  std::unique_ptr<BlockDevice> device_;
  std::unique_ptr<NvmeIndex> index_;
  std::unique_ptr<StagingPool> staging_;
  const NvmeTierOptions options_;
  Clock& clock_;
  NvmeRecovery recovery_;

  mutable std::mutex mu_;
  std::condition_variable idle_cv_;
  RegionManager regions_;                                            // guarded by mu_
  std::unordered_map<BlockKey, IndexEntry> entries_;                 // guarded by mu_
  std::vector<std::unordered_set<BlockKey>> region_keys_;            // guarded by mu_
  std::unordered_set<BlockKey> writing_;                             // guarded by mu_
  std::unordered_set<BlockKey> cancelled_;                           // guarded by mu_: erased while writing
  bool full_ = false;                                                // guarded by mu_
  double reinsert_budget_bytes_ = 0;                                 // guarded by mu_: the token bucket
  bool reinserting_ = false;                                         // guarded by mu_: a Reinsert job runs
  NeededHint needed_;                                                // guarded by mu_
  std::pair<uint32_t, uint64_t> reinsert_scanned_{~0u, 0};           // guarded by mu_: region, generation
  int64_t full_until_us_ = 0;                                        // guarded by mu_
  int64_t io_in_flight_ = 0;                                         // guarded by mu_
  struct Counters {
    int64_t writes = 0, write_failures = 0, write_rejections = 0, reads = 0, read_failures = 0;
    int64_t corrupt_reads = 0, reclaimed_reads = 0, erases = 0, stored_bytes = 0, enospc = 0;
    int64_t reinserted = 0, reinserted_bytes = 0, reinsert_failures = 0, reinsert_over_budget = 0;
    int64_t reinserted_needed = 0;  // chosen because a queued request needs them
    WriteTotals submitted;
  } counters_;  // guarded by mu_
  // Runs OnRead. Declared last: destroyed (joined) first, once the
  // destructor has seen io_in_flight_ reach 0.
  WorkerPool verifiers_;
};

}  // namespace kvtier

// NvmeIndex: the persistent index of the NVMe tier, an embedded RocksDB.
// Maps each block key to where its record lies, and each region to its
// generation and state, so a restarted daemon finds its blocks again.
//
// Crash safety: every mutation is one RocksDB write (a WriteBatch when it
// touches several records), so after kill -9 the index holds exactly the
// mutations whose call returned. With sync_writes the WAL is fsynced per
// write (power-loss safe); without, a process crash loses nothing but a
// machine crash may lose the last writes. The tier makes an entry visible
// here only after its record's data write completed, and checks every entry
// against the record header before serving it, so a stale entry is a miss,
// never wrong bytes.
//
// Thread-safe (RocksDB is), except that DeleteIfCurrent and ResetRegion
// read before they write (see ResetRegion).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "kvtier/block_key.h"
#include "kvtier/result.h"

namespace rocksdb {
class DB;
}

namespace kvtier {

struct IndexEntry {
  NamespaceFingerprint ns;
  uint64_t payload_checksum = 0;  // xxh3-64 of the whole payload (as the host tier records it)
  uint32_t region = 0;
  uint64_t offset = 0;  // device offset of the record header
  uint64_t payload_bytes = 0;
  uint32_t layer_count = 1;
  uint64_t region_generation = 0;  // must match the region's, else the entry is stale
  uint32_t flags = 0;
  uint64_t hits = 0;  // as of the last persisted update
  int64_t last_use_us = 0;

  bool operator==(const IndexEntry&) const = default;
};

enum class RegionStatus : uint32_t { kFree = 0, kOpen = 1, kSealed = 2 };

struct RegionState {
  uint32_t region = 0;
  uint64_t generation = 0;  // bumped every time the region is reused
  RegionStatus status = RegionStatus::kFree;
  uint64_t seal_sequence = 0;  // increases with every seal: orders reclaim oldest first

  bool operator==(const RegionState&) const = default;
};

class NvmeIndex {
 public:
  // Opens (creating if missing) the index in directory `path`, which is
  // created or made mode 0700 first (never through a symbolic link), so no
  // file RocksDB writes in it is readable by others whatever its own mode.
  // Errors: InvalidArgument if `path` is a symbolic link or not a
  // directory; IoError naming the path and the reason (it cannot be
  // created or made private, another kvtierd holds the LOCK file);
  // Corruption if RocksDB reports it.
  static Result<std::unique_ptr<NvmeIndex>> Open(const std::string& path, bool sync_writes);
  ~NvmeIndex();

  // Fault-injection seam for tests: runs on the calling thread before every
  // mutation (Put, Delete, DeleteIfCurrent, PutRegion, ResetRegion), so a
  // hook that blocks stalls that mutation the way a slow RocksDB write
  // would. Set it before the index is in use; empty (the default): none.
  void SetMutationHook(std::function<void()> hook) { mutation_hook_ = std::move(hook); }

  Status Put(const BlockKey& key, const IndexEntry& entry);
  Status Delete(const BlockKey& key);
  // Deletes `key`'s entry only if it still describes the record `entry`
  // does (same region, generation and offset; one whose value does not
  // decode goes too): a newer record's entry (a reinsertion's copy indexed
  // after the delete was decided) stays. Absent is no error. Reads, then
  // writes, as ResetRegion does (see there).
  Status DeleteIfCurrent(const BlockKey& key, const IndexEntry& entry);
  // NotFound if absent.
  Result<IndexEntry> Get(const BlockKey& key) const;
  Status PutRegion(const RegionState& region);
  // In one atomic write: deletes the entries of `keys` that still describe a
  // record in an earlier generation of `region` (entry.region equal,
  // entry.region_generation lower; one whose value does not decode goes
  // too) and records `region` (a region reclaimed or reopened with its
  // entries gone). An entry of `keys` that has moved on meanwhile (a
  // reinsertion's copy in another region, indexed after the reset was
  // decided but before it is applied) is kept: the index never drops the
  // live record of a block for the region it left. Absent keys are no error.
  // It reads the entries, then writes: a Put of one of `keys` running
  // concurrently may still be deleted, so the caller serializes mutations
  // (the tier applies all of them on its one index writer thread).
  Status ResetRegion(const RegionState& region, std::span<const BlockKey> keys);

  // Visits every entry / region in key order. Corruption if a stored value
  // does not decode (the visit stops there).
  Status ForEachEntry(const std::function<void(const BlockKey&, const IndexEntry&)>& visit) const;
  Status ForEachRegion(const std::function<void(const RegionState&)>& visit) const;

 private:
  NvmeIndex(std::unique_ptr<rocksdb::DB> db, bool sync_writes);

  void BeforeMutation() const {
    if (mutation_hook_) mutation_hook_();
  }

  std::unique_ptr<rocksdb::DB> db_;
  const bool sync_writes_;
  std::function<void()> mutation_hook_;
};

}  // namespace kvtier

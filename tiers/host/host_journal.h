// HostJournal: the record of which committed blocks the host arena holds,
// kept in a memfd of its own so that it outlives kvtierd together with the
// arena (both handed to systemd's file descriptor store, or to whatever
// plays its part: docs/OPERATIONS.md "Restarts"). A new kvtierd that gets
// both back adopts the blocks the journal names, after checking each one's
// bytes against its checksum (daemon/engine/adopter.h).
//
// Format (version 1): a JournalHeader (64 bytes), then slot_count records
// of 64 bytes. A record is a seqlock like the block directory's: the
// writer makes `seq` odd, writes the fields, makes it even again. A record
// that is odd when read was being written when the daemon died and is
// ignored; an even one with length 0 is free. Records are handed out
// lowest free slot first, so the pages of the memfd that hold anything
// (tmpfs allocates a page only when written) stay about 64 bytes per live
// block; slot_count is the most blocks the arena can hold (one per 4 KiB),
// so the journal never fills.
//
// What a record promises: when it is even and not free, the block `key` of
// namespace `ns` was committed with `size` bytes at `offset` in the arena
// whose bytes hashed to `checksum` (and, for a block with layer checksums,
// had `layer_count` equal layers). The bytes may have changed since (a
// client with a writable mapping): the adopter checks.
//
// Thread-safe (one internal mutex, a leaf in any lock order).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "kvtier/block_key.h"
#include "kvtier/result.h"

namespace kvtier {

inline constexpr uint64_t kJournalMagic = 0x316c6e724a544b56ULL;  // "VKTJrnl1" little-endian
inline constexpr uint32_t kJournalVersion = 1;
// The arena bytes one record stands for (the allocator's smallest extent).
inline constexpr uint64_t kJournalBytesPerSlot = 4096;

// One committed block as the journal records it.
struct JournalRecord {
  NamespaceFingerprint ns;
  BlockKey key;
  uint64_t offset = 0;       // in the arena
  uint64_t size = 0;         // the block's bytes (> 0)
  uint64_t checksum = 0;     // BlockChecksum of those bytes
  uint32_t layer_count = 0;  // > 1: the block had that many layer checksums; else none
};

class HostJournal {
 public:
  static constexpr uint32_t kNoSlot = UINT32_MAX;

  // A new, empty journal for an arena of `arena_bytes` (> 0), in a memfd
  // named `name`, sealed against shrinking and growing. IoError when a
  // system call fails; InvalidArgument for 0 bytes or more slots than
  // a uint32_t numbers.
  static Result<std::unique_ptr<HostJournal>> Create(uint64_t arena_bytes, const std::string& name);

  // The journal a previous daemon kept in memfd `fd` (taken: closed on
  // every path but success), for an arena of `arena_bytes`. Its live
  // records become Recovered(); their slots stay taken until Remove.
  // FailedPrecondition when it is not such a journal, or one of another
  // version or arena size (the caller starts empty); IoError when a system
  // call fails.
  static Result<std::unique_ptr<HostJournal>> Attach(int fd, uint64_t arena_bytes);

  ~HostJournal();
  HostJournal(const HostJournal&) = delete;
  HostJournal& operator=(const HostJournal&) = delete;

  // Records a committed block; returns its slot (for Remove). kNoSlot
  // only if every slot is taken (more live blocks than the arena can hold:
  // a caller's bug, logged once).
  uint32_t Add(const JournalRecord& record);
  // Frees `slot` (from Add or Recovered); kNoSlot is ignored. Call before
  // the block's extent can be reused.
  void Remove(uint32_t slot);

  // The records found by Attach that were whole (even, not free), with
  // their slots, in slot order; empty after Create.
  struct Recovered {
    uint32_t slot = 0;
    JournalRecord record;
  };
  const std::vector<Recovered>& recovered() const { return recovered_; }
  // Records Attach skipped: being written when the daemon died, or
  // naming bytes outside the arena.
  uint64_t torn() const { return torn_; }

  int fd() const { return fd_; }  // owned by this object
  uint32_t slot_count() const { return slot_count_; }
  uint64_t live() const;  // records held now

 private:
  HostJournal(int fd, std::byte* base, uint64_t bytes, uint32_t slot_count);
  static Result<std::unique_ptr<HostJournal>> Map(int fd, uint64_t bytes, uint32_t slot_count);
  void Write(uint32_t slot, const JournalRecord& record);

  const int fd_;
  std::byte* const base_;
  const uint64_t bytes_;
  const uint32_t slot_count_;
  std::vector<Recovered> recovered_;  // set by Attach, then read-only
  uint64_t torn_ = 0;
  mutable Mutex mu_;
  std::vector<uint32_t> free_slots_ GUARDED_BY(mu_);  // below high_water_, a min-heap
  uint32_t high_water_ GUARDED_BY(mu_) = 0;           // slots at and above it were never used
  uint64_t live_ GUARDED_BY(mu_) = 0;
  bool full_logged_ GUARDED_BY(mu_) = false;
};

}  // namespace kvtier

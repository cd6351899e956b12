// The block directory: a shared-memory mirror of which committed blocks the
// host arena holds and where, so that a client answers Lookup and copying
// Get of host-resident blocks without a round trip to kvtierd.
//
// Format (version 1), one memfd that kvtierd writes and clients map
// read-only (sealed with F_SEAL_FUTURE_WRITE):
//   DirectoryHeader (64 bytes), then slot_count DirectorySlot (64 bytes each).
// An open-addressing table: linear probing from the home slot
// (key.lo & (slot_count - 1)), backward-shift deletion (no tombstones). An
// empty slot has length 0 (a committed block is never empty).
//
// Concurrency: one writer at a time (the caller serializes DirectoryWriter
// calls); any number of lock-free readers in any process.
// - Each slot is a seqlock: the writer makes `seq` odd, writes the fields,
//   makes it even again (never reset, so it only grows). A reader that sees
//   the same even `seq` before and after reading the fields holds a
//   consistent snapshot.
// - A backward shift moves entries towards their home slot. The header's
//   `shift_epoch` is odd while one runs; a reader whose probe found nothing
//   retries when the epoch moved (a shift could have carried its key past
//   the probe). A hit needs no such check: its slot snapshot was consistent.
// - Extent safety: kvtierd withdraws an entry (bumping its slot's seq)
//   before it frees, or lets anyone reuse, the entry's arena extent. A
//   reader copies the bytes, then checks with StillPublished that the slot's
//   seq is unchanged: then the entry was still published when the copy
//   ended, so the copy holds the committed bytes. Otherwise it discards the
//   copy (and retries or asks the daemon).
//
// The directory is an accelerator, never the truth: a block the table had
// no room for is counted in `unpublished`, and a miss is only final when
// nothing is unpublished and kvtierd has no tier below the host
// (MissesAreFinal); otherwise the client asks the daemon.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>

#include "kvtier/block_key.h"
#include "kvtier/result.h"

namespace kvtier {

inline constexpr uint64_t kDirectoryMagic = 0x3172694456544b56ULL;  // "VKTVDir1" little-endian
inline constexpr uint32_t kDirectoryVersion = 1;

struct DirectoryHeader {
  uint64_t magic = 0;
  uint32_t version = 0;
  uint32_t slot_count = 0;  // a power of two
  std::atomic<uint64_t> shift_epoch{0};
  std::atomic<uint64_t> entries{0};      // published blocks
  std::atomic<uint64_t> unpublished{0};  // committed blocks the table had no room for
  std::atomic<uint64_t> lower_tiers{0};  // 1: a host miss may still be cached in another tier (below or above)
  uint64_t reserved[2] = {};
};
static_assert(sizeof(DirectoryHeader) == 64);

struct DirectorySlot {
  std::atomic<uint64_t> seq{0};
  std::atomic<uint64_t> key_hi{0}, key_lo{0};
  std::atomic<uint64_t> ns_hi{0}, ns_lo{0};
  std::atomic<uint64_t> offset{0}, length{0};  // the block's bytes in the arena
  std::atomic<uint64_t> checksum{0};           // xxh3-64 of those bytes
};
static_assert(sizeof(DirectorySlot) == 64);
static_assert(std::atomic<uint64_t>::is_always_lock_free);

// Bytes a directory of `slot_count` slots occupies.
constexpr size_t DirectoryBytes(uint32_t slot_count) {
  return sizeof(DirectoryHeader) + size_t{slot_count} * sizeof(DirectorySlot);
}

// A consistent snapshot of one published block.
struct DirectoryEntry {
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t checksum = 0;
  uint32_t slot = 0;  // where it was found, and that slot's seq then
  uint64_t seq = 0;
};

// Read side (clients). Thread-safe; copyable; borrows the mapping.
class DirectoryReader {
 public:
  // Checks magic, version and that `bytes` covers the slots.
  // ProtocolError otherwise.
  static Result<DirectoryReader> Attach(const std::byte* base, size_t bytes);

  enum class Outcome {
    kHit,      // *entry is set
    kMiss,     // not published (final only if MissesAreFinal())
    kUnknown,  // the table kept changing under the probe: ask the daemon
  };
  // Looks `key` up under namespace `ns` (an entry of another namespace is a miss).
  Outcome Find(const NamespaceFingerprint& ns, const BlockKey& key, DirectoryEntry* entry) const;

  // Whether `entry` (from Find) is still published unchanged; check after
  // reading its bytes (see the header comment).
  bool StillPublished(const DirectoryEntry& entry) const;

  // True when a miss means the block is cached nowhere.
  bool MissesAreFinal() const;

  uint32_t slot_count() const { return header_->slot_count; }

 private:
  DirectoryReader(const DirectoryHeader* header, const DirectorySlot* slots) : header_(header), slots_(slots) {}

  const DirectoryHeader* header_;
  const DirectorySlot* slots_;
};

// Write side (kvtierd). Not thread-safe: the caller serializes every call.
// Borrows the mapping, which must outlive it.
class DirectoryWriter {
 public:
  // Formats `base` (DirectoryBytes(slot_count) bytes, zeroed) as an empty
  // directory. Precondition: slot_count is a power of two >= 2.
  DirectoryWriter(std::byte* base, uint32_t slot_count);

  // Publishes `key`. False (and counted as unpublished) when the table is
  // at its load limit (3/4 of the slots). Precondition: `key` is not published.
  bool Publish(const NamespaceFingerprint& ns, const BlockKey& key, uint64_t offset, uint64_t length,
               uint64_t checksum);
  // Withdraws a published `key` (it must be: Publish returned true).
  void Withdraw(const BlockKey& key);
  // A block Publish refused is gone.
  void ForgetUnpublished();
  void SetLowerTiers(bool present);

  uint64_t entries() const { return header_->entries.load(std::memory_order_relaxed); }
  uint64_t unpublished() const { return header_->unpublished.load(std::memory_order_relaxed); }
  uint32_t slot_count() const { return header_->slot_count; }

 private:
  // Writes `slot`'s fields under its seqlock (length 0 empties it).
  void Store(DirectorySlot& slot, const BlockKey& key, const NamespaceFingerprint& ns, uint64_t offset, uint64_t length,
             uint64_t checksum);
  uint32_t Home(const BlockKey& key) const { return static_cast<uint32_t>(key.lo) & mask_; }

  DirectoryHeader* header_;
  DirectorySlot* slots_;
  uint32_t mask_;
};

}  // namespace kvtier

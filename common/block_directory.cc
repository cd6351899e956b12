#include "common/block_directory.h"

#include <new>
#include <string>

#include "common/check.h"

namespace kvtier {
namespace {

// Rounds a Find may restart because the table changed under it before it
// answers kUnknown (each change is a few stores by the daemon).
constexpr int kFindAttempts = 64;

struct Snapshot {
  uint64_t seq = 0;
  BlockKey key;
  NamespaceFingerprint ns;
  uint64_t offset = 0, length = 0, checksum = 0;
};

// Reads `slot` under its seqlock; false when a write was in progress or
// happened meanwhile (the caller retries).
bool ReadSlot(const DirectorySlot& slot, Snapshot& out) {
  out.seq = slot.seq.load(std::memory_order_acquire);
  if (out.seq & 1) return false;
  out.key.hi = slot.key_hi.load(std::memory_order_relaxed);
  out.key.lo = slot.key_lo.load(std::memory_order_relaxed);
  out.ns.hi = slot.ns_hi.load(std::memory_order_relaxed);
  out.ns.lo = slot.ns_lo.load(std::memory_order_relaxed);
  out.offset = slot.offset.load(std::memory_order_relaxed);
  out.length = slot.length.load(std::memory_order_relaxed);
  out.checksum = slot.checksum.load(std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_acquire);
  return slot.seq.load(std::memory_order_relaxed) == out.seq;
}

}  // namespace

Result<DirectoryReader> DirectoryReader::Attach(const std::byte* base, size_t bytes) {
  if (base == nullptr || bytes < sizeof(DirectoryHeader)) {
    return ProtocolError("block directory of " + std::to_string(bytes) + " bytes is smaller than its header");
  }
  const auto* header = reinterpret_cast<const DirectoryHeader*>(base);
  if (header->magic != kDirectoryMagic || header->version != kDirectoryVersion) {
    return ProtocolError("block directory has magic " + std::to_string(header->magic) + " version " +
                         std::to_string(header->version) + ", expected version " + std::to_string(kDirectoryVersion));
  }
  const uint32_t slots = header->slot_count;
  if (slots < 2 || (slots & (slots - 1)) != 0 || DirectoryBytes(slots) > bytes) {
    return ProtocolError("block directory announces " + std::to_string(slots) + " slots in " + std::to_string(bytes) +
                         " bytes");
  }
  return DirectoryReader(header, reinterpret_cast<const DirectorySlot*>(base + sizeof(DirectoryHeader)));
}

DirectoryReader::Outcome DirectoryReader::Find(const NamespaceFingerprint& ns, const BlockKey& key,
                                               DirectoryEntry* entry) const {
  const uint32_t mask = header_->slot_count - 1;
  for (int attempt = 0; attempt < kFindAttempts; ++attempt) {
    const uint64_t epoch = header_->shift_epoch.load(std::memory_order_acquire);
    if (epoch & 1) continue;  // a shift is running: its few stores end soon
    bool torn = false;
    uint32_t i = static_cast<uint32_t>(key.lo) & mask;
    for (uint32_t probes = 0; probes <= mask; ++probes, i = (i + 1) & mask) {
      Snapshot s;
      if (!ReadSlot(slots_[i], s)) {
        torn = true;
        break;
      }
      if (s.length == 0) break;
      if (s.key != key) continue;
      if (s.ns != ns) return Outcome::kMiss;
      *entry = DirectoryEntry{s.offset, s.length, s.checksum, i, s.seq};
      return Outcome::kHit;
    }
    if (torn) continue;
    // A miss is only trustworthy if no shift moved entries meanwhile.
    std::atomic_thread_fence(std::memory_order_acquire);
    if (header_->shift_epoch.load(std::memory_order_relaxed) == epoch) return Outcome::kMiss;
  }
  return Outcome::kUnknown;
}

bool DirectoryReader::StillPublished(const DirectoryEntry& entry) const {
  // Orders the caller's reads of the block bytes before the seq re-check.
  std::atomic_thread_fence(std::memory_order_acquire);
  return slots_[entry.slot].seq.load(std::memory_order_relaxed) == entry.seq;
}

bool DirectoryReader::MissesAreFinal() const {
  return header_->lower_tiers.load(std::memory_order_acquire) == 0 &&
         header_->unpublished.load(std::memory_order_acquire) == 0;
}

DirectoryWriter::DirectoryWriter(std::byte* base, uint32_t slot_count)
    : header_(new (base) DirectoryHeader()),
      slots_(reinterpret_cast<DirectorySlot*>(base + sizeof(DirectoryHeader))),
      mask_(slot_count - 1) {
  KVTIER_CHECK(slot_count >= 2 && (slot_count & (slot_count - 1)) == 0, "directory slot count must be a power of two");
  for (uint32_t i = 0; i < slot_count; ++i) new (&slots_[i]) DirectorySlot();
  header_->version = kDirectoryVersion;
  header_->slot_count = slot_count;
  // The magic last: a reader never accepts a half-formatted directory.
  std::atomic_thread_fence(std::memory_order_release);
  header_->magic = kDirectoryMagic;
}

void DirectoryWriter::Store(DirectorySlot& slot, const BlockKey& key, const NamespaceFingerprint& ns, uint64_t offset,
                            uint64_t length, uint64_t checksum) {
  const uint64_t seq = slot.seq.load(std::memory_order_relaxed);
  slot.seq.store(seq + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);  // odd seq before any field changes
  slot.key_hi.store(key.hi, std::memory_order_relaxed);
  slot.key_lo.store(key.lo, std::memory_order_relaxed);
  slot.ns_hi.store(ns.hi, std::memory_order_relaxed);
  slot.ns_lo.store(ns.lo, std::memory_order_relaxed);
  slot.offset.store(offset, std::memory_order_relaxed);
  slot.length.store(length, std::memory_order_relaxed);
  slot.checksum.store(checksum, std::memory_order_relaxed);
  slot.seq.store(seq + 2, std::memory_order_release);
}

bool DirectoryWriter::Publish(const NamespaceFingerprint& ns, const BlockKey& key, uint64_t offset, uint64_t length,
                              uint64_t checksum) {
  KVTIER_CHECK(length > 0, "a published block has bytes");
  const uint64_t limit = (uint64_t{mask_} + 1) / 4 * 3;
  if (entries() + 1 > limit) {
    header_->unpublished.fetch_add(1, std::memory_order_release);
    return false;
  }
  uint32_t i = Home(key);
  while (slots_[i].length.load(std::memory_order_relaxed) != 0) {
    KVTIER_CHECK(slots_[i].key_lo.load(std::memory_order_relaxed) != key.lo ||
                     slots_[i].key_hi.load(std::memory_order_relaxed) != key.hi,
                 "block published twice");
    i = (i + 1) & mask_;
  }
  Store(slots_[i], key, ns, offset, length, checksum);
  header_->entries.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void DirectoryWriter::Withdraw(const BlockKey& key) {
  uint32_t i = Home(key);
  for (;; i = (i + 1) & mask_) {
    KVTIER_CHECK(slots_[i].length.load(std::memory_order_relaxed) != 0, "withdrawing an unpublished block");
    if (slots_[i].key_lo.load(std::memory_order_relaxed) == key.lo &&
        slots_[i].key_hi.load(std::memory_order_relaxed) == key.hi) {
      break;
    }
  }
  const uint64_t epoch = header_->shift_epoch.load(std::memory_order_relaxed);
  header_->shift_epoch.store(epoch + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);  // odd epoch before any slot changes
  // Backward shift: pull each later entry of the cluster that may live at
  // the hole (its home is not cyclically within (hole, j]) into the hole.
  for (uint32_t j = (i + 1) & mask_; slots_[j].length.load(std::memory_order_relaxed) != 0; j = (j + 1) & mask_) {
    BlockKey moved{slots_[j].key_hi.load(std::memory_order_relaxed), slots_[j].key_lo.load(std::memory_order_relaxed)};
    const uint32_t home = Home(moved);
    const bool home_in_gap = i <= j ? (home > i && home <= j) : (home > i || home <= j);
    if (home_in_gap) continue;
    const DirectorySlot& from = slots_[j];
    Store(slots_[i], moved,
          NamespaceFingerprint{from.ns_hi.load(std::memory_order_relaxed), from.ns_lo.load(std::memory_order_relaxed)},
          from.offset.load(std::memory_order_relaxed), from.length.load(std::memory_order_relaxed),
          from.checksum.load(std::memory_order_relaxed));
    i = j;
  }
  Store(slots_[i], BlockKey{}, NamespaceFingerprint{}, 0, 0, 0);
  header_->shift_epoch.store(epoch + 2, std::memory_order_release);
  header_->entries.fetch_sub(1, std::memory_order_relaxed);
}

void DirectoryWriter::ForgetUnpublished() {
  KVTIER_CHECK(unpublished() > 0, "no unpublished block to forget");
  header_->unpublished.fetch_sub(1, std::memory_order_release);
}

void DirectoryWriter::SetLowerTiers(bool present) {
  header_->lower_tiers.store(present ? 1 : 0, std::memory_order_release);
}

}  // namespace kvtier

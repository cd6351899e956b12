// HostDirectory: the block directory (common/block_directory.h) of the host
// tier, in its own memfd that clients map read-only. kvtierd publishes
// every committed host block here and withdraws it before its extent is
// freed, so clients can serve lookups and copying gets of host blocks
// without a round trip.
#pragma once

#include <cstdint>
#include <memory>

#include "common/block_directory.h"
#include "common/counters.h"
#include "common/mutex.h"
#include "kvtier/result.h"

namespace kvtier {

// Thread-safe (one internal mutex, a leaf in any lock order).
class HostDirectory {
 public:
  // Slots for an arena of `arena_bytes` when the operator gives none: enough
  // for blocks averaging 64 KiB at the table's 3/4 load limit, a power of
  // two in [1024, 2^24].
  static uint32_t DefaultSlots(uint64_t arena_bytes);

  // Creates the memfd (DirectoryBytes(slots) bytes), maps and formats it,
  // then seals it against growing, shrinking and any new writable mapping
  // (F_SEAL_FUTURE_WRITE: clients can only map it read-only).
  // InvalidArgument unless `slots` is a power of two in [2, 2^26]; IoError
  // when a system call fails.
  static Result<std::unique_ptr<HostDirectory>> Open(uint32_t slots);
  ~HostDirectory();

  HostDirectory(const HostDirectory&) = delete;
  HostDirectory& operator=(const HostDirectory&) = delete;

  // See DirectoryWriter. Publish returns false when the table is full (the
  // block is served through the daemon only).
  bool Publish(const NamespaceFingerprint& ns, const BlockKey& key, uint64_t offset, uint64_t length,
               uint64_t checksum);
  void Withdraw(const BlockKey& key);
  void ForgetUnpublished();
  // Whether the daemon has tiers below the host (then no miss is final).
  void SetLowerTiers(bool present);

  int fd() const { return fd_; }  // owned by this object
  uint64_t bytes() const { return bytes_; }

  // host.directory.{slots, entries, unpublished, bytes}.
  void VisitCounters(CounterVisitor& v) const;

 private:
  HostDirectory(int fd, std::byte* base, uint64_t bytes, uint32_t slots)
      : fd_(fd), base_(base), bytes_(bytes), writer_(base, slots) {}

  const int fd_;
  std::byte* const base_;
  const uint64_t bytes_;
  mutable Mutex mu_;
  DirectoryWriter writer_ GUARDED_BY(mu_);
};

}  // namespace kvtier

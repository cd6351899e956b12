// StagingPool: page-aligned memory that every NVMe-tier I/O goes through
// (O_DIRECT needs aligned buffers; records need a header in front of the
// payload). Allocated and pre-faulted once, registered with the device as
// fixed buffers, carved into extents with the arena allocator's size
// classes.
//
// Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>

#include "common/mutex.h"
#include "tiers/host/arena_allocator.h"
#include "tiers/nvme/block_device.h"

namespace kvtier {

class StagingPool {
 public:
  // Maps `bytes` (rounded up to 4 KiB) and registers them with `device`
  // (borrowed; must outlive I/O on the pool). A device that refuses the
  // registration (e.g. RLIMIT_MEMLOCK) is logged and used without fixed
  // buffers. Errors: InvalidArgument (0 bytes), NoSpace (mmap failed).
  static Result<std::unique_ptr<StagingPool>> Create(uint64_t bytes, BlockDevice& device);
  ~StagingPool();

  // An aligned span of at least `bytes` (its whole size class), or nullopt
  // when the pool has no room now.
  std::optional<std::span<std::byte>> Allocate(uint64_t bytes);
  // Returns a span exactly as Allocate handed it out.
  void Free(std::span<std::byte> span);

  uint64_t capacity_bytes() const { return bytes_; }
  void VisitCounters(CounterVisitor& visitor) const;

 private:
  StagingPool(std::byte* base, uint64_t bytes) : base_(base), bytes_(bytes), allocator_(bytes) {}

  std::byte* const base_;
  const uint64_t bytes_;
  mutable Mutex mu_;
  ArenaAllocator allocator_ GUARDED_BY(mu_);
  int64_t exhausted_ GUARDED_BY(mu_) = 0;
};

}  // namespace kvtier

// RangeAllocator: the offset allocator inside a DevicePool (and the HBM
// tier's pinned staging). Pure bookkeeping of [offset, offset + length)
// ranges of a fixed capacity; it knows nothing about memory, so it is
// tested without a GPU. No CUDA header.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <utility>

#include "kvtier/result.h"

namespace kvtier::gpu {

// Best fit over a free list of ranges: Allocate takes the smallest free
// range that fits (the lowest offset among equals) and carves the request
// from its front; Free puts the range back and merges it with free
// neighbours, so two adjacent free ranges never exist. Every offset and
// length is a multiple of `alignment_bytes` (a power of two; 256 by
// default, what cudaMalloc guarantees and coalesced access wants).
// Allocate and Free are O(log n) in the number of free and live ranges.
//
// Not thread-safe: the owner serializes calls (DevicePool holds a mutex).
class RangeAllocator {
 public:
  static constexpr uint64_t kDefaultAlignmentBytes = 256;

  // Manages [0, capacity_bytes rounded down to the alignment). Precondition:
  // alignment_bytes is a power of two (else it is replaced by the default).
  explicit RangeAllocator(uint64_t capacity_bytes, uint64_t alignment_bytes = kDefaultAlignmentBytes);

  // The offset of a free range of `bytes` rounded up to the alignment.
  // Errors: InvalidArgument (0 bytes, or more than the capacity), NoSpace
  // (no free range is large enough now: full, or too fragmented).
  Result<uint64_t> Allocate(uint64_t bytes);

  // Returns the range that Allocate handed out at `offset`. Errors:
  // InvalidArgument (no live range starts there: a double or a wild free;
  // nothing changes).
  Status Free(uint64_t offset);

  // The length (rounded) of the live range at `offset`, or 0.
  uint64_t LengthAt(uint64_t offset) const;

  uint64_t capacity_bytes() const { return capacity_; }
  uint64_t alignment_bytes() const { return alignment_; }
  uint64_t used_bytes() const { return used_; }
  uint64_t free_bytes() const { return capacity_ - used_; }
  // The largest request that would succeed now.
  uint64_t largest_free_bytes() const;
  size_t free_ranges() const { return free_by_offset_.size(); }
  size_t live_ranges() const { return live_.size(); }

 private:
  void InsertFree(uint64_t offset, uint64_t length);
  void EraseFree(std::map<uint64_t, uint64_t>::iterator it);

  uint64_t alignment_;
  uint64_t capacity_;
  uint64_t used_ = 0;
  std::map<uint64_t, uint64_t> free_by_offset_;           // offset -> length
  std::set<std::pair<uint64_t, uint64_t>> free_by_size_;  // (length, offset)
  std::map<uint64_t, uint64_t> live_;                     // offset -> length
};

}  // namespace kvtier::gpu

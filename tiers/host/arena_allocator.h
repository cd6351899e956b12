// ArenaAllocator: bookkeeping of byte ranges inside an arena. It knows nothing
// about memory; HostTier pairs it with a HostArena.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>

#include "common/counters.h"

namespace kvtier {

// Hands out [offset, offset + length) ranges of an arena of capacity_bytes,
// from its first usable_bytes() (all of it unless the arena is still being
// allocated: Grow moves the boundary up as it is).
//
// Sizes are rounded up to size classes (ClassSize) so that a freed range is
// reusable by a later block of the same class and fragmentation stays
// bounded. Free ranges are kept out of band, indexed by offset (to coalesce
// with neighbours on Free) and by (length, offset) (best fit: the smallest
// free range that fits, lowest offset among equals). Allocate and Free are
// O(log n) in the number of free ranges / live extents.
//
// Not thread-safe: the caller serializes every call (HostTier holds a mutex).
class ArenaAllocator {
 public:
  // Every offset and length is a multiple of this.
  static constexpr uint64_t kAlignmentBytes = 4096;
  // Up to here classes are multiples of kAlignmentBytes; above it there are
  // kClassesPerDoubling geometric classes per power of two.
  static constexpr uint64_t kLinearClassLimitBytes = 64 * 1024;
  static constexpr uint64_t kClassesPerDoubling = 4;
  // ClassSize accepts requests up to here (far beyond any real arena).
  static constexpr uint64_t kMaxRequestBytes = uint64_t{1} << 62;

  // A live range. `length` is the class size, not the requested size.
  struct Extent {
    uint64_t offset = 0;
    uint64_t length = 0;
    friend bool operator==(const Extent&, const Extent&) = default;
  };

  // `capacity_bytes` is rounded down to kAlignmentBytes (0 is allowed: every
  // Allocate then fails). Only the first `usable_bytes` (rounded down, at
  // most the capacity) are handed out or claimed until Grow.
  explicit ArenaAllocator(uint64_t capacity_bytes, uint64_t usable_bytes = UINT64_MAX);

  ArenaAllocator(const ArenaAllocator&) = delete;
  ArenaAllocator& operator=(const ArenaAllocator&) = delete;

  // The size a request of `bytes` occupies: `bytes` rounded up to a multiple
  // of 4 KiB up to 64 KiB; above that, to the next of 4 classes per doubling
  // (64K, 80K, 96K, 112K, 128K, 160K, ...). Always >= bytes, a multiple of
  // kAlignmentBytes, monotonic in `bytes`, and at most 25% above `bytes` once
  // bytes > 64 KiB. Precondition (checked): 0 < bytes <= kMaxRequestBytes.
  static uint64_t ClassSize(uint64_t bytes);

  // Reserves ClassSize(bytes) bytes from the best-fitting free range.
  // Returns nullopt (and counts a failed allocation) when bytes == 0,
  // bytes > capacity_bytes(), or no free range is large enough.
  std::optional<Extent> Allocate(uint64_t bytes);

  // Reserves exactly `e` (a restart's adoption: the extent a previous
  // allocator handed out). False, changing nothing, unless `e` is aligned,
  // non-empty, inside the usable part and entirely free.
  bool Claim(Extent e);

  // Returns `e` (exactly as Allocate or Claim returned it) to the free ranges,
  // coalescing with free neighbours. Aborts (KVTIER_CHECK) on a double free
  // or an extent this allocator did not hand out.
  void Free(Extent e);

  // The usable part becomes the first `usable_bytes` (rounded down, at
  // most the capacity); a smaller value changes nothing.
  void Grow(uint64_t usable_bytes);

  uint64_t capacity_bytes() const { return capacity_bytes_; }
  uint64_t usable_bytes() const { return usable_bytes_; }
  // Sum of the class sizes of live extents; used + free == usable.
  uint64_t used_bytes() const { return used_bytes_; }
  uint64_t free_bytes() const { return usable_bytes_ - used_bytes_; }
  // The longest free range; an Allocate whose class fits in it succeeds.
  uint64_t largest_free_bytes() const;
  // Number of live extents.
  size_t allocations() const { return live_.size(); }

  // host.alloc.{used_bytes, free_bytes, largest_free_bytes, allocations,
  // failed_allocations}.
  void VisitCounters(CounterVisitor& v) const;

 private:
  void InsertFree(uint64_t offset, uint64_t length);
  void EraseFree(std::map<uint64_t, uint64_t>::iterator it);

  uint64_t capacity_bytes_;
  uint64_t usable_bytes_;
  uint64_t used_bytes_ = 0;
  uint64_t failed_allocations_ = 0;
  // Free ranges: offset -> length, and (length, offset) for best fit. Both
  // always hold the same ranges; no two free ranges touch (coalesced).
  std::map<uint64_t, uint64_t> free_by_offset_;
  std::set<std::pair<uint64_t, uint64_t>> free_by_length_;
  // Live extents: offset -> length, to detect double and foreign frees.
  std::unordered_map<uint64_t, uint64_t> live_;
};

}  // namespace kvtier

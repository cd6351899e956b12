#include "gpu/range_allocator.h"

#include <iterator>
#include <string>

namespace kvtier::gpu {
namespace {

bool IsPowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

}  // namespace

RangeAllocator::RangeAllocator(uint64_t capacity_bytes, uint64_t alignment_bytes)
    : alignment_(IsPowerOfTwo(alignment_bytes) ? alignment_bytes : kDefaultAlignmentBytes),
      capacity_(capacity_bytes & ~(alignment_ - 1)) {
  if (capacity_ > 0) InsertFree(0, capacity_);
}

Result<uint64_t> RangeAllocator::Allocate(uint64_t bytes) {
  if (bytes == 0) return InvalidArgument("cannot allocate 0 bytes");
  if (bytes > capacity_) {
    return InvalidArgument("request of " + std::to_string(bytes) + " bytes exceeds the capacity of " +
                           std::to_string(capacity_));
  }
  const uint64_t length = (bytes + alignment_ - 1) & ~(alignment_ - 1);
  auto fit = free_by_size_.lower_bound({length, 0});
  if (fit == free_by_size_.end()) {
    return NoSpace("no free range of " + std::to_string(length) + " bytes (" + std::to_string(free_bytes()) +
                   " free in " + std::to_string(free_ranges()) + " ranges)");
  }
  const auto [range_length, offset] = *fit;
  EraseFree(free_by_offset_.find(offset));
  if (range_length > length) InsertFree(offset + length, range_length - length);
  live_.emplace(offset, length);
  used_ += length;
  return offset;
}

Status RangeAllocator::Free(uint64_t offset) {
  auto live = live_.find(offset);
  if (live == live_.end()) return InvalidArgument("no live range at offset " + std::to_string(offset));
  const uint64_t end = offset + live->second;
  used_ -= live->second;
  live_.erase(live);
  uint64_t start = offset;
  // Merge with the free range that starts where this one ends...
  auto next = free_by_offset_.find(end);
  uint64_t merged_end = end;
  if (next != free_by_offset_.end()) {
    merged_end += next->second;
    EraseFree(next);
  }
  // ...and with the one that ends where it starts.
  auto after = free_by_offset_.lower_bound(start);
  if (after != free_by_offset_.begin()) {
    auto prev = std::prev(after);
    if (prev->first + prev->second == start) {
      start = prev->first;
      EraseFree(prev);
    }
  }
  InsertFree(start, merged_end - start);
  return Status::Ok();
}

uint64_t RangeAllocator::LengthAt(uint64_t offset) const {
  auto it = live_.find(offset);
  return it == live_.end() ? 0 : it->second;
}

uint64_t RangeAllocator::largest_free_bytes() const {
  return free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
}

void RangeAllocator::InsertFree(uint64_t offset, uint64_t length) {
  free_by_offset_.emplace(offset, length);
  free_by_size_.emplace(length, offset);
}

void RangeAllocator::EraseFree(std::map<uint64_t, uint64_t>::iterator it) {
  free_by_size_.erase({it->second, it->first});
  free_by_offset_.erase(it);
}

}  // namespace kvtier::gpu

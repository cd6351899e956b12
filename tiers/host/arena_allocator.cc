#include "tiers/host/arena_allocator.h"

#include <algorithm>
#include <bit>
#include <iterator>

#include "common/check.h"

namespace kvtier {
namespace {

uint64_t RoundUp(uint64_t value, uint64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

}  // namespace

ArenaAllocator::ArenaAllocator(uint64_t capacity_bytes, uint64_t usable_bytes)
    : capacity_bytes_(capacity_bytes / kAlignmentBytes * kAlignmentBytes),
      usable_bytes_(std::min(capacity_bytes_, usable_bytes / kAlignmentBytes * kAlignmentBytes)) {
  if (usable_bytes_ > 0) InsertFree(0, usable_bytes_);
}

void ArenaAllocator::Grow(uint64_t usable_bytes) {
  const uint64_t usable = std::min(capacity_bytes_, usable_bytes / kAlignmentBytes * kAlignmentBytes);
  if (usable <= usable_bytes_) return;
  uint64_t offset = usable_bytes_;
  // Merge with the free range that ends at the old boundary.
  if (!free_by_offset_.empty()) {
    auto last = std::prev(free_by_offset_.end());
    if (last->first + last->second == offset) {
      offset = last->first;
      EraseFree(last);
    }
  }
  InsertFree(offset, usable - offset);
  usable_bytes_ = usable;
}

uint64_t ArenaAllocator::ClassSize(uint64_t bytes) {
  KVTIER_CHECK(bytes > 0 && bytes <= kMaxRequestBytes, "ClassSize needs 0 < bytes <= kMaxRequestBytes");
  if (bytes <= kLinearClassLimitBytes) return RoundUp(bytes, kAlignmentBytes);
  // bytes lies in [p, 2p) with p >= 64 KiB; classes there are p + k * p/4.
  // p/4 >= 16 KiB is a power of two, hence a multiple of kAlignmentBytes.
  const uint64_t p = std::bit_floor(bytes);
  return RoundUp(bytes, p / kClassesPerDoubling);
}

std::optional<ArenaAllocator::Extent> ArenaAllocator::Allocate(uint64_t bytes) {
  if (bytes == 0 || bytes > usable_bytes_) {
    ++failed_allocations_;
    return std::nullopt;
  }
  const uint64_t length = ClassSize(bytes);
  // Best fit: the shortest free range with length >= `length`.
  auto fit = free_by_length_.lower_bound({length, 0});
  if (fit == free_by_length_.end()) {
    ++failed_allocations_;
    return std::nullopt;
  }
  const auto [range_length, range_offset] = *fit;
  EraseFree(free_by_offset_.find(range_offset));
  if (range_length > length) {
    InsertFree(range_offset + length, range_length - length);
  }
  live_.emplace(range_offset, length);
  used_bytes_ += length;
  return Extent{range_offset, length};
}

bool ArenaAllocator::Claim(Extent e) {
  if (e.length == 0 || e.offset % kAlignmentBytes != 0 || e.length % kAlignmentBytes != 0 || e.offset > usable_bytes_ ||
      e.length > usable_bytes_ - e.offset) {
    return false;
  }
  // The free range that starts at or before e.offset must cover all of e.
  auto range = free_by_offset_.upper_bound(e.offset);
  if (range == free_by_offset_.begin()) return false;
  range = std::prev(range);
  const auto [range_offset, range_length] = *range;
  if (range_offset + range_length < e.offset + e.length) return false;
  EraseFree(range);
  if (range_offset < e.offset) InsertFree(range_offset, e.offset - range_offset);
  if (range_offset + range_length > e.offset + e.length) {
    InsertFree(e.offset + e.length, range_offset + range_length - (e.offset + e.length));
  }
  live_.emplace(e.offset, e.length);
  used_bytes_ += e.length;
  return true;
}

void ArenaAllocator::Free(Extent e) {
  auto live = live_.find(e.offset);
  KVTIER_CHECK(live != live_.end(), "Free of an extent that is not live (double free or foreign)");
  KVTIER_CHECK(live->second == e.length, "Free of an extent whose length differs from the allocation");
  live_.erase(live);
  used_bytes_ -= e.length;

  uint64_t offset = e.offset;
  uint64_t length = e.length;
  // Merge with the free range that ends where this one starts.
  auto next = free_by_offset_.lower_bound(offset);
  if (next != free_by_offset_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      offset = prev->first;
      length += prev->second;
      EraseFree(prev);
    }
  }
  // Merge with the free range that starts where this one ends.
  if (next != free_by_offset_.end() && next->first == e.offset + e.length) {
    length += next->second;
    EraseFree(next);
  }
  InsertFree(offset, length);
}

uint64_t ArenaAllocator::largest_free_bytes() const {
  return free_by_length_.empty() ? 0 : free_by_length_.rbegin()->first;
}

void ArenaAllocator::VisitCounters(CounterVisitor& v) const {
  v.VisitGauge("host.alloc.used_bytes", static_cast<int64_t>(used_bytes()));
  v.VisitGauge("host.alloc.free_bytes", static_cast<int64_t>(free_bytes()));
  v.VisitGauge("host.alloc.largest_free_bytes", static_cast<int64_t>(largest_free_bytes()));
  v.Visit("host.alloc.allocations", static_cast<int64_t>(allocations()));
  v.Visit("host.alloc.failed_allocations", static_cast<int64_t>(failed_allocations_));
}

void ArenaAllocator::InsertFree(uint64_t offset, uint64_t length) {
  free_by_offset_.emplace(offset, length);
  free_by_length_.emplace(length, offset);
}

void ArenaAllocator::EraseFree(std::map<uint64_t, uint64_t>::iterator it) {
  free_by_length_.erase({it->second, it->first});
  free_by_offset_.erase(it);
}

}  // namespace kvtier

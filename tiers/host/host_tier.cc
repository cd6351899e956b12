#include "tiers/host/host_tier.h"

#include <string>
#include <utility>

#include "common/check.h"

namespace kvtier {

Result<std::unique_ptr<HostTier>> HostTier::Open(const HostArenaOptions& o, uint32_t directory_slots) {
  if (o.capacity_bytes < ArenaAllocator::kAlignmentBytes) {
    return InvalidArgument("host tier capacity_bytes " + std::to_string(o.capacity_bytes) +
                           " is below the minimum of " + std::to_string(ArenaAllocator::kAlignmentBytes));
  }
  auto arena = HostArena::Open(o);
  if (!arena.ok()) return arena.status();
  std::unique_ptr<HostDirectory> directory;
  if (directory_slots > 0) {
    auto opened = HostDirectory::Open(directory_slots);
    if (!opened.ok()) return opened.status();
    directory = std::move(*opened);
  }
  return std::unique_ptr<HostTier>(new HostTier(std::move(*arena), std::move(directory)));
}

HostTier::HostTier(std::unique_ptr<HostArena> arena, std::unique_ptr<HostDirectory> directory)
    : arena_(std::move(arena)),
      directory_(std::move(directory)),
      capacity_bytes_(arena_->capacity_bytes() / ArenaAllocator::kAlignmentBytes * ArenaAllocator::kAlignmentBytes),
      allocator_(arena_->capacity_bytes()) {}

Result<HostTier::Extent> HostTier::Allocate(uint64_t bytes) {
  if (!CanEverHold(bytes)) {
    return InvalidArgument("host tier allocation of " + std::to_string(bytes) +
                           " bytes can never fit: its size class must be at most the " +
                           std::to_string(capacity_bytes_) + "-byte arena");
  }
  uint64_t free_bytes = 0;
  uint64_t largest_free_bytes = 0;
  {
    MutexLock lock(mu_);
    if (auto extent = allocator_.Allocate(bytes)) return *extent;
    free_bytes = allocator_.free_bytes();
    largest_free_bytes = allocator_.largest_free_bytes();
  }
  return NoSpace("host tier cannot allocate " + std::to_string(bytes) + " bytes (class " +
                 std::to_string(ArenaAllocator::ClassSize(bytes)) + "): free " + std::to_string(free_bytes) +
                 " bytes, largest free range " + std::to_string(largest_free_bytes) + " bytes");
}

bool HostTier::CanEverHold(uint64_t bytes) const {
  return bytes > 0 && bytes <= capacity_bytes_ && ArenaAllocator::ClassSize(bytes) <= capacity_bytes_;
}

void HostTier::Free(const Extent& e) {
  MutexLock lock(mu_);
  allocator_.Free(e);
}

std::span<std::byte> HostTier::Bytes(const Extent& e) const {
  KVTIER_CHECK(e.offset <= capacity_bytes_ && e.length <= capacity_bytes_ - e.offset, "extent outside the host arena");
  return {arena_->base() + e.offset, static_cast<size_t>(e.length)};
}

uint64_t HostTier::used_bytes() const {
  MutexLock lock(mu_);
  return allocator_.used_bytes();
}

void HostTier::VisitCounters(CounterVisitor& v) const {
  arena_->VisitCounters(v);
  {
    MutexLock lock(mu_);
    allocator_.VisitCounters(v);
  }
  if (directory_ != nullptr) directory_->VisitCounters(v);
}

void HostTier::CheckHealth(HealthFindings& out) const {
  if (!locked()) out.AddWarning("the host arena is not locked in memory (RLIMIT_MEMLOCK): the kernel may swap it");
  if (arena_->warm_failed()) {
    out.AddWarning("the host arena's warm-up stopped at " + std::to_string(arena_->warm_bytes()) + " of " +
                   std::to_string(arena_->capacity_bytes()) +
                   " bytes (see the log): the rest is mapped as it is written");
  }
}

}  // namespace kvtier

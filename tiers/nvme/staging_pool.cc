#include "tiers/nvme/staging_pool.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>
#include <sys/mman.h>

#include "common/logging.h"

namespace kvtier {

Result<std::unique_ptr<StagingPool>> StagingPool::Create(uint64_t bytes, BlockDevice& device) {
  if (bytes == 0) return InvalidArgument("nvme staging pool of 0 bytes");
  bytes =
      (bytes + ArenaAllocator::kAlignmentBytes - 1) / ArenaAllocator::kAlignmentBytes * ArenaAllocator::kAlignmentBytes;
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (p == MAP_FAILED) {
    return NoSpace("cannot map " + std::to_string(bytes) + " bytes of nvme staging memory: " + std::strerror(errno));
  }
  std::unique_ptr<StagingPool> pool(new StagingPool(static_cast<std::byte*>(p), bytes));
  // io_uring takes at most 1 GiB per fixed buffer: register in chunks (an
  // I/O that straddles two chunks simply goes without the fixed buffer).
  constexpr uint64_t kChunk = 1ull << 30;
  std::vector<std::span<std::byte>> chunks;
  for (uint64_t at = 0; at < bytes; at += kChunk) chunks.emplace_back(pool->base_ + at, std::min(kChunk, bytes - at));
  if (Status s = device.RegisterBuffers(chunks); !s.ok()) {
    spdlog::warn("nvme staging memory is not registered with the device ({}); I/O pins pages per request",
                 s.ToString());
  }
  return pool;
}

StagingPool::~StagingPool() { ::munmap(base_, bytes_); }

std::optional<std::span<std::byte>> StagingPool::Allocate(uint64_t bytes) {
  MutexLock lock(mu_);
  auto extent = allocator_.Allocate(bytes);
  if (!extent) {
    ++exhausted_;
    return std::nullopt;
  }
  return std::span<std::byte>(base_ + extent->offset, extent->length);
}

void StagingPool::Free(std::span<std::byte> span) {
  MutexLock lock(mu_);
  allocator_.Free(ArenaAllocator::Extent{static_cast<uint64_t>(span.data() - base_), span.size()});
}

void StagingPool::VisitCounters(CounterVisitor& v) const {
  MutexLock lock(mu_);
  v.VisitGauge("nvme.staging_used_bytes", static_cast<int64_t>(allocator_.used_bytes()));
  v.Visit("nvme.staging_exhausted", exhausted_);
}

}  // namespace kvtier

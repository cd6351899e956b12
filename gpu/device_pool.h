// DevicePool: the daemon's HBM, allocated once at start (one cudaMalloc)
// and carved by a RangeAllocator. Its one IPC handle goes to every client
// once (DeviceMapping opens it); after that only offsets move. No CUDA
// header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "common/mutex.h"
#include "gpu/ipc_handle.h"
#include "gpu/range_allocator.h"
#include "kvtier/result.h"

namespace kvtier::gpu {

// A range of the pool: device address base() + offset, `bytes` long
// (rounded up to the allocator's 256-byte alignment).
struct DeviceRange {
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

// Thread-safe (allocation under an internal leaf mutex). Owns the device
// allocation: the destructor frees it (cudaFree), so the pool must outlive
// every copy into or out of it, in this process and in every process that
// opened its handle (their DeviceMapping must be closed first: freeing
// memory another process still maps is undefined behaviour in CUDA).
class DevicePool {
 public:
  // Allocates `bytes` (rounded down to 256 B) on device `ordinal`.
  // Errors: InvalidArgument (under 256 bytes, bad ordinal), NoSpace (the
  // device has not that much free), Unavailable (no device or driver).
  static Result<std::unique_ptr<DevicePool>> Create(uint64_t bytes, int ordinal = 0);
  ~DevicePool();
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;

  // A range of at least `bytes`. Errors as RangeAllocator::Allocate:
  // InvalidArgument (0 or more than the pool), NoSpace (no room now).
  Result<DeviceRange> Allocate(uint64_t bytes) EXCLUDES(mu_);
  // Returns a range handed out by Allocate. The caller makes sure no copy
  // still in flight touches it (copies on one stream are ordered: a range
  // freed after enqueueing its last copy may be reused by a copy enqueued
  // later on that same stream). InvalidArgument for an unknown offset.
  Status Free(uint64_t offset) EXCLUDES(mu_);

  // The cudaIpcMemHandle_t of the whole allocation, for other processes
  // (offsets are relative to the allocation's start, base()). Errors:
  // Unavailable (IPC unsupported, e.g. no unified addressing), IoError.
  Result<IpcMemHandle> Export() const;

  // The device address of offset 0 (a device pointer: not dereferenceable
  // on the host).
  void* base() const { return base_; }
  // base() + offset, as a device pointer.
  void* At(uint64_t offset) const { return static_cast<std::byte*>(base_) + offset; }
  int ordinal() const { return ordinal_; }
  uint64_t capacity_bytes() const { return capacity_; }

  struct Usage {
    uint64_t used_bytes = 0;
    uint64_t largest_free_bytes = 0;
    size_t free_ranges = 0;
    size_t live_ranges = 0;
  };
  Usage usage() const EXCLUDES(mu_);

 private:
  DevicePool(void* base, uint64_t capacity, int ordinal)
      : base_(base), capacity_(capacity), ordinal_(ordinal), allocator_(capacity) {}

  void* const base_;
  const uint64_t capacity_;
  const int ordinal_;
  mutable Mutex mu_;  // a leaf
  RangeAllocator allocator_ GUARDED_BY(mu_);
};

}  // namespace kvtier::gpu

#include "gpu/device_pool.h"

#include <cstring>
#include <string>

#include "gpu/cuda_status.h"

namespace kvtier::gpu {

static_assert(sizeof(cudaIpcMemHandle_t) == kIpcHandleBytes, "cudaIpcMemHandle_t is not 64 bytes");

Result<std::unique_ptr<DevicePool>> DevicePool::Create(uint64_t bytes, int ordinal) {
  const uint64_t capacity = bytes & ~(RangeAllocator::kDefaultAlignmentBytes - 1);
  if (capacity == 0) return InvalidArgument("a device pool needs at least 256 bytes");
  if (Status s = CudaStatus(cudaSetDevice(ordinal), "cudaSetDevice(" + std::to_string(ordinal) + ")"); !s.ok()) {
    return s;
  }
  void* base = nullptr;
  if (Status s = CudaStatus(cudaMalloc(&base, capacity), "cudaMalloc(" + std::to_string(capacity) + " bytes)");
      !s.ok()) {
    return s;
  }
  return std::unique_ptr<DevicePool>(new DevicePool(base, capacity, ordinal));
}

DevicePool::~DevicePool() {
  // Errors here cannot be acted on (a sticky error already failed the
  // copies that hit it); the allocation goes with the context anyway.
  (void)cudaSetDevice(ordinal_);
  (void)cudaFree(base_);
}

Result<DeviceRange> DevicePool::Allocate(uint64_t bytes) {
  MutexLock lock(mu_);
  Result<uint64_t> offset = allocator_.Allocate(bytes);
  if (!offset.ok()) return offset.status();
  return DeviceRange{*offset, allocator_.LengthAt(*offset)};
}

Status DevicePool::Free(uint64_t offset) {
  MutexLock lock(mu_);
  return allocator_.Free(offset);
}

Result<IpcMemHandle> DevicePool::Export() const {
  if (Status s = CudaStatus(cudaSetDevice(ordinal_), "cudaSetDevice"); !s.ok()) return s;
  cudaIpcMemHandle_t handle;
  if (Status s = CudaStatus(cudaIpcGetMemHandle(&handle, base_), "cudaIpcGetMemHandle"); !s.ok()) return s;
  IpcMemHandle out;
  std::memcpy(out.bytes.data(), &handle, kIpcHandleBytes);
  return out;
}

DevicePool::Usage DevicePool::usage() const {
  MutexLock lock(mu_);
  return Usage{allocator_.used_bytes(), allocator_.largest_free_bytes(), allocator_.free_ranges(),
               allocator_.live_ranges()};
}

}  // namespace kvtier::gpu

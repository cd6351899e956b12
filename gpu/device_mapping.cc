#include "gpu/device_mapping.h"

#include <cstring>
#include <string>

#include "gpu/cuda_status.h"

namespace kvtier::gpu {

Result<std::unique_ptr<DeviceMapping>> DeviceMapping::Open(const IpcMemHandle& handle, uint64_t bytes, int ordinal) {
  if (bytes == 0) return InvalidArgument("a device mapping of 0 bytes");
  if (Status s = CudaStatus(cudaSetDevice(ordinal), "cudaSetDevice(" + std::to_string(ordinal) + ")"); !s.ok()) {
    return s;
  }
  cudaIpcMemHandle_t raw;
  static_assert(sizeof(raw) == kIpcHandleBytes);
  std::memcpy(&raw, handle.bytes.data(), kIpcHandleBytes);
  void* base = nullptr;
  if (Status s = CudaStatus(cudaIpcOpenMemHandle(&base, raw, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
      !s.ok()) {
    return s;
  }
  return std::unique_ptr<DeviceMapping>(new DeviceMapping(base, bytes, ordinal));
}

DeviceMapping::~DeviceMapping() {
  (void)cudaSetDevice(ordinal_);
  (void)cudaIpcCloseMemHandle(base_);  // nothing to do about a failure here
}

Result<void*> DeviceMapping::At(uint64_t offset, uint64_t length) const {
  if (offset > bytes_ || length > bytes_ - offset) {
    return InvalidArgument("range [" + std::to_string(offset) + ", +" + std::to_string(length) + ") is outside the " +
                           std::to_string(bytes_) + "-byte device pool");
  }
  return static_cast<void*>(static_cast<std::byte*>(base_) + offset);
}

}  // namespace kvtier::gpu

#include "gpu/device_probe.h"

#include <string>

#include "gpu/cuda_status.h"

namespace kvtier::gpu {

Result<int> DeviceCount() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    return Unavailable("no device: " + CudaStatus(error, "cudaGetDeviceCount").message());
  }
  if (count <= 0) return Unavailable("no device: cudaGetDeviceCount found none");
  return count;
}

Result<DeviceInfo> ProbeDevice(int ordinal) {
  Result<int> count = DeviceCount();
  if (!count.ok()) return count.status();
  if (ordinal < 0 || ordinal >= *count) {
    return InvalidArgument("device " + std::to_string(ordinal) + " does not exist (" + std::to_string(*count) +
                           " found)");
  }
  cudaDeviceProp prop{};
  if (Status s = CudaStatus(cudaGetDeviceProperties(&prop, ordinal), "cudaGetDeviceProperties"); !s.ok()) return s;
  DeviceInfo info;
  info.ordinal = ordinal;
  info.name = prop.name;
  info.compute_major = prop.major;
  info.compute_minor = prop.minor;
  info.total_bytes = prop.totalGlobalMem;
  info.unified_addressing = prop.unifiedAddressing != 0;
  int ipc_events = 0;
  if (Status s = CudaStatus(cudaDeviceGetAttribute(&ipc_events, cudaDevAttrIpcEventSupport, ordinal),
                            "cudaDeviceGetAttribute(IpcEventSupport)");
      !s.ok()) {
    return s;
  }
  info.ipc_events = ipc_events != 0;
  if (Status s = CudaStatus(cudaSetDevice(ordinal), "cudaSetDevice"); !s.ok()) return s;
  size_t free_bytes = 0, total_bytes = 0;
  if (Status s = CudaStatus(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo"); !s.ok()) return s;
  info.free_bytes = free_bytes;
  return info;
}

}  // namespace kvtier::gpu

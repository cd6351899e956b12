// Whether this process can use a GPU, asked once at start. No CUDA header.
//
// The daemon calls DeviceCount() before it builds the HBM tier: not ok
// means "run without the tier" and its message is the line to log
// ("no device: cudaErrorInsufficientDriver (CUDA driver version is
// insufficient for CUDA runtime version)" on a machine with the toolkit
// but no driver, which is what a CUDA build sees on a CPU-only host).
#pragma once

#include <cstdint>
#include <string>

#include "kvtier/result.h"

namespace kvtier::gpu {

// The number of CUDA devices (>= 1). Errors: Unavailable with a message
// starting "no device: " followed by the CUDA error (cudaGetDeviceCount
// failed) or "cudaGetDeviceCount found none". Never aborts; thread-safe.
Result<int> DeviceCount();

struct DeviceInfo {
  int ordinal = 0;
  std::string name;             // "NVIDIA H200"
  int compute_major = 0;        // compute capability
  int compute_minor = 0;
  uint64_t total_bytes = 0;     // device memory
  uint64_t free_bytes = 0;      // free now (cudaMemGetInfo)
  bool unified_addressing = false;  // CUDA IPC needs it
  bool ipc_events = false;          // cudaIpcGetEventHandle supported
};

// What the daemon logs about `ordinal` and checks before exporting IPC
// handles. Creates the device's primary context (cudaMemGetInfo needs it).
// Errors: Unavailable (no device, as DeviceCount), InvalidArgument (no
// such ordinal).
Result<DeviceInfo> ProbeDevice(int ordinal = 0);

}  // namespace kvtier::gpu

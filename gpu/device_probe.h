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
#include <string_view>

#include "kvtier/result.h"

namespace kvtier::gpu {

// The number of CUDA devices (>= 1). Errors: Unavailable with a message
// starting "no device: " followed by the CUDA error (cudaGetDeviceCount
// failed) or "cudaGetDeviceCount found none". Never aborts; thread-safe.
Result<int> DeviceCount();

struct DeviceInfo {
  int ordinal = 0;
  std::string name;       // "NVIDIA H200"
  int compute_major = 0;  // compute capability
  int compute_minor = 0;
  uint64_t total_bytes = 0;         // device memory
  uint64_t free_bytes = 0;          // free now (cudaMemGetInfo)
  bool unified_addressing = false;  // CUDA IPC needs it
  bool ipc_events = false;          // cudaIpcGetEventHandle supported
  // The PCI address, canonical (CanonicalPciBusId): "0000:3b:00.0". It
  // names the same GPU in every process, where ordinals do not
  // (CUDA_VISIBLE_DEVICES renumbers): what the daemon tells clients.
  std::string pci_bus_id;
};

// What the daemon logs about `ordinal` and checks before exporting IPC
// handles. Creates the device's primary context (cudaMemGetInfo needs it).
// Errors: Unavailable (no device, as DeviceCount), InvalidArgument (no
// such ordinal).
Result<DeviceInfo> ProbeDevice(int ordinal = 0);

// `bus_id` ("[domain]:bus:device.function", hexadecimal, any case; the
// domain may be left out, as CUDA accepts) in the one form ProbeDevice
// reports: lower case, domain of at least 4 digits, "0000:3b:00.0".
// InvalidArgument for anything else. Pure: needs no device.
Result<std::string> CanonicalPciBusId(std::string_view bus_id);

// This process's ordinal of the GPU at PCI address `bus_id` (any form
// CanonicalPciBusId accepts), e.g. the daemon's device pool's GPU.
// Errors: InvalidArgument (not a PCI address), Unavailable (no device, as
// DeviceCount), NotFound (no GPU at that address is visible to this
// process: another machine's, or hidden by CUDA_VISIBLE_DEVICES).
Result<int> OrdinalOfPciBusId(const std::string& bus_id);

}  // namespace kvtier::gpu

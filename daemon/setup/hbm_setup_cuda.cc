// hbm_setup.h with CUDA: probes the configured GPU, allocates the pool
// (CudaHbmDevice), exports its IPC handle once and builds the HbmTier.
#include <string>

#include "daemon/setup/hbm_setup.h"
#include "gpu/device_probe.h"
#include "tiers/hbm/cuda_hbm_device.h"
#include "tiers/hbm/hbm_tier.h"

namespace kvtier::internal {

Result<HbmSetup> OpenDeviceTier(const DaemonConfig& config) {
  Result<int> count = gpu::DeviceCount();
  if (!count.ok()) return count.status();
  const int ordinal = static_cast<int>(config.hbm_device);
  if (ordinal >= *count) {
    return InvalidArgument("hbm.device = " + std::to_string(ordinal) + ", but this process sees " +
                           std::to_string(*count) + " CUDA device(s)");
  }
  Result<gpu::DeviceInfo> info = gpu::ProbeDevice(ordinal);
  if (!info.ok()) return info.status();
  if (!info->unified_addressing) {
    return Unavailable("device " + std::to_string(ordinal) + " (" + info->name +
                       ") has no unified addressing, so its memory cannot be shared over CUDA IPC");
  }
  CudaHbmDeviceOptions options;
  options.ordinal = ordinal;
  options.pool_bytes = static_cast<uint64_t>(config.hbm_capacity_bytes);
  options.staging_bytes = static_cast<uint64_t>(config.hbm_staging_bytes);
  Result<std::unique_ptr<CudaHbmDevice>> device = CudaHbmDevice::Create(options);
  if (!device.ok()) {
    return Status(device.status().code(), "hbm.capacity_bytes = " + std::to_string(options.pool_bytes) + " on device " +
                                              std::to_string(ordinal) + " (" + std::to_string(info->free_bytes) +
                                              " bytes free): " + device.status().message());
  }
  Result<gpu::IpcMemHandle> handle = (*device)->pool().Export();
  if (!handle.ok()) return handle.status();
  HbmSetup setup;
  setup.offer.ipc_handle.assign(reinterpret_cast<const char*>(handle->bytes.data()), handle->bytes.size());
  setup.offer.bytes = (*device)->capacity_bytes();
  setup.offer.pci_bus_id = info->pci_bus_id;
  setup.description = std::to_string(setup.offer.bytes) + " bytes on device " + std::to_string(ordinal) + " (" +
                      info->name + ", " + info->pci_bus_id + "), " + std::to_string(options.staging_bytes) +
                      " bytes of pinned staging";
  Result<std::unique_ptr<HbmTier>> tier = HbmTier::Create(std::move(*device));
  if (!tier.ok()) return tier.status();
  setup.tier = std::move(*tier);
  return setup;
}

}  // namespace kvtier::internal

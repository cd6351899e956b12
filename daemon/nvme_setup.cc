#include "daemon/nvme_setup.h"

#include "common/logging.h"

namespace kvtier {

Result<std::unique_ptr<NvmeTier>> OpenNvmeTier(const DaemonConfig& config, Clock& clock) {
  if (config.nvme_path.empty()) return std::unique_ptr<NvmeTier>();
  BlockDeviceOptions device_options;
  device_options.path = config.nvme_path;
  device_options.capacity_bytes = static_cast<uint64_t>(config.nvme_capacity_bytes);
  device_options.direct_io = config.nvme_direct_io != 0;
  device_options.preallocate = config.nvme_preallocate != 0;
  device_options.queue_depth = static_cast<uint32_t>(config.nvme_queue_depth);
  device_options.io_threads = static_cast<uint32_t>(config.nvme_io_threads);
  auto engine = ParseIoEngine(config.nvme_io_engine);
  if (!engine.ok()) return engine.status();
  device_options.engine = *engine;
  auto device = OpenBlockDevice(device_options);
  if (!device.ok()) return device.status();
  const std::string index_path = config.nvme_index_path.empty() ? config.nvme_path + ".index" : config.nvme_index_path;
  auto index = NvmeIndex::Open(index_path, config.nvme_sync_index != 0);
  if (!index.ok()) return index.status();
  NvmeTierOptions options;
  options.region_bytes = static_cast<uint64_t>(config.nvme_region_bytes);
  options.staging_bytes = static_cast<uint64_t>(config.nvme_staging_bytes);
  options.reinsert_share = static_cast<double>(config.nvme_reinsert_percent) / 100.0;
  const std::string kind(device->get()->kind());
  auto tier = NvmeTier::Open(std::move(*device), std::move(*index), options, clock);
  if (!tier.ok()) return tier.status();
  const NvmeRecovery& r = (*tier)->recovery();
  spdlog::info("tier nvme: {} ({} bytes, {} I/O, index {}): {} blocks loaded, {} stale and {} corrupt dropped",
               config.nvme_path, (*tier)->device().capacity_bytes(), kind, index_path, r.entries_loaded,
               r.dropped_stale, r.dropped_corrupt);
  return tier;
}

}  // namespace kvtier

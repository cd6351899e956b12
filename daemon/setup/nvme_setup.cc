#include "daemon/setup/nvme_setup.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/logging.h"
#include "policy/policy_registry.h"

namespace kvtier {
namespace {

IoEngine IoEngineOf(NvmeIoEngine engine) {
  switch (engine) {
    case NvmeIoEngine::kAuto:
      return IoEngine::kAuto;
    case NvmeIoEngine::kIoUring:
      return IoEngine::kIoUring;
    case NvmeIoEngine::kThreads:
      return IoEngine::kThreads;
  }
  KVTIER_CHECK(false, "an nvme.io_engine outside its table");
  return IoEngine::kAuto;
}

}  // namespace

BlockDeviceOptions BlockDeviceOptionsFromConfig(const DaemonConfig& config) {
  BlockDeviceOptions device_options;
  device_options.path = config.nvme_path;
  device_options.capacity_bytes = static_cast<uint64_t>(config.nvme_capacity_bytes);
  device_options.direct_io = config.nvme_direct_io;
  device_options.preallocate = config.nvme_preallocate;
  device_options.queue_depth = static_cast<uint32_t>(config.nvme_queue_depth);
  device_options.io_threads = static_cast<uint32_t>(config.nvme_io_threads);
  device_options.engine = IoEngineOf(config.nvme_io_engine);
  return device_options;
}

NvmeTierOptions NvmeTierOptionsFromConfig(const DaemonConfig& config) {
  NvmeTierOptions options;
  options.region_bytes = static_cast<uint64_t>(config.nvme_region_bytes);
  options.staging_bytes = static_cast<uint64_t>(config.nvme_staging_bytes);
  options.reinsert_share = static_cast<double>(config.nvme_reinsert_percent) / 100.0;
  options.reclaim = *ParseReclaimOrder(EvictionPolicyName(config.nvme_eviction));  // every registry name has an order
  return options;
}

Result<std::unique_ptr<NvmeTier>> OpenNvmeTier(const DaemonConfig& config, Clock& clock) {
  if (config.nvme_path.empty()) return std::unique_ptr<NvmeTier>();
  auto device = OpenBlockDevice(BlockDeviceOptionsFromConfig(config));
  if (!device.ok()) return device.status();
  const std::string index_path = config.nvme_index_path.empty() ? config.nvme_path + ".index" : config.nvme_index_path;
  auto index = NvmeIndex::Open(index_path, config.nvme_sync_index);
  if (!index.ok()) return index.status();
  const NvmeTierOptions options = NvmeTierOptionsFromConfig(config);
  const std::string kind(device->get()->kind());
  auto tier = NvmeTier::Open(std::move(*device), std::move(*index), options, clock);
  if (!tier.ok()) return tier.status();
  const NvmeRecovery& r = (*tier)->recovery();
  spdlog::info(
      "tier nvme: {} ({} bytes, {} I/O, index {}, eviction {}): {} blocks loaded, {} stale and {} corrupt "
      "dropped",
      config.nvme_path, (*tier)->device().capacity_bytes(), kind, index_path, ReclaimOrderName(options.reclaim),
      r.entries_loaded, r.dropped_stale, r.dropped_corrupt);
  return tier;
}

namespace {

// "<what>: <strerror(error)>", built by appending (GCC 12 warns falsely
// about a chain of operator+ here).
Status SizeError(std::string what, int error) {
  what += ": ";
  what += std::strerror(error);
  return IoError(std::move(what));
}

// The size of what holds `path`: a block device, or the file system of a
// file (which need not exist yet; its directory must).
Result<uint64_t> DriveBytes(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISBLK(st.st_mode)) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return SizeError("cannot open " + path + " to size it", errno);
    uint64_t bytes = 0;
    const int rc = ::ioctl(fd, BLKGETSIZE64, &bytes);
    const int error = errno;
    ::close(fd);
    if (rc != 0) return SizeError("cannot size block device " + path, error);
    return bytes;
  }
  std::error_code ec;
  const std::string dir = std::filesystem::absolute(path, ec).parent_path().string();
  struct statvfs fs {};
  if (::statvfs(dir.c_str(), &fs) != 0) {
    return SizeError("cannot size the file system of " + path + " (set nvme.dwpd_drive_bytes)", errno);
  }
  return uint64_t{fs.f_blocks} * fs.f_frsize;
}

}  // namespace

Result<DwpdOptions> DwpdFromConfig(const DaemonConfig& config) {
  DwpdOptions o;
  o.dwpd = config.nvme_dwpd;
  o.warranty_years = config.nvme_dwpd_warranty_years;
  o.planned_years = config.nvme_dwpd_planned_years;
  o.share = config.nvme_dwpd_share;
  o.max_write_rate = static_cast<double>(config.nvme_dwpd_max_write_rate);
  if (config.nvme_dwpd_drive_bytes > 0) {
    o.drive_capacity_bytes = static_cast<uint64_t>(config.nvme_dwpd_drive_bytes);
  } else if (!config.nvme_path.empty()) {
    auto bytes = DriveBytes(config.nvme_path);
    if (!bytes.ok()) return bytes.status();
    o.drive_capacity_bytes = *bytes;
  }
  return o;
}

Result<LowerTier> NvmeAdmissionFromConfig(const DaemonConfig& config, BlockTier& tier) {
  auto dwpd = DwpdFromConfig(config);
  if (!dwpd.ok()) return dwpd.status();
  if (config.nvme_admission == AdmissionPolicyId::kDwpd) {
    const DwpdBudget budget(*dwpd, 0);
    spdlog::info("nvme admission: dwpd, drive {} bytes x {} DWPD, budget {} bytes/day ({:.1f} MB/s)",
                 dwpd->drive_capacity_bytes, dwpd->dwpd, budget.budget_bytes_per_day(), budget.daily_rate() / 1e6);
  } else {
    spdlog::info("nvme admission: {}", AdmissionPolicyName(config.nvme_admission));
  }
  return LowerTier{&tier, config.nvme_admission, *dwpd};
}

}  // namespace kvtier

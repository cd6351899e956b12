// Opens the NVMe tier a DaemonConfig describes: the block device, its
// RocksDB index and the tier on top, logging what recovery found; and
// derives the tier's DWPD budget options.
#pragma once

#include <memory>

#include "common/clock.h"
#include "daemon/config/config.h"
#include "daemon/engine/engine.h"
#include "policy/dwpd_budget.h"
#include "tiers/nvme/block_device.h"
#include "tiers/nvme/nvme_tier.h"

namespace kvtier {

// The nvme.* options of the device (path, capacity, direct_io,
// preallocate, queue_depth, io_threads, io_engine).
BlockDeviceOptions BlockDeviceOptionsFromConfig(const DaemonConfig& config);

// The nvme.* options of the tier (region_bytes, staging_bytes,
// reinsert_percent, eviction as its reclaim order).
NvmeTierOptions NvmeTierOptionsFromConfig(const DaemonConfig& config);

// Null when config.nvme_path is empty (no NVMe tier). Errors name the
// option or path at fault. `clock` is borrowed for the tier's lifetime.
Result<std::unique_ptr<NvmeTier>> OpenNvmeTier(const DaemonConfig& config, Clock& clock);

// The nvme.dwpd_* options as DwpdOptions. With nvme.dwpd_drive_bytes = 0
// the drive is what holds nvme.path: a block device's size, else the size
// of the file system the file lives on. IoError if that cannot be read.
Result<DwpdOptions> DwpdFromConfig(const DaemonConfig& config);

// `tier` (the NVMe tier) with nvme.admission and its DWPD budget, logging
// the budget. Errors as DwpdFromConfig.
Result<LowerTier> NvmeAdmissionFromConfig(const DaemonConfig& config, BlockTier& tier);

}  // namespace kvtier

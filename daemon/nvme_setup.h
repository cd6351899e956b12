// Opens the NVMe tier a DaemonConfig describes: the block device, its
// RocksDB index and the tier on top, logging what recovery found.
#pragma once

#include <memory>

#include "common/clock.h"
#include "daemon/config.h"
#include "tiers/nvme/nvme_tier.h"

namespace kvtier {

// Null when config.nvme_path is empty (no NVMe tier). Errors name the
// option or path at fault. `clock` is borrowed for the tier's lifetime.
Result<std::unique_ptr<NvmeTier>> OpenNvmeTier(const DaemonConfig& config, Clock& clock);

}  // namespace kvtier

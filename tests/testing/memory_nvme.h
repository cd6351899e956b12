// An NVMe tier on a MemoryDevice for engine tests: the device behind a
// FaultInjectingDevice (`faults`), its index in `dir` + "/index", small
// regions and staging by default so tests reach reclaim quickly.
#pragma once

#include <memory>
#include <string>

#include "common/clock.h"
#include "kvtier/result.h"
#include "tests/testing/fault_injecting_device.h"
#include "tests/testing/memory_device.h"
#include "tiers/nvme/nvme_tier.h"

namespace kvtier::testing {

// 1 MiB regions, 2 MiB of staging; the rest NvmeTierOptions' defaults.
NvmeTierOptions SmallNvmeOptions();

// `memory` and `clock` are borrowed and must outlive the tier. With
// `device`, *device is set to the fault-injecting device the tier owns
// (valid while the tier lives), to change faults or hold its writes.
Result<std::unique_ptr<NvmeTier>> OpenMemoryNvmeTier(MemoryDevice& memory, const std::string& dir, Clock& clock,
                                                     const NvmeTierOptions& options = SmallNvmeOptions(),
                                                     const FaultOptions& faults = {},
                                                     FaultInjectingDevice** device = nullptr,
                                                     std::function<void()> index_hook = nullptr);

}  // namespace kvtier::testing

#include "tests/testing/memory_nvme.h"

namespace kvtier::testing {

NvmeTierOptions SmallNvmeOptions() {
  NvmeTierOptions options;
  options.region_bytes = 1 << 20;
  options.staging_bytes = 2 << 20;
  return options;
}

Result<std::unique_ptr<NvmeTier>> OpenMemoryNvmeTier(MemoryDevice& memory, const std::string& dir, Clock& clock,
                                                     const NvmeTierOptions& options, const FaultOptions& faults) {
  auto index = NvmeIndex::Open(dir + "/index", false);
  if (!index.ok()) return index.status();
  return NvmeTier::Open(std::make_unique<FaultInjectingDevice>(memory, faults), std::move(*index), options, clock);
}

}  // namespace kvtier::testing

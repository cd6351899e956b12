#include "tests/testing/memory_nvme.h"

namespace kvtier::testing {

NvmeTierOptions SmallNvmeOptions() {
  NvmeTierOptions options;
  options.region_bytes = 1 << 20;
  options.staging_bytes = 2 << 20;
  return options;
}

Result<std::unique_ptr<NvmeTier>> OpenMemoryNvmeTier(MemoryDevice& memory, const std::string& dir, Clock& clock,
                                                     const NvmeTierOptions& options, const FaultOptions& faults,
                                                     FaultInjectingDevice** device, std::function<void()> index_hook) {
  auto index = NvmeIndex::Open(dir + "/index", false);
  if (!index.ok()) return index.status();
  (*index)->SetMutationHook(std::move(index_hook));
  auto faulty = std::make_unique<FaultInjectingDevice>(memory, faults);
  if (device != nullptr) *device = faulty.get();
  return NvmeTier::Open(std::move(faulty), std::move(*index), options, clock);
}

}  // namespace kvtier::testing

// NvmeTier::CheckHealth: what an operator must hear of the NVMe tier
// (`kvtier health`), from the same state its counters report.
#include <string>
#include <string_view>

#include "tiers/nvme/nvme_tier.h"

namespace kvtier {
namespace {

// The value of one counter of a visit (0 when it is not visited).
class OneCounter final : public CounterVisitor {
 public:
  explicit OneCounter(std::string_view name) : name_(name) {}  // borrowed
  void Visit(std::string_view name, int64_t value) override {
    if (name == name_) value_ = value;
  }
  int64_t value() const { return value_; }

 private:
  const std::string_view name_;
  int64_t value_ = 0;
};

}  // namespace

void NvmeTier::CheckHealth(HealthFindings& out) const {
  bool full = false;
  int64_t enospc = 0, index_failures = 0;
  {
    MutexLock lock(mu_);
    full = full_;
    enospc = counters_.enospc;
    index_failures = counters_.index_failures;
  }
  if (full) {
    out.AddProblem("the nvme tier is full: its file system has no room (nvme.enospc " + std::to_string(enospc) +
                   "); the host tier keeps serving, nothing more is written to NVMe until space is freed");
  }
  if (index_failures != 0) {
    out.AddProblem("the nvme tier's index failed " + std::to_string(index_failures) +
                   " writes: blocks written since may not survive a restart (see the log)");
  }
  // Every device counts its failed I/O there (DeviceCounters, block_device.h).
  OneCounter device_errors("nvme.device.errors");
  device_->VisitCounters(device_errors);
  if (device_errors.value() != 0) {
    out.AddWarning("the nvme device reported " + std::to_string(device_errors.value()) + " I/O errors");
  }
}

}  // namespace kvtier

// PreloadRates: layer-wise preload plans (policy/preload_planner.h) with
// the read bandwidth the daemon measured for their source tier.
//   a tier below  the 10th percentile of the rates its read meter sampled
//                 (ReadMeter, read_meter.h: bytes over busy time of
//                 promotions, layer reads and loads; its initial estimate
//                 before any), plus kBelowLayerOverheadUs a layer (one
//                 read's submission and completion);
//   the host tier the copy rate `measure_copy` gives, asked once, on the
//                 first plan from the host tier (MeasureCopyBytesPerS:
//                 memcpy's, between buffers out of cache).
// A 10% margin on top. InvalidArgument for no layers, no bytes or a
// negative or non-finite time; NotFound when the stack has no such tier.
//
// Thread-safe: the levels' meters lock themselves; the copy rate is
// measured under a once_flag.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "daemon/engine/engine_levels.h"
#include "kvtier/client.h"
#include "kvtier/result.h"
#include "policy/preload_planner.h"

namespace kvtier {

// memcpy's rate between two 32 MiB buffers (out of cache, as a layer read
// out of the arena is), the best of 3 passes, in bytes per second.
double MeasureCopyBytesPerS();

class PreloadRates {
 public:
  static constexpr double kBelowLayerOverheadUs = 20;
  // The percentile of a tier's read meter plans use (and ready estimates,
  // ready_estimator.h).
  static constexpr double kReadPercentile = 10;

  // `below` (highest first) is borrowed and outlives this.
  explicit PreloadRates(const std::vector<std::unique_ptr<TierLevel>>& below,
                        std::function<double()> measure_copy = MeasureCopyBytesPerS);
  PreloadRates(const PreloadRates&) = delete;
  PreloadRates& operator=(const PreloadRates&) = delete;

  Result<PreloadPlan> Plan(Tier source, uint64_t bytes_per_layer, double compute_us_per_layer, uint32_t layers,
                           double recompute_us_per_layer);
  // The host tier's copy rate: `measure_copy`'s answer, asked on the first
  // call (of this or a plan from the host tier) only.
  double HostCopyBytesPerS();

 private:
  const std::vector<std::unique_ptr<TierLevel>>& below_;
  const std::function<double()> measure_copy_;
  std::once_flag host_copy_measured_;
  double host_copy_bytes_per_s_ = 0;  // set once, under host_copy_measured_
};

}  // namespace kvtier

#include "daemon/engine/preload_rates.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

namespace kvtier {

double MeasureCopyBytesPerS() {
  constexpr size_t kBytes = 32u << 20;
  std::vector<std::byte> from(kBytes, std::byte{1}), to(kBytes, std::byte{0});
  double best = 0;
  for (int pass = 0; pass < 3; ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(to.data(), from.data(), kBytes);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    volatile std::byte keep = to[kBytes / 2];
    (void)keep;
    if (s > 0) best = std::max(best, double(kBytes) / s);
  }
  return best > 0 ? best : 1e9;
}

PreloadRates::PreloadRates(const std::vector<std::unique_ptr<TierLevel>>& below, std::function<double()> measure_copy)
    : below_(below), measure_copy_(std::move(measure_copy)) {}

Result<PreloadPlan> PreloadRates::Plan(Tier source, uint64_t bytes_per_layer, double compute_us_per_layer,
                                       uint32_t layers, double recompute_us_per_layer) {
  if (layers == 0 || bytes_per_layer == 0) return InvalidArgument("a preload plan needs layers and bytes per layer");
  for (double t : {compute_us_per_layer, recompute_us_per_layer}) {
    if (!std::isfinite(t) || t < 0) return InvalidArgument("compute times must be finite and not negative");
  }
  PreloadInput in;
  in.bytes_per_layer = bytes_per_layer;
  in.compute_us_per_layer = compute_us_per_layer;
  in.layers = layers;
  in.recompute_us_per_layer = recompute_us_per_layer;
  in.margin = 0.1;
  if (source == Tier::kHost) {
    in.read_bytes_per_s = HostCopyBytesPerS();
  } else {
    const auto it = std::find_if(below_.begin(), below_.end(),
                                 [source](const std::unique_ptr<TierLevel>& b) { return b->reported == source; });
    if (it == below_.end()) {
      return NotFound("no " + std::string(TierName(source)) + " tier to plan a preload from");
    }
    in.read_bytes_per_s = (*it)->read_meter.estimate().Percentile(kReadPercentile);
    in.overhead_us_per_layer = kBelowLayerOverheadUs;
  }
  return PlanPreload(in);
}

double PreloadRates::HostCopyBytesPerS() {
  std::call_once(host_copy_measured_, [this] { host_copy_bytes_per_s_ = measure_copy_(); });
  return host_copy_bytes_per_s_;
}

}  // namespace kvtier

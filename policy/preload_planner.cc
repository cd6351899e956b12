#include "policy/preload_planner.h"

#include <algorithm>
#include <cmath>

namespace kvtier {

PreloadPlan PlanPreload(const PreloadInput& in) {
  PreloadPlan plan;
  const uint32_t layers = std::max<uint32_t>(in.layers, 1);
  const double bandwidth = in.read_bytes_per_s > 0 ? in.read_bytes_per_s : 1;
  const double margin = std::max(in.margin, 0.0);
  const double t_read =
      double(in.bytes_per_layer) / bandwidth * 1e6 * (1 + margin) + std::max(in.overhead_us_per_layer, 0.0);
  const double t_comp = std::max(in.compute_us_per_layer, 0.0);
  uint32_t n_pre = 1;
  if (t_read > t_comp) {
    // ceil(L - (L-1) t_comp / t_read), kept in [1, L]; a hair of slack so
    // that a ratio computed as 13.000000001 is 13, not 14.
    const double exact = double(layers) - double(layers - 1) * t_comp / t_read;
    n_pre = static_cast<uint32_t>(std::clamp(std::ceil(exact - 1e-9), 1.0, double(layers)));
  }
  plan.layers_to_preload = n_pre;
  plan.buffer_bytes = uint64_t{n_pre} * in.bytes_per_layer;
  plan.read_bytes_per_s = bandwidth;
  plan.read_us_per_layer = t_read;
  plan.stall_us = double(n_pre) * t_read;
  plan.total_us = plan.stall_us + double(layers) * t_comp;
  const double recompute = std::max(in.recompute_us_per_layer, 0.0);
  plan.recompute_instead = recompute > 0 && double(layers) * recompute <= plan.stall_us;
  return plan;
}

}  // namespace kvtier

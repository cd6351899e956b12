// What a preload plan says (Client::PlanPreload, policy/preload_planner.h):
// how many layers of a cached prefix to hold before computing the new
// tokens, so that no later layer keeps the compute waiting. Std only.
#pragma once

#include <cstdint>

namespace kvtier {

struct PreloadPlan {
  uint32_t layers_to_preload = 0;  // n_pre, in [1, layers]
  uint64_t buffer_bytes = 0;       // n_pre x bytes_per_layer
  double read_bytes_per_s = 0;     // the bandwidth planned with (the daemon's: a low percentile of the tier's reads)
  double read_us_per_layer = 0;    // t_read as planned (margin and per-layer overhead in)
  double stall_us = 0;             // n_pre x t_read: compute's wait for KV
  double total_us = 0;             // stall + layers x t_comp: the layers' load and compute
  bool recompute_instead = false;  // recomputing the prefix is no slower than loading it
};

}  // namespace kvtier

// Preload planning for layer-wise loading (docs/POLICIES.md):
// how many layers of a cached prefix an engine must hold in hand before it
// starts computing the new tokens, so that every later layer arrives before
// the compute reaches it.
//
// Reads are sequential, layer 0 first, t_read each; computing a layer of
// the new tokens takes t_comp. Layer i is in at (i + 1) t_read; the engine
// starts once n_pre layers are in and computes layer i at n_pre t_read +
// i t_comp, so it never waits later when
//     n_pre = 1                                 if t_read <= t_comp,
//     n_pre = ceil(L - (L - 1) t_comp / t_read) otherwise
// (the CachedAttention formula). The buffer holds n_pre layers; the stall
// (compute waiting for KV, against KV already in place) is n_pre t_read.
//
// t_read is the caller's bandwidth (a low percentile of the tier's measured
// reads, so the plan holds on a slow day), inflated by `margin`, plus a
// fixed per-layer overhead (submission and completion).
//
// Recompute instead: loading costs the stall; recomputing the cached
// prefix costs L x its per-layer compute. When the latter is known and not
// larger, the prefix is not worth loading.
//
// Pure; times in microseconds.
#pragma once

#include <cstdint>

#include "kvtier/preload.h"

namespace kvtier {

struct PreloadInput {
  double read_bytes_per_s = 0;        // the source tier's read bandwidth (> 0)
  uint64_t bytes_per_layer = 0;       // one layer of the whole cached prefix
  double compute_us_per_layer = 0;    // computing one layer of the new tokens
  uint32_t layers = 0;                // L (> 0)
  double recompute_us_per_layer = 0;  // recomputing one layer of the cached prefix; 0: unknown
  double overhead_us_per_layer = 0;   // added to each layer's read
  double margin = 0.1;                // t_read is inflated by this share (0.1: 10%)
};

// Preconditions (checked by the callers that take them from outside):
// read_bytes_per_s > 0 and layers > 0. Negative times count as 0.
PreloadPlan PlanPreload(const PreloadInput& input);

}  // namespace kvtier

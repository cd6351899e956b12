// Prefetch planning from the engine's request queue (docs/POLICIES.md):
// which prefix blocks held by the tiers below the host (NVMe, remote, ...)
// to read into the host tier, in what order, so that queued requests find
// their prefixes in DRAM when they start.
//
// PlanPrefetch walks queued requests in deadline order (earliest first,
// then by id). For each, the usable prefix is the chain up to its first
// block cached nowhere; its blocks not in the host tier are read, root
// first, on one read channel per tier below the host that moves bytes at
// that tier's measured bandwidth, and only as far as they arrive by the
// deadline (the longest prefix that can: a block late by the deadline ends
// it, since a prefix is used only up to its first hole). A request whose
// prefix would give fewer than `min_hit_blocks` blocks is skipped (a short
// hit saves little). A block two requests need is read once. The plan
// stops when the next block would exceed the host budget.
//
// The engine issues the actions in order, prefetch reads before demotion
// writes, and feeds the measured throughput of every read back into the
// tier's BandwidthEstimate. Pure and synchronous; time passed in (us).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kvtier/block_key.h"

namespace kvtier {

// A read bandwidth as an exponentially weighted moving average of observed
// reads (bytes over their duration); starts at `initial_bytes_per_s`. It
// also keeps the last kWindow reads' rates, for a low percentile: what
// the tier delivers on a slow day (the preload planner's t_read,
// policy/preload_planner.h).
class BandwidthEstimate {
 public:
  static constexpr size_t kWindow = 64;
  explicit BandwidthEstimate(double initial_bytes_per_s, double weight = 0.2);
  // One completed read of `bytes` that took `duration_us` (0 is ignored).
  void Observe(uint64_t bytes, uint64_t duration_us);
  double bytes_per_s() const { return bytes_per_s_; }
  // Reads observed in all (the window holds the last kWindow of them).
  size_t observed() const { return observed_; }
  // The p-th percentile (nearest rank, p in [0, 100]) of the last kWindow
  // reads' rates; bytes_per_s() before any read.
  double Percentile(double p) const;
  // Microseconds to read `bytes` at the estimate (at least 1).
  uint64_t TimeUs(uint64_t bytes) const;

 private:
  double bytes_per_s_;
  double weight_;
  std::array<double, kWindow> recent_{};  // a ring of the latest rates
  size_t observed_ = 0;                   // reads observed in all
};

// Where a block of a queued chain is: in the host tier, in a tier below it
// (`level`: 0 is the highest tier below the host), or cached nowhere.
enum class BlockPlace : uint8_t { kHost, kBelow, kNowhere };

struct PrefetchBlock {
  BlockKey key;
  uint64_t bytes = 0;
  BlockPlace place = BlockPlace::kNowhere;
  uint32_t level = 0;  // with kBelow
};

struct PrefetchRequest {
  uint64_t id = 0;
  uint64_t deadline_us = 0;          // when its blocks must be in DRAM (start - preload lead)
  std::vector<PrefetchBlock> chain;  // root first
};

// A plan looks at this many queued requests, the earliest first (the
// engine and the replay both take them so).
inline constexpr size_t kPrefetchPlanRequests = 256;

// A plan's host budget: `share` of the host tier's `host_capacity_bytes`,
// less the bytes earlier plans read in (or are reading) that no request
// has used yet, so plans never hold more than the share together.
uint64_t PrefetchBudget(double share, uint64_t host_capacity_bytes, uint64_t still_prefetched_bytes);

struct PrefetchOptions {
  uint64_t host_budget_bytes = 0;  // bytes the plan may bring into the host tier
  uint32_t min_hit_blocks = 2;     // a usable prefix shorter than this is not worth a prefetch
};

struct PrefetchAction {
  uint64_t request = 0;  // the earliest-deadline request that needs it
  BlockKey key;
  uint64_t bytes = 0;
  uint32_t level = 0;     // the tier below it is read from
  uint64_t start_us = 0;  // planned start and arrival on its tier's channel
  uint64_t done_us = 0;
};

struct PrefetchPlan {
  std::vector<PrefetchAction> actions;  // issue in this order
  uint64_t bytes = 0;                   // total, <= host_budget_bytes
  uint32_t skipped_short = 0;           // requests whose usable prefix was below min_hit_blocks
  uint32_t cut_by_deadline = 0;         // requests whose prefix was cut where a block would be late
  uint32_t cut_by_budget = 0;           // requests cut by the host budget
};

// `below[level]`: the read bandwidth of each tier below the host, highest
// first. A block at a level with no estimate ends its chain's usable prefix.
PrefetchPlan PlanPrefetch(uint64_t now_us, std::span<const PrefetchRequest> requests,
                          std::span<const BandwidthEstimate> below, const PrefetchOptions& options);

}  // namespace kvtier

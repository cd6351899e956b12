// What a ready-time estimate says (Client::EstimateReady): for the longest
// cached prefix of a chain of keys, where each block is and how long until
// the whole prefix can be in host memory, and in GPU memory, from the
// tiers' measured read bandwidths and the reads already queued on them.
// A router starts a request at max(Q, R) + C (Q: when the GPU is free, R:
// this estimate, C: the rest of the work). Std only.
//
// The model (kvtierd's ReadyEstimator, daemon/engine/ready_estimator.h):
// each tier below the host that holds part of the prefix is read at the
// same bandwidth a preload plan uses (the 10th percentile of its reads'
// busy-time rates), behind the bytes of every read already queued on it;
// one read's overhead is added once per tier. The tiers below are read
// concurrently, so the prefix is in host memory when the slowest tier's
// share is: host_ready_us is the largest `ready_us` below. A block
// already on its way up (a promotion in flight) is not read again: its
// bytes are among its tier's queued bytes. The GPU copy follows: the
// bytes of every block not in the HBM tier, at the host's copy rate.
#pragma once

#include <cstdint>
#include <vector>

namespace kvtier {

enum class Tier : uint8_t;  // kvtier/client.h

// One tier below the host, as the estimate counts it.
struct ReadyTierShare {
  Tier tier{};                    // kNvme or kRemote
  uint32_t blocks = 0;            // blocks of the prefix to read from it (not on their way up already)
  uint64_t bytes = 0;             // their bytes
  uint32_t promoting_blocks = 0;  // blocks of the prefix already being read up from it (in queued_bytes)
  uint32_t queued_reads = 0;      // reads started on it and not ended, any caller's
  uint64_t queued_bytes = 0;      // their bytes: a new read waits behind them
  double read_bytes_per_s = 0;    // the bandwidth used (as PlanPreload's)
  double overhead_us = 0;         // one read's submission and completion, when the tier has work for the prefix
  // overhead_us + (queued_bytes + bytes) / read_bytes_per_s, in us; 0
  // when no block of the prefix is here.
  double ready_us = 0;
};

struct ReadyEstimate {
  // The longest cached prefix (the first key no tier holds ends it, as in
  // Lookup): each block's tier, root first, and its blocks' bytes.
  uint32_t prefix_blocks = 0;
  std::vector<Tier> tiers;
  uint64_t prefix_bytes = 0;
  // Microseconds from now until the whole prefix can be in host memory
  // (0 when all of it is in the host tier or above): the slowest tier's
  // ready_us.
  double host_ready_us = 0;
  // Microseconds from now until the whole prefix can be in GPU memory:
  // host_ready_us, then the blocks not in the HBM tier copied host -> GPU
  // (gpu_copy_bytes at gpu_copy_bytes_per_s); 0 when all of it is in the
  // HBM tier. Without an HBM tier, what a load into GPU memory
  // (LoadOptions::device_dst) takes, copying after the prefix is in host
  // memory (a layer-wise load overlaps the two, so this is an upper bound).
  double gpu_ready_us = 0;
  uint64_t gpu_copy_bytes = 0;
  double gpu_copy_bytes_per_s = 0;  // the host's copy rate (as PlanPreload's from the host tier)
  // Every tier below the host, highest first, also those with nothing of
  // the prefix (their queues are there to see).
  std::vector<ReadyTierShare> below;
};

}  // namespace kvtier

// ReadyEstimator: how long until the longest cached prefix of a chain can
// be in host memory, and in GPU memory (kvtier/ready_estimate.h, what a
// cache-aware router needs as R in max(Q, R) + C). Estimate places each
// key as Lookup does (Locator::Where: the tier above, the host tier, the
// highest tier below holding it, a demotion's target; the first key no
// tier holds ends the prefix; tiers that learn of blocks only when probed
// are not probed, since a probe is I/O), then ModelReady computes:
//
//   per tier below the host with a block of the prefix:
//     ready_us = kBelowLayerOverheadUs
//              + (queued_bytes + bytes to read) / read_bytes_per_s
//     read_bytes_per_s: the kReadPercentile-th percentile of its read
//       meter's busy-time rates (PreloadRates' inputs, preload_rates.h);
//     queued_bytes: every read started on it and not ended (promotions,
//       prefetches, layer reads and loads; ReadMeter::in_flight), whole,
//       since a new read waits behind them and how far each got is not
//       known; demotion writes are not counted (the bandwidth was
//       measured with them);
//     a block being promoted from it (kPromoting) is not read again: it
//       is ready when that tier's queue is, its bytes among queued_bytes.
//   host_ready_us = the largest ready_us: promotions of different tiers
//     run concurrently (each tier has its own threads, and a pin or load
//     starts all its reads at once), so the slowest tier's share decides;
//     within a tier the busy-time bandwidth already covers reads in
//     flight together, so the overhead counts once per tier.
//   gpu_ready_us = host_ready_us + bytes not in the HBM tier / the host's
//     copy rate (PreloadRates::HostCopyBytesPerS, measured once on first
//     use), 0 when the whole prefix is in the HBM tier.
//
// Cheap enough for a server io thread: no I/O, one shard lock at a time
// (briefly, with the tiers' leaf locks under it), the meters' leaf locks,
// no waiting. Thread-safe, no state of its own.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "daemon/engine/engine_levels.h"
#include "daemon/engine/locator.h"
#include "daemon/engine/read_meter.h"
#include "kvtier/block_key.h"
#include "kvtier/client.h"
#include "kvtier/ready_estimate.h"
#include "kvtier/result.h"

namespace kvtier {

// What one tier below the host is doing now, for ModelReady.
struct ReadyLevelNow {
  Tier tier = Tier::kNone;
  double read_bytes_per_s = 0;
  ReadMeter::InFlight queued;
  // Whether the rate is fit to call a block late (ModelLate): measured
  // on enough reads, recently enough (ReadyEstimator::Late says).
  bool judged = true;
};

// The model above, pure: `prefix` as placed (Locator::Where; `below`
// indexes `levels`), each level's rate and queue, and the host's copy rate
// (read only when some block is not in the HBM tier).
ReadyEstimate ModelReady(std::span<const Locator::Placed> prefix, std::span<const ReadyLevelNow> levels,
                         double host_copy_bytes_per_s);

// Which blocks of a load cannot be in host memory within `budget_us`
// (its deadline), pure: `blocks` as placed (nullopt: cached nowhere; in
// the host tier or above: never late). Per tier below, in key order, as
// the model above: a block to read arrives at overhead + (queued bytes +
// the bytes of the blocks of that tier before it that will be read, its
// own included) / rate; a block being promoted arrives when the tier's
// queue is done (its read is among the queued ones, ahead of this load's).
// A late block is not read, and neither is any block below the host after
// it (a load's usable prefix ends at its first failed block: reading them
// would serve nothing). A level whose rate is not positive or not
// `judged` calls none of its blocks late (nothing to go on) unless an
// earlier block was.
std::vector<bool> ModelLate(std::span<const std::optional<Locator::Placed>> blocks,
                            std::span<const ReadyLevelNow> levels, double budget_us);

class ReadyEstimator {
 public:
  // Keys one estimate may name: as many as one layer-wise load
  // (Loader::kMaxLoadBlocks), which a router's estimate precedes.
  static constexpr size_t kMaxKeys = size_t{1} << 16;
  // How Late judges a tier's rate (see Late).
  static constexpr double kLatePercentile = 50;
  static constexpr size_t kLateMinSamples = 16;
  static constexpr uint64_t kLateFreshUs = 10'000'000;

  // `locator` and `below` (the levels below the host, highest first, as
  // the locator indexes them) are borrowed and outlive this.
  // `host_copy_bytes_per_s` answers the host's copy rate (any thread;
  // it may measure it on its first call).
  ReadyEstimator(const Locator& locator, const std::vector<std::unique_ptr<TierLevel>>& below,
                 std::function<double()> host_copy_bytes_per_s);
  ReadyEstimator(const ReadyEstimator&) = delete;
  ReadyEstimator& operator=(const ReadyEstimator&) = delete;

  // The estimate for the longest cached prefix of `keys` (root first) of
  // `ns`, now. No keys, or a namespace no tier holds a block of: an empty
  // prefix, ready at once. InvalidArgument past kMaxKeys keys.
  Result<ReadyEstimate> Estimate(const NamespaceFingerprint& ns, std::span<const BlockKey> keys) const;
  // Per key of `keys` of `ns` (at most kMaxKeys; more: none late): whether
  // it cannot be in host memory within `budget_us` from `now_us` (ModelLate,
  // each key placed as Estimate places it, a key no tier holds not
  // ending anything). A layer-wise load fails these at once. A tier's
  // rate is the kLatePercentile-th of its recent busy-time rates, and is
  // judged only with kLateMinSamples reads measured and the latest within
  // kLateFreshUs: a few samples (a restart, one stall) or an old estimate
  // (a tier nothing read since it was slow, perhaps because its blocks
  // were called late) call nothing late, so the loads read and measure it.
  std::vector<bool> Late(const NamespaceFingerprint& ns, std::span<const BlockKey> keys, double budget_us,
                         uint64_t now_us) const;

 private:
  // Each level below the host now, its rate the `percentile`-th of its
  // recent busy-time rates.
  // `judged` as Late says at `*judge_at_us` (none: every level judged).
  std::vector<ReadyLevelNow> LevelsNow(double percentile, std::optional<uint64_t> judge_at_us) const;

  const Locator& locator_;
  const std::vector<std::unique_ptr<TierLevel>>& below_;
  const std::function<double()> host_copy_bytes_per_s_;
};

}  // namespace kvtier

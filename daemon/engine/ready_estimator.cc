#include "daemon/engine/ready_estimator.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "daemon/engine/loader.h"
#include "daemon/engine/preload_rates.h"

namespace kvtier {

static_assert(ReadyEstimator::kMaxKeys == Loader::kMaxLoadBlocks, "an estimate names as many keys as a load");

namespace {

// Microseconds to move `bytes` at `bytes_per_s` (a rate that is not
// positive is taken as one byte a second: never a division by zero).
double TransferUs(uint64_t bytes, double bytes_per_s) { return double(bytes) / std::max(bytes_per_s, 1.0) * 1e6; }

}  // namespace

ReadyEstimate ModelReady(std::span<const Locator::Placed> prefix, std::span<const ReadyLevelNow> levels,
                         double host_copy_bytes_per_s) {
  ReadyEstimate out;
  out.prefix_blocks = static_cast<uint32_t>(prefix.size());
  out.below.resize(levels.size());
  for (size_t i = 0; i < levels.size(); ++i) {
    ReadyTierShare& share = out.below[i];
    share.tier = levels[i].tier;
    share.read_bytes_per_s = levels[i].read_bytes_per_s;
    share.queued_reads = static_cast<uint32_t>(std::max<int64_t>(levels[i].queued.reads, 0));
    share.queued_bytes = levels[i].queued.bytes;
  }
  out.tiers.reserve(prefix.size());
  for (const Locator::Placed& block : prefix) {
    out.tiers.push_back(block.tier);
    out.prefix_bytes += block.bytes;
    if (block.tier != Tier::kHbm) out.gpu_copy_bytes += block.bytes;
    if (!block.below || *block.below >= out.below.size()) continue;  // in the host tier or above
    ReadyTierShare& share = out.below[*block.below];
    if (block.promoting) {
      ++share.promoting_blocks;  // its read is among the queued ones
    } else {
      ++share.blocks;
      share.bytes += block.bytes;
    }
  }
  for (ReadyTierShare& share : out.below) {
    if (share.blocks == 0 && share.promoting_blocks == 0) continue;  // its queue delays nothing of the prefix
    share.overhead_us = PreloadRates::kBelowLayerOverheadUs;
    share.ready_us = share.overhead_us + TransferUs(share.queued_bytes + share.bytes, share.read_bytes_per_s);
    out.host_ready_us = std::max(out.host_ready_us, share.ready_us);
  }
  if (out.gpu_copy_bytes != 0) {
    out.gpu_copy_bytes_per_s = host_copy_bytes_per_s;
    out.gpu_ready_us = out.host_ready_us + TransferUs(out.gpu_copy_bytes, host_copy_bytes_per_s);
  }
  return out;
}

std::vector<bool> ModelLate(std::span<const std::optional<Locator::Placed>> blocks,
                            std::span<const ReadyLevelNow> levels, double budget_us) {
  std::vector<bool> late(blocks.size(), false);
  std::vector<uint64_t> to_read(levels.size(), 0);  // per level: bytes of the blocks it will read, so far
  bool past_late = false;                           // a block before was late: the prefix ends there
  for (size_t i = 0; i < blocks.size(); ++i) {
    const std::optional<Locator::Placed>& block = blocks[i];
    if (!block || !block->below || *block->below >= levels.size()) continue;
    if (past_late) {
      late[i] = true;
      continue;
    }
    const size_t level = *block->below;
    const double rate = levels[level].read_bytes_per_s;
    if (!(rate > 0) || !levels[level].judged) continue;
    // A promotion's read is among the queued ones, ahead of this load's.
    const uint64_t ahead = block->promoting ? 0 : to_read[level] + block->bytes;
    const double arrives_us =
        PreloadRates::kBelowLayerOverheadUs + TransferUs(levels[level].queued.bytes + ahead, rate);
    if (arrives_us > budget_us) {
      late[i] = true;
      past_late = true;
    } else if (!block->promoting) {
      to_read[level] += block->bytes;
    }
  }
  return late;
}

ReadyEstimator::ReadyEstimator(const Locator& locator, const std::vector<std::unique_ptr<TierLevel>>& below,
                               std::function<double()> host_copy_bytes_per_s)
    : locator_(locator), below_(below), host_copy_bytes_per_s_(std::move(host_copy_bytes_per_s)) {}

Result<ReadyEstimate> ReadyEstimator::Estimate(const NamespaceFingerprint& ns, std::span<const BlockKey> keys) const {
  if (keys.size() > kMaxKeys) {
    return InvalidArgument("a ready estimate names at most " + std::to_string(kMaxKeys) + " keys, got " +
                           std::to_string(keys.size()));
  }
  std::vector<Locator::Placed> prefix;
  bool off_gpu = false;  // some block is not in the HBM tier: the copy rate is needed
  for (const BlockKey& key : keys) {
    std::optional<Locator::Placed> placed = locator_.Where(ns, key);
    if (!placed) break;
    off_gpu = off_gpu || placed->tier != Tier::kHbm;
    prefix.push_back(*placed);
  }
  return ModelReady(prefix, LevelsNow(PreloadRates::kReadPercentile, std::nullopt),
                    off_gpu ? host_copy_bytes_per_s_() : 0);
}

std::vector<bool> ReadyEstimator::Late(const NamespaceFingerprint& ns, std::span<const BlockKey> keys, double budget_us,
                                       uint64_t now_us) const {
  if (keys.size() > kMaxKeys) return std::vector<bool>(keys.size(), false);
  std::vector<std::optional<Locator::Placed>> placed;
  placed.reserve(keys.size());
  bool below = false;
  for (const BlockKey& key : keys) {
    placed.push_back(locator_.Where(ns, key));
    below = below || (placed.back() && placed.back()->below);
  }
  if (!below) return std::vector<bool>(keys.size(), false);  // every block in place already, or nowhere
  return ModelLate(placed, LevelsNow(kLatePercentile, now_us), budget_us);
}

std::vector<ReadyLevelNow> ReadyEstimator::LevelsNow(double percentile, std::optional<uint64_t> judge_at_us) const {
  std::vector<ReadyLevelNow> levels;
  levels.reserve(below_.size());
  for (const auto& level : below_) {
    const BandwidthEstimate estimate = level->read_meter.estimate();
    const uint64_t sampled_us = level->read_meter.last_sample_us();
    const bool judged = !judge_at_us || (estimate.observed() >= kLateMinSamples && level->read_meter.sampled() &&
                                         *judge_at_us <= sampled_us + kLateFreshUs);
    levels.push_back(
        ReadyLevelNow{level->reported, estimate.Percentile(percentile), level->read_meter.in_flight(), judged});
  }
  return levels;
}

}  // namespace kvtier

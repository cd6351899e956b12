#include "policy/prefetch_planner.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_map>

namespace kvtier {

BandwidthEstimate::BandwidthEstimate(double initial_bytes_per_s, double weight)
    : bytes_per_s_(initial_bytes_per_s > 0 ? initial_bytes_per_s : 1.0), weight_(std::clamp(weight, 0.0, 1.0)) {}

void BandwidthEstimate::Observe(uint64_t bytes, uint64_t duration_us) {
  if (duration_us == 0 || bytes == 0) return;
  const double sample = double(bytes) / (double(duration_us) / 1e6);
  bytes_per_s_ = (1 - weight_) * bytes_per_s_ + weight_ * sample;
  recent_[observed_ % kWindow] = sample;
  ++observed_;
}

double BandwidthEstimate::Percentile(double p) const {
  const size_t n = std::min(observed_, kWindow);
  if (n == 0) return bytes_per_s_;
  std::array<double, kWindow> sorted = recent_;
  std::sort(sorted.begin(), sorted.begin() + static_cast<ptrdiff_t>(n));
  const auto rank = static_cast<size_t>(std::ceil(std::clamp(p, 0.0, 100.0) / 100.0 * double(n)));
  return sorted[std::max<size_t>(rank, 1) - 1];
}

uint64_t BandwidthEstimate::TimeUs(uint64_t bytes) const {
  return std::max<uint64_t>(1, static_cast<uint64_t>(std::ceil(double(bytes) / bytes_per_s_ * 1e6)));
}

uint64_t PrefetchBudget(double share, uint64_t host_capacity_bytes, uint64_t still_prefetched_bytes) {
  const auto budget = static_cast<uint64_t>(share * double(host_capacity_bytes));
  return budget > still_prefetched_bytes ? budget - still_prefetched_bytes : 0;
}

PrefetchPlan PlanPrefetch(uint64_t now_us, std::span<const PrefetchRequest> requests,
                          std::span<const BandwidthEstimate> below, const PrefetchOptions& options) {
  PrefetchPlan plan;
  std::vector<size_t> order(requests.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return requests[a].deadline_us != requests[b].deadline_us ? requests[a].deadline_us < requests[b].deadline_us
                                                              : requests[a].id < requests[b].id;
  });
  std::vector<uint64_t> channel_free(below.size(), now_us);  // per tier below: when its channel is free next
  std::unordered_map<BlockKey, uint64_t> arriving;           // planned reads: key -> arrival
  for (size_t index : order) {
    const PrefetchRequest& r = requests[index];
    std::vector<uint64_t> free_at = channel_free;
    std::vector<PrefetchAction> reads;
    uint64_t read_bytes = 0;
    size_t hit = 0;  // prefix blocks in DRAM by the deadline
    bool late = false, over_budget = false;
    for (const PrefetchBlock& b : r.chain) {
      if (b.place == BlockPlace::kNowhere) break;                           // the usable prefix ends here
      if (b.place == BlockPlace::kBelow && b.level >= below.size()) break;  // no channel: not readable
      if (b.place == BlockPlace::kHost) {
        ++hit;
        continue;
      }
      if (auto planned = arriving.find(b.key); planned != arriving.end()) {
        if (planned->second > r.deadline_us) {
          late = true;
          break;
        }
        ++hit;
        continue;
      }
      if (plan.bytes + read_bytes + b.bytes > options.host_budget_bytes) {
        over_budget = true;
        break;
      }
      const uint32_t channel = b.level;
      const uint64_t start = free_at[channel];
      const uint64_t done = start + below[channel].TimeUs(b.bytes);
      if (done > r.deadline_us) {
        late = true;
        break;
      }
      free_at[channel] = done;
      reads.push_back(PrefetchAction{r.id, b.key, b.bytes, b.level, start, done});
      read_bytes += b.bytes;
      ++hit;
    }
    if (reads.empty()) {
      if (over_budget) break;
      continue;  // nothing to read (all in DRAM, or nothing usable in time)
    }
    if (hit < options.min_hit_blocks) {
      ++plan.skipped_short;
      if (over_budget) break;
      continue;
    }
    channel_free = std::move(free_at);
    for (const PrefetchAction& a : reads) arriving[a.key] = a.done_us;
    plan.actions.insert(plan.actions.end(), reads.begin(), reads.end());
    plan.bytes += read_bytes;
    if (late) ++plan.cut_by_deadline;
    if (over_budget) {
      ++plan.cut_by_budget;
      break;  // the budget is spent on the earliest deadlines
    }
  }
  return plan;
}

}  // namespace kvtier

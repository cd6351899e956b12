#include "daemon/engine/prefetcher.h"

#include <unordered_map>
#include <utility>

namespace kvtier {

Prefetcher::Prefetcher(const Options& options, const RequestQueue& queue, Stack stack, const Clock& clock,
                       EngineCounters& counters)
    : options_(options), queue_(queue), stack_(std::move(stack)), clock_(clock), counters_(counters) {}

size_t Prefetcher::Run() {
  if (!enabled()) return 0;
  const std::vector<RequestQueue::Queued> queued = queue_.Earliest(kPrefetchPlanRequests);
  // Where each chain block is now; a block cached nowhere ends the usable
  // prefix (the planner reads no further).
  std::vector<PrefetchRequest> requests;
  std::unordered_map<uint64_t, NamespaceFingerprint> ns_of;
  requests.reserve(queued.size());
  for (const RequestQueue::Queued& q : queued) {
    PrefetchRequest r{q.id, q.start_us, {}};
    for (const BlockKey& key : q.chain) {
      PrefetchBlock b = stack_.place(q.ns, key);
      b.key = key;
      r.chain.push_back(b);
      if (b.place == BlockPlace::kNowhere) break;
    }
    ns_of[q.id] = q.ns;
    requests.push_back(std::move(r));
  }
  const std::vector<BandwidthEstimate> bandwidths = stack_.read_bandwidths();
  const PrefetchOptions plan_options{
      PrefetchBudget(options_.share, options_.host_capacity_bytes, stack_.unused_prefetched_bytes()),
      options_.min_blocks};
  const PrefetchPlan plan = PlanPrefetch(clock_.NowUs(), requests, bandwidths, plan_options);
  Bump(counters_.prefetch_plans);
  Bump(counters_.prefetch_skipped_short, plan.skipped_short);
  size_t started = 0;
  for (const PrefetchAction& a : plan.actions) {
    const std::optional<uint64_t> bytes = stack_.start_read(ns_of.at(a.request), a.key);
    if (!bytes) continue;  // cached, written or evicted meanwhile
    Bump(counters_.prefetches);
    Bump(counters_.prefetch_bytes, static_cast<int64_t>(*bytes));
    ++started;
  }
  return started;
}

}  // namespace kvtier

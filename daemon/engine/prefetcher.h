// Prefetcher: reads the prefixes that queued requests will need from the
// tiers below into the host tier before the requests start. A plan
// (policy/prefetch_planner.h) takes the earliest queued requests
// (RequestQueue::Earliest), where each of their blocks is now, the tiers'
// measured read bandwidths and a budget: PrefetchOptions' share of the
// host tier less what earlier plans read in that nobody used yet. The
// reads themselves are the engine's promotions, started through the
// Stack's hooks.
//
// When to plan again is the engine's call (a change to the queue, the
// last read of a plan landing, a use of a prefetched block); this class
// keeps the flags that say so: one plan scheduled at a time
// (TryScheduling/Scheduled), reads of the last plan in flight
// (ReadStarted/ReadLanded) and a use of a prefetched block since the last
// plan (NoteUse/TakeUse).
//
// Thread-safe: the flags are atomics; Run may be called from any thread,
// and takes no lock of its own (the hooks take the engine's).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "common/clock.h"
#include "daemon/engine/engine_counters.h"
#include "daemon/engine/request_queue.h"
#include "kvtier/block_key.h"
#include "policy/prefetch_planner.h"

namespace kvtier {

class Prefetcher {
 public:
  // What a plan asks of the engine, from the thread that runs it; each
  // hook is called with no lock held and must be set.
  struct Stack {
    // Where `key` of `ns` is now: kHost (cached, or on its way into the
    // host tier), kBelow (with the level and bytes of the highest tier
    // below holding it) or kNowhere.
    std::function<PrefetchBlock(const NamespaceFingerprint& ns, const BlockKey& key)> place;
    // The read bandwidth of each tier below the host, highest first.
    std::function<std::vector<BandwidthEstimate>()> read_bandwidths;
    // Bytes that earlier plans read in and nobody has used yet.
    std::function<uint64_t()> unused_prefetched_bytes;
    // Claims `key` of `ns` if it is still only below and starts its read
    // into the host tier, calling ReadStarted first; the bytes it reads,
    // or nullopt when it was cached, written or evicted meanwhile.
    std::function<std::optional<uint64_t>(const NamespaceFingerprint& ns, const BlockKey& key)> start_read;
  };
  struct Options {
    double share = 0;         // of the host tier's capacity; 0: prefetch is off
    uint32_t min_blocks = 0;  // a usable prefix shorter than this is not read
    uint64_t host_capacity_bytes = 0;
  };
  // `queue`, `clock` and `counters` are borrowed and outlive this.
  Prefetcher(const Options& options, const RequestQueue& queue, Stack stack, const Clock& clock,
             EngineCounters& counters);

  bool enabled() const { return options_.share > 0; }
  // Plans for the earliest kPrefetchPlanRequests queued requests and
  // starts the plan's reads, in its order. Returns the reads started (0
  // when disabled). Counts engine.prefetch_plans, prefetch_skipped_short,
  // prefetches and prefetch_bytes.
  size_t Run();

  // True when no plan was scheduled: the caller schedules one and calls
  // Scheduled as it starts (or if scheduling failed).
  bool TryScheduling() { return !scheduled_.exchange(true, std::memory_order_acq_rel); }
  void Scheduled() { scheduled_.store(false, std::memory_order_release); }
  // A read of a plan started (start_read calls it) / landed: true for the
  // last one of those in flight.
  void ReadStarted() { reads_in_flight_.fetch_add(1, std::memory_order_acq_rel); }
  bool ReadLanded() { return reads_in_flight_.fetch_sub(1, std::memory_order_acq_rel) == 1; }
  // A prefetched block was used (its bytes leave the budget) / whether one
  // was since the last TakeUse.
  void NoteUse() { used_.store(true, std::memory_order_relaxed); }
  bool TakeUse() { return used_.exchange(false, std::memory_order_relaxed); }

 private:
  const Options options_;
  const RequestQueue& queue_;
  const Stack stack_;
  const Clock& clock_;
  EngineCounters& counters_;
  std::atomic<bool> scheduled_{false};
  std::atomic<int64_t> reads_in_flight_{0};
  std::atomic<bool> used_{false};
};

}  // namespace kvtier

// EngineCounters: the Engine's monotonic event counters, bumped by its
// parts and read by StackReport::VisitCounters (stack_report.cc) under the
// names docs/OPERATIONS.md lists. Gauges are computed from the shards, not
// kept here. Each counter is a relaxed atomic: no lock guards them.
#pragma once

#include <atomic>
#include <cstdint>

namespace kvtier {

struct EngineCounters {
  std::atomic<int64_t> lookups{0}, lookup_keys{0}, lookup_hit_blocks{0};
  // Per-tier views: lookups that ended before their last key (the key
  // missed in every tier), keys the host tier answered, bytes committed
  // into and pinned from the host tier.
  std::atomic<int64_t> lookup_misses{0}, host_lookup_hits{0}, host_committed_bytes{0}, host_pinned_bytes{0};
  // Prefetched blocks first used after their read ended (on time), while
  // it was still running (late), or evicted never used (unused).
  std::atomic<int64_t> prefetches_on_time{0}, prefetches_late{0}, prefetches_unused{0};
  std::atomic<int64_t> reserves{0}, reserve_failures{0};
  std::atomic<int64_t> commits{0}, commit_failures{0}, aborts{0};
  std::atomic<int64_t> pins{0}, pin_misses{0}, releases{0}, release_failures{0};
  std::atomic<int64_t> erases{0}, evictions{0}, eviction_failures{0};
  std::atomic<int64_t> connections_closed{0};
  std::atomic<int64_t> promotions{0}, promotion_failures{0}, demotions{0}, demotion_rejections{0};
  std::atomic<int64_t> demotion_failures{0}, admission_drops{0};
  std::atomic<int64_t> enqueues{0}, dequeues{0}, needed_evictions{0}, forced_demotions{0};
  std::atomic<int64_t> prefetch_plans{0}, prefetches{0}, prefetch_bytes{0}, prefetch_skipped_short{0};
  std::atomic<int64_t> layer_reads{0}, layer_reads_busy{0}, eviction_bound_hits{0};
  std::atomic<int64_t> demotion_waits{0};       // demoter waits for a busy tier below
  std::atomic<int64_t> demotions_queued{0};     // demotions a busy tier left to the demoter
  std::atomic<int64_t> demotion_busy_drops{0};  // dropped: tier busy, demoter full or wait over
  std::atomic<int64_t> promotion_retries{0}, promotions_followed_down{0}, prefetch_plans_busy{0};
  std::atomic<int64_t> layer_reads_followed_down{0}, load_reads_followed_down{0};
  std::atomic<int64_t> demotion_corrupt{0};  // bytes changed after commit: not demoted
  std::atomic<int64_t> handoffs_freed{0};    // handed-off blocks erased once a peer took them (PublishedLayers)
  // Blocks clients reported as not matching their checksums: checked,
  // confirmed and dropped, found intact (kept).
  std::atomic<int64_t> corrupt_reports{0}, corrupt_drops{0}, corrupt_reports_refuted{0};
  std::atomic<int64_t> directory_uses{0}, directory_stale_uses{0}, local_lookups{0}, bad_usage_reports{0};
  std::atomic<int64_t> chain_links{0};            // keys reserved with their chain links (lineage)
  std::atomic<int64_t> commit_checksums_sent{0};  // committed blocks whose checksum the client sent
  std::atomic<int64_t> loads{0}, load_blocks{0}, load_streamed_blocks{0}, load_layer_reads{0};
  std::atomic<int64_t> load_failed_blocks{0}, load_late_blocks{0}, load_busy_retries{0};
  // Holds released at their expiry, ended (Unhold, drop, erase), and
  // pending ones that never landed (read failed, namespace dropped).
  std::atomic<int64_t> holds_expired{0}, holds_ended{0}, hold_failures{0};
};

inline void Bump(std::atomic<int64_t>& counter, int64_t by = 1) { counter.fetch_add(by, std::memory_order_relaxed); }

}  // namespace kvtier

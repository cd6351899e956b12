// Engine counters: the events counted as they happen (Engine::Counters)
// and the gauges computed from the shards, then every component below the
// engine (host tier, movers, each tier and its admission); and the
// health the stack and the engine report (Engine::CheckHealth).
#include <string>
#include <utility>

#include "daemon/engine/engine.h"
#include "daemon/engine/block_index.h"
#include "daemon/engine/host_block_tier.h"

namespace kvtier {

// The tier-independent families (docs/OPERATIONS.md, "Metrics") the engine
// knows: lookup hits and misses per tier, and the host tier's bytes, size
// and evictions (the tiers below and above report theirs through their
// MeasuredTier and themselves).
void Engine::VisitTierFamilies(CounterVisitor& v) const {
  const auto load = [](const std::atomic<int64_t>& c) { return c.load(std::memory_order_relaxed); };
  const auto label = [](std::string_view tier) { return "{tier=\"" + std::string(tier) + "\"}"; };
  // In stack order. A lookup asks each key of each tier from the top until
  // one holds it: a key is a miss in every tier above the one that held
  // it, and in every tier when none did (then the lookup ends).
  std::vector<std::pair<std::string, int64_t>> hits;
  if (above_ != nullptr) hits.emplace_back(above_->source().tier->name(), load(above_->source().lookup_hits));
  hits.emplace_back("host", load(counters_.host_lookup_hits));
  for (const auto& b : below_) hits.emplace_back(b->tier->name(), load(b->lookup_hits));
  int64_t missed_here = load(counters_.lookup_misses);
  std::vector<int64_t> misses(hits.size());
  for (size_t i = hits.size(); i-- > 0;) {
    misses[i] = missed_here;
    missed_here += hits[i].second;
  }
  for (size_t i = 0; i < hits.size(); ++i) {
    v.Visit("tier.hits" + label(hits[i].first), hits[i].second);
    v.Visit("tier.misses" + label(hits[i].first), misses[i]);
  }
  const std::string host = label("host");
  v.VisitGauge("tier.capacity_bytes" + host, static_cast<int64_t>(host_block_tier_->capacity_bytes()));
  v.VisitGauge("tier.used_bytes" + host, static_cast<int64_t>(host_block_tier_->used_bytes()));
  v.Visit("tier.read_bytes" + host, load(counters_.host_pinned_bytes));
  v.Visit("tier.written_bytes" + host, load(counters_.host_committed_bytes));
  v.Visit("tier.evictions{tier=\"host\",reason=\"capacity\"}", load(counters_.evictions));
  v.Visit("tier.evictions{tier=\"host\",reason=\"erased\"}", load(counters_.erases));
  if (above_ != nullptr) {
    v.Visit("tier.evictions{tier=\"" + std::string(above_->source().tier->name()) + "\",reason=\"capacity\"}",
            above_->evictions());
  }
}

void Engine::VisitCounters(CounterVisitor& v) const {
  int64_t blocks = 0, pinned = 0, reserved = 0, promoting = 0, demoting = 0, zombies = 0, leases = 0, stored = 0;
  for (const auto& shard_ptr : shards_) {
    MutexLock lock(shard_ptr->mu);
    blocks += static_cast<int64_t>(shard_ptr->committed.size());
    zombies += static_cast<int64_t>(shard_ptr->zombies.size());
    leases += static_cast<int64_t>(shard_ptr->leases.size());
    stored += static_cast<int64_t>(shard_ptr->stored_bytes);
    demoting += static_cast<int64_t>(shard_ptr->demoting.size());
    for (const auto& [key, entry] : shard_ptr->index) {
      if (entry.state() == BlockState::kReserved) ++reserved;
      if (entry.state() == BlockState::kPinned) ++pinned;
      if (entry.promoting()) ++promoting;
    }
  }
  v.VisitGauge("engine.blocks", blocks);
  v.VisitGauge("engine.stored_bytes", stored);
  v.VisitGauge("engine.pinned_blocks", pinned);
  v.VisitGauge("engine.reserved_blocks", reserved);
  v.VisitGauge("engine.promoting_blocks", promoting);
  v.VisitGauge("engine.demoting_blocks", demoting);
  v.VisitGauge("engine.zombie_blocks", zombies);
  v.VisitGauge("engine.leases", leases);
  const auto load = [](const std::atomic<int64_t>& c) { return c.load(std::memory_order_relaxed); };
  v.Visit("engine.lookups", load(counters_.lookups));
  v.Visit("engine.chain_links", load(counters_.chain_links));
  v.Visit("engine.commit_checksums_sent", load(counters_.commit_checksums_sent));
  v.Visit("engine.lookup_keys", load(counters_.lookup_keys));
  v.Visit("engine.lookup_hit_blocks", load(counters_.lookup_hit_blocks));
  v.Visit("engine.reserves", load(counters_.reserves));
  v.Visit("engine.reserve_failures", load(counters_.reserve_failures));
  v.Visit("engine.commits", load(counters_.commits));
  v.Visit("engine.commit_failures", load(counters_.commit_failures));
  v.Visit("engine.aborts", load(counters_.aborts));
  v.Visit("engine.pins", load(counters_.pins));
  v.Visit("engine.pin_misses", load(counters_.pin_misses));
  v.Visit("engine.releases", load(counters_.releases));
  v.Visit("engine.release_failures", load(counters_.release_failures));
  v.Visit("engine.erases", load(counters_.erases));
  v.Visit("engine.corrupt_reports", load(counters_.corrupt_reports));
  v.Visit("engine.corrupt_drops", load(counters_.corrupt_drops));
  v.Visit("engine.corrupt_reports_refuted", load(counters_.corrupt_reports_refuted));
  v.Visit("engine.evictions", load(counters_.evictions));
  v.Visit("engine.eviction_failures", load(counters_.eviction_failures));
  v.Visit("engine.connections_closed", load(counters_.connections_closed));
  v.Visit("engine.promotions", load(counters_.promotions));
  v.Visit("engine.promotion_failures", load(counters_.promotion_failures));
  v.Visit("engine.demotions", load(counters_.demotions));
  v.Visit("engine.demotion_rejections", load(counters_.demotion_rejections));
  v.Visit("engine.demotion_failures", load(counters_.demotion_failures));
  v.Visit("engine.admission_drops", load(counters_.admission_drops));
  v.Visit("engine.enqueues", load(counters_.enqueues));
  v.Visit("engine.dequeues", load(counters_.dequeues));
  v.Visit("engine.needed_evictions", load(counters_.needed_evictions));
  v.Visit("engine.forced_demotions", load(counters_.forced_demotions));
  v.Visit("engine.prefetch_plans", load(counters_.prefetch_plans));
  v.Visit("engine.prefetches", load(counters_.prefetches));
  v.Visit("engine.prefetch_bytes", load(counters_.prefetch_bytes));
  v.Visit("engine.prefetch_skipped_short", load(counters_.prefetch_skipped_short));
  v.Visit("engine.prefetches_on_time", load(counters_.prefetches_on_time));
  v.Visit("engine.prefetches_late", load(counters_.prefetches_late));
  v.Visit("engine.prefetches_unused", load(counters_.prefetches_unused));
  v.Visit("engine.layer_reads", load(counters_.layer_reads));
  v.Visit("engine.demotion_waits", load(counters_.demotion_waits));
  v.Visit("engine.directory_uses", load(counters_.directory_uses));
  v.Visit("engine.directory_stale_uses", load(counters_.directory_stale_uses));
  v.Visit("engine.local_lookups", load(counters_.local_lookups));
  v.Visit("engine.bad_usage_reports", load(counters_.bad_usage_reports));
  v.Visit("engine.demotion_corrupt", load(counters_.demotion_corrupt));
  v.Visit("engine.layer_reads_busy", load(counters_.layer_reads_busy));
  v.VisitGauge("engine.layer_read_pool_bytes", static_cast<int64_t>(promoter_->transient_bytes()));
  v.Visit("engine.eviction_bound_hits", load(counters_.eviction_bound_hits));
  v.Visit("engine.demotions_queued", load(counters_.demotions_queued));
  v.Visit("engine.demotion_busy_drops", load(counters_.demotion_busy_drops));
  v.Visit("engine.promotion_retries", load(counters_.promotion_retries));
  v.Visit("engine.promotions_followed_down", load(counters_.promotions_followed_down));
  v.Visit("engine.prefetch_plans_busy", load(counters_.prefetch_plans_busy));
  // Layer-wise loads: started, their blocks, those streamed from below
  // layer by layer, the layer reads, blocks that failed, busy retries.
  v.Visit("engine.loads", load(counters_.loads));
  v.Visit("engine.load_blocks", load(counters_.load_blocks));
  v.Visit("engine.load_streamed_blocks", load(counters_.load_streamed_blocks));
  v.Visit("engine.load_layer_reads", load(counters_.load_layer_reads));
  v.Visit("engine.load_failed_blocks", load(counters_.load_failed_blocks));
  v.Visit("engine.load_busy_retries", load(counters_.load_busy_retries));
  // Operator holds in force (expired ones not yet released excluded) and
  // their bytes; holds released at expiry, ended otherwise, never landed.
  {
    const HoldTable::InForce held = holder_->InForce();
    v.VisitGauge("engine.holds", held.holds);
    v.VisitGauge("engine.held_bytes", held.bytes);
  }
  v.Visit("engine.holds_expired", load(counters_.holds_expired));
  v.Visit("engine.holds_ended", load(counters_.holds_ended));
  v.Visit("engine.hold_failures", load(counters_.hold_failures));
  v.VisitGauge("engine.loads_open", loader_->OpenCount());
  VisitTierFamilies(v);
  demoter_->VisitCounters(v);
  reader_->VisitCounters(v);
  retries_->VisitCounters(v);
  host_io_->VisitCounters(v);
  host_block_tier_->VisitCounters(v);
  // Per tier below: engine.<tier>_read_bytes_per_s (promotion reads, a
  // moving average), engine.<tier>_lookup_hits, blocks demoted into it from
  // a lower tier's evictions, and its evicted blocks no tier took.
  for (const auto& b : below_) {
    const std::string name(b->tier->name());
    v.VisitGauge("engine." + name + "_read_bytes_per_s", static_cast<int64_t>(b->read_meter.estimate().bytes_per_s()));
    v.Visit("engine." + name + "_lookup_hits", load(b->lookup_hits));
    v.Visit("engine." + name + "_demotions_in", load(b->demotions_in));
    v.Visit("engine." + name + "_evictions_dropped", load(b->demotion_drops));
  }
  // The tier above: engine.<tier>_* and engine.above_io.* (AboveMover::
  // VisitCounters), then the tier's own.
  if (above_ != nullptr) {
    above_->VisitCounters(v);
    above_->source().tier->VisitCounters(v);
  }
  host_.VisitCounters(v);
  for (const auto& b : below_) {
    b->tier->VisitCounters(v);
    b->admission->VisitCounters(v);
  }
  VisitNamespaceUse(v);
}

void Engine::CheckHealth(HealthFindings& out) const {
  if (above_ != nullptr) above_->source().tier->CheckHealth(out);
  host_block_tier_->CheckHealth(out);
  for (const auto& b : below_) {
    b->tier->CheckHealth(out);
    b->admission->CheckHealth(out);
  }
  const auto load = [](const std::atomic<int64_t>& c) { return c.load(std::memory_order_relaxed); };
  for (const auto& [name, failures] : {std::pair{"engine.promotion_failures", load(counters_.promotion_failures)},
                                       std::pair{"engine.demotion_failures", load(counters_.demotion_failures)}}) {
    if (failures != 0) out.AddWarning(std::string(name) + " = " + std::to_string(failures) + " (see the log)");
  }
}

}  // namespace kvtier

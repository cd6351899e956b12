// StackReport's counters and health (stack_report.h); the namespace use
// reports are in stack_report_namespaces.cc.
#include "daemon/engine/stack_report.h"

#include <string>
#include <utility>

#include "common/mutex.h"
#include "daemon/engine/block_index.h"

namespace kvtier {
namespace {

int64_t Load(const std::atomic<int64_t>& c) { return c.load(std::memory_order_relaxed); }

}  // namespace

StackReport::StackReport(Stack stack, const std::vector<std::unique_ptr<BlockIndex>>& shards,
                         const EngineCounters& counters, const NamespaceRegistry& namespaces, Hooks hooks)
    : stack_(stack), shards_(shards), counters_(counters), namespaces_(namespaces), hooks_(std::move(hooks)) {}

void StackReport::VisitTierFamilies(CounterVisitor& v) const {
  const auto label = [](std::string_view tier) { return "{tier=\"" + std::string(tier) + "\"}"; };
  // In stack order. A lookup asks each key of each tier from the top until
  // one holds it: a key is a miss in every tier above the one that held
  // it, and in every tier when none did (then the lookup ends).
  std::vector<std::pair<std::string, int64_t>> hits;
  if (stack_.above != nullptr) {
    hits.emplace_back(stack_.above->source().tier->name(), Load(stack_.above->source().lookup_hits));
  }
  hits.emplace_back("host", Load(counters_.host_lookup_hits));
  for (const auto& b : stack_.below) hits.emplace_back(b->tier->name(), Load(b->lookup_hits));
  int64_t missed_here = Load(counters_.lookup_misses);
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
  v.VisitGauge("tier.capacity_bytes" + host, static_cast<int64_t>(stack_.host.capacity_bytes()));
  v.VisitGauge("tier.used_bytes" + host, static_cast<int64_t>(stack_.host.used_bytes()));
  v.Visit("tier.read_bytes" + host, Load(counters_.host_pinned_bytes));
  v.Visit("tier.written_bytes" + host, Load(counters_.host_committed_bytes));
  v.Visit("tier.evictions{tier=\"host\",reason=\"capacity\"}", Load(counters_.evictions));
  v.Visit("tier.evictions{tier=\"host\",reason=\"erased\"}", Load(counters_.erases));
  if (stack_.above != nullptr) {
    v.Visit("tier.evictions{tier=\"" + std::string(stack_.above->source().tier->name()) + "\",reason=\"capacity\"}",
            stack_.above->evictions());
  }
}

void StackReport::VisitShardGauges(CounterVisitor& v) const {
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
}

void StackReport::VisitEngineCounters(CounterVisitor& v) const {
  const EngineCounters& c = counters_;
  v.Visit("engine.lookups", Load(c.lookups));
  v.Visit("engine.chain_links", Load(c.chain_links));
  v.Visit("engine.commit_checksums_sent", Load(c.commit_checksums_sent));
  v.Visit("engine.lookup_keys", Load(c.lookup_keys));
  v.Visit("engine.lookup_hit_blocks", Load(c.lookup_hit_blocks));
  v.Visit("engine.reserves", Load(c.reserves));
  v.Visit("engine.reserve_failures", Load(c.reserve_failures));
  v.Visit("engine.commits", Load(c.commits));
  v.Visit("engine.commit_failures", Load(c.commit_failures));
  v.Visit("engine.aborts", Load(c.aborts));
  v.Visit("engine.pins", Load(c.pins));
  v.Visit("engine.pin_misses", Load(c.pin_misses));
  v.Visit("engine.releases", Load(c.releases));
  v.Visit("engine.release_failures", Load(c.release_failures));
  v.Visit("engine.erases", Load(c.erases));
  v.Visit("engine.handoffs_freed", Load(c.handoffs_freed));
  v.Visit("engine.corrupt_reports", Load(c.corrupt_reports));
  v.Visit("engine.corrupt_drops", Load(c.corrupt_drops));
  v.Visit("engine.corrupt_reports_refuted", Load(c.corrupt_reports_refuted));
  v.Visit("engine.evictions", Load(c.evictions));
  v.Visit("engine.eviction_failures", Load(c.eviction_failures));
  v.Visit("engine.connections_closed", Load(c.connections_closed));
  v.Visit("engine.promotions", Load(c.promotions));
  v.Visit("engine.promotion_failures", Load(c.promotion_failures));
  v.Visit("engine.demotions", Load(c.demotions));
  v.Visit("engine.demotion_rejections", Load(c.demotion_rejections));
  v.Visit("engine.demotion_failures", Load(c.demotion_failures));
  v.Visit("engine.admission_drops", Load(c.admission_drops));
  v.Visit("engine.enqueues", Load(c.enqueues));
  v.Visit("engine.dequeues", Load(c.dequeues));
  v.Visit("engine.needed_evictions", Load(c.needed_evictions));
  v.Visit("engine.forced_demotions", Load(c.forced_demotions));
  v.Visit("engine.prefetch_plans", Load(c.prefetch_plans));
  v.Visit("engine.prefetches", Load(c.prefetches));
  v.Visit("engine.prefetch_bytes", Load(c.prefetch_bytes));
  v.Visit("engine.prefetch_skipped_short", Load(c.prefetch_skipped_short));
  v.Visit("engine.prefetches_on_time", Load(c.prefetches_on_time));
  v.Visit("engine.prefetches_late", Load(c.prefetches_late));
  v.Visit("engine.prefetches_unused", Load(c.prefetches_unused));
  v.Visit("engine.layer_reads", Load(c.layer_reads));
  v.Visit("engine.demotion_waits", Load(c.demotion_waits));
  v.Visit("engine.directory_uses", Load(c.directory_uses));
  v.Visit("engine.directory_stale_uses", Load(c.directory_stale_uses));
  v.Visit("engine.local_lookups", Load(c.local_lookups));
  v.Visit("engine.bad_usage_reports", Load(c.bad_usage_reports));
  v.Visit("engine.demotion_corrupt", Load(c.demotion_corrupt));
  v.Visit("engine.layer_reads_busy", Load(c.layer_reads_busy));
  v.VisitGauge("engine.layer_read_pool_bytes", hooks_.layer_read_pool_bytes());
  v.Visit("engine.eviction_bound_hits", Load(c.eviction_bound_hits));
  v.Visit("engine.demotions_queued", Load(c.demotions_queued));
  v.Visit("engine.demotion_busy_drops", Load(c.demotion_busy_drops));
  v.Visit("engine.promotion_retries", Load(c.promotion_retries));
  v.Visit("engine.promotions_followed_down", Load(c.promotions_followed_down));
  v.Visit("engine.layer_reads_followed_down", Load(c.layer_reads_followed_down));
  v.Visit("engine.load_reads_followed_down", Load(c.load_reads_followed_down));
  v.Visit("engine.prefetch_plans_busy", Load(c.prefetch_plans_busy));
  // Layer-wise loads: started, their blocks, those streamed from below
  // layer by layer, the layer reads, blocks that failed, busy retries.
  v.Visit("engine.loads", Load(c.loads));
  v.Visit("engine.load_blocks", Load(c.load_blocks));
  v.Visit("engine.load_streamed_blocks", Load(c.load_streamed_blocks));
  v.Visit("engine.load_layer_reads", Load(c.load_layer_reads));
  v.Visit("engine.load_failed_blocks", Load(c.load_failed_blocks));
  v.Visit("engine.load_late_blocks", Load(c.load_late_blocks));
  v.Visit("engine.load_busy_retries", Load(c.load_busy_retries));
  // Operator holds in force (expired ones not yet released excluded) and
  // their bytes; holds released at expiry, ended otherwise, never landed.
  const HoldTable::InForce held = hooks_.holds_in_force();
  v.VisitGauge("engine.holds", held.holds);
  v.VisitGauge("engine.held_bytes", held.bytes);
  v.Visit("engine.holds_expired", Load(c.holds_expired));
  v.Visit("engine.holds_ended", Load(c.holds_ended));
  v.Visit("engine.hold_failures", Load(c.hold_failures));
  v.VisitGauge("engine.loads_open", hooks_.loads_open());
}

void StackReport::VisitCounters(CounterVisitor& v) const {
  VisitShardGauges(v);
  VisitEngineCounters(v);
  VisitTierFamilies(v);
  hooks_.visit_movers(v);
  stack_.host.VisitCounters(v);
  // Per tier below: engine.<tier>_read_bytes_per_s (promotion reads, a
  // moving average), engine.<tier>_lookup_hits, blocks demoted into it from
  // a lower tier's evictions, and its evicted blocks no tier took.
  for (const auto& b : stack_.below) {
    const std::string name(b->tier->name());
    v.VisitGauge("engine." + name + "_read_bytes_per_s", static_cast<int64_t>(b->read_meter.estimate().bytes_per_s()));
    v.Visit("engine." + name + "_lookup_hits", Load(b->lookup_hits));
    v.Visit("engine." + name + "_demotions_in", Load(b->demotions_in));
    v.Visit("engine." + name + "_evictions_dropped", Load(b->demotion_drops));
  }
  // The tier above: engine.<tier>_* and engine.above_io.* (AboveMover::
  // VisitCounters), then the tier's own.
  if (stack_.above != nullptr) {
    stack_.above->VisitCounters(v);
    stack_.above->source().tier->VisitCounters(v);
  }
  stack_.arena.VisitCounters(v);
  for (const auto& b : stack_.below) {
    b->tier->VisitCounters(v);
    b->admission->VisitCounters(v);
  }
  VisitNamespaceUse(v);
}

void StackReport::CheckHealth(HealthFindings& out) const {
  if (stack_.above != nullptr) stack_.above->source().tier->CheckHealth(out);
  stack_.host.CheckHealth(out);
  for (const auto& b : stack_.below) {
    b->tier->CheckHealth(out);
    b->admission->CheckHealth(out);
  }
  for (const auto& [name, failures] : {std::pair{"engine.promotion_failures", Load(counters_.promotion_failures)},
                                       std::pair{"engine.demotion_failures", Load(counters_.demotion_failures)}}) {
    if (failures != 0) out.AddWarning(std::string(name) + " = " + std::to_string(failures) + " (see the log)");
  }
}

}  // namespace kvtier

// NvmeTier reclaim scan: when the last free region opens, the blocks of the
// region reclaim takes next are either copied forward (reinsertion, within
// its budget and in the reclaim policy's order) or read back and offered
// to the eviction sink, before the region is reused (nvme_tier.h).
#include "tiers/nvme/nvme_tier.h"

namespace kvtier {

void NvmeTier::MaybeScanNextVictim() {
  if ((!reinsert_budget_.enabled() && !eviction_sink_) || reinserting_ || regions_.free_count() > 0) return;
  auto victim = regions_.NextVictim();
  if (!victim) return;
  const std::pair<uint32_t, uint64_t> scan{*victim, regions_.Generation(*victim)};
  if (scan == reinsert_scanned_) return;  // this region's turn was taken
  reinsert_scanned_ = scan;
  std::vector<ReclaimCandidate> candidates;
  const bool ask = options_.reclaim == ReclaimOrder::kQueueAware && needed_;
  const uint32_t align = device_->alignment_bytes();
  for (const BlockKey& k : region_keys_[*victim]) {
    if (writing_.count(k) > 0) continue;
    const IndexEntry& entry = entries_.at(k);
    candidates.push_back(
        ReclaimCandidate{k, entry.hits, ask && needed_(k), entry.offset, RecordBytes(entry.payload_bytes, align)});
  }
  // The policy's order, while the budget lasts (the decision the replay
  // simulator runs too); the rest leave with the region, offered to the
  // tier below first.
  ReclaimTurn turn = PlanReclaimTurn(std::move(candidates), reclaim_, reinsert_budget_);
  counters_.reinsert_over_budget += turn.over_budget;
  counters_.reinserted_needed += turn.needed;
  Blocks chosen;
  for (const ReclaimCandidate& c : turn.reinsert) chosen.emplace_back(c.key, entries_.at(c.key));
  Blocks evicted;
  if (eviction_sink_) {
    for (const ReclaimCandidate& c : turn.evict) evicted.emplace_back(c.key, entries_.at(c.key));
  }
  if (chosen.empty() && evicted.empty()) return;
  // Nothing leaves unoffered: the region is not reclaimed (writes get
  // Busy) until the job has handed its blocks down.
  if (!evicted.empty()) regions_.HoldReclaim(*victim);
  reinserting_ = true;
  BeginIo();
  verifiers_.Post([this, chosen = std::move(chosen), evicted = std::move(evicted), sink = eviction_sink_]() mutable {
    ReinsertAndEvict(std::move(chosen), std::move(evicted), std::move(sink));
  });
}

void NvmeTier::ReinsertAndEvict(Blocks reinsert, Blocks evict, EvictionSink sink) {
  for (const auto& [key, entry] : reinsert) {
    const uint64_t bytes = RecordBytes(entry.payload_bytes, device_->alignment_bytes());
    auto staging = staging_->Allocate(bytes);
    Status s = staging ? ReadRecordSync(key, entry, staging->first(bytes)) : Busy("no staging memory");
    if (s.ok()) {
      // The payload is copied into the write's own staging before WriteRecord returns.
      s = WriteRecord(entry.ns, key, entry.layer_count, staging->subspan(kRecordHeaderBytes, entry.payload_bytes),
                      [](Status) {}, entry.payload_checksum, &entry);
    }
    if (staging) staging_->Free(*staging);
    if (!s.ok()) {
      std::lock_guard lock(mu_);
      ++counters_.reinsert_failures;
    }
    if (!s.ok() && sink) evict.emplace_back(key, entry);  // it leaves after all: offer it below
  }
  for (const auto& [key, entry] : evict) {
    const uint64_t bytes = RecordBytes(entry.payload_bytes, device_->alignment_bytes());
    uint64_t hits = 0;
    {
      std::lock_guard lock(mu_);
      auto it = entries_.find(key);
      // Erased, replaced or already reclaimed: nothing to hand down.
      if (it == entries_.end() || it->second.offset != entry.offset ||
          it->second.region_generation != entry.region_generation) {
        if (regions_.Generation(entry.region) != entry.region_generation) ++counters_.evictions_missed;
        continue;
      }
      hits = it->second.hits;
    }
    auto staging = staging_->Allocate(bytes);
    Status s = staging ? ReadRecordSync(key, entry, staging->first(bytes)) : Busy("no staging memory");
    if (s.ok()) {
      sink(Evicted{entry.ns, key, entry.layer_count, entry.payload_checksum, hits},
           staging->subspan(kRecordHeaderBytes, entry.payload_bytes));
    }
    if (staging) staging_->Free(*staging);
    std::lock_guard lock(mu_);
    ++(s.ok() ? counters_.evictions_offered : counters_.eviction_read_failures);
  }
  {
    std::lock_guard lock(mu_);
    reinserting_ = false;
    regions_.HoldReclaim(std::nullopt);
  }
  EndIo();
}

}  // namespace kvtier

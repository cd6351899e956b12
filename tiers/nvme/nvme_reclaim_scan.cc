// NvmeTier reclaim scan: when the last free region opens (with shares: the
// last but the reserve), the blocks of the region reclaim takes next are
// either copied forward (those within their owners' shares always;
// reinsertion, within its budget and in the reclaim policy's order) or
// read back and offered to the eviction sink, before the region is reused
// (nvme_tier.h).
#include "tiers/nvme/nvme_tier.h"

namespace kvtier {

std::vector<BlockKey> NvmeTier::SplitGuarded(const std::vector<BlockKey>& keys, Blocks& guarded) {
  std::vector<ShareCandidate> owned;
  owned.reserve(keys.size());
  const uint32_t align = device_->alignment_bytes();
  for (const BlockKey& k : keys) {
    const IndexEntry& entry = entries_.at(k);
    owned.push_back(ShareCandidate{k, shares_(entry.ns), RecordBytes(entry.payload_bytes, align), entry.offset});
  }
  std::unordered_map<uint32_t, uint64_t> held;
  for (const auto& [owner, bytes] : owner_bytes_) held[owner] = bytes.held.record;
  ShareSplit split = SplitByShare(std::move(owned), held);
  for (const ShareCandidate& c : split.protected_) guarded.emplace_back(c.key, entries_.at(c.key));
  std::vector<BlockKey> rest;
  rest.reserve(split.may_go.size());
  for (const ShareCandidate& c : split.may_go) rest.push_back(c.key);
  return rest;
}

void NvmeTier::MaybeScanNextVictim() {
  if (!TakesTurns() || reinserting_ || regions_.free_count() > regions_.reserve()) {
    return;
  }
  auto victim = regions_.NextVictim();
  if (!victim) return;
  const std::pair<uint32_t, uint64_t> scan{*victim, regions_.Generation(*victim)};
  if (scan == reinsert_scanned_) return;  // this region's turn was taken
  reinsert_scanned_ = scan;
  turn_taken_[*victim] = scan.second + 1;  // Gate lets it go (once its hold ends)
  Turn turn;
  turn.scan = scan;
  std::vector<BlockKey> keys;
  for (const BlockKey& k : region_keys_[*victim]) {
    if (writing_.count(k) == 0) keys.push_back(k);  // a copy of it is in flight already
  }
  // Blocks within their owners' shares are copied whatever the budget;
  // the reclaim order chooses among the others only.
  if (shares_) keys = SplitGuarded(keys, turn.guarded);
  std::vector<ReclaimCandidate> candidates;
  const bool ask = options_.reclaim == ReclaimOrder::kQueueAware && needed_;
  const uint32_t align = device_->alignment_bytes();
  for (const BlockKey& k : keys) {
    const IndexEntry& entry = entries_.at(k);
    candidates.push_back(
        ReclaimCandidate{k, entry.hits, ask && needed_(k), entry.offset, RecordBytes(entry.payload_bytes, align)});
  }
  // The policy's order, while the budget lasts (the decision the replay
  // simulator runs too); the rest leave with the region, offered to the
  // tier below first.
  ReclaimTurn planned = PlanReclaimTurn(std::move(candidates), reclaim_, reinsert_budget_);
  counters_.reinsert_over_budget += planned.over_budget;
  counters_.reinserted_needed += planned.needed;
  for (const ReclaimCandidate& c : planned.reinsert) turn.reinsert.emplace_back(c.key, entries_.at(c.key));
  if (eviction_sink_) {
    for (const ReclaimCandidate& c : planned.evict) turn.evict.emplace_back(c.key, entries_.at(c.key));
  }
  if (shares_ && turn.guarded.empty()) cleared_ = scan;  // nothing of it needs to stay
  if (turn.guarded.empty() && turn.reinsert.empty() && turn.evict.empty()) return;
  // Nothing leaves unoffered or unprotected: the region is not reclaimed
  // (writes get Busy) until the job has handed its blocks down and copied
  // the protected ones.
  if (!turn.evict.empty() || !turn.guarded.empty()) regions_.HoldReclaim(*victim);
  reinserting_ = true;
  BeginIo();
  verifiers_.Post([this, turn = std::move(turn), sink = eviction_sink_]() mutable {
    ReinsertAndEvict(std::move(turn), std::move(sink));
  });
}

Status NvmeTier::CopyForward(const BlockKey& key, const IndexEntry& entry) {
  const uint64_t bytes = RecordBytes(entry.payload_bytes, device_->alignment_bytes());
  auto staging = staging_->Allocate(bytes);
  Status s = staging ? ReadRecordSync(key, entry, staging->first(bytes)) : Busy("no staging memory");
  if (s.ok()) {
    // The payload is copied into the write's own staging before WriteRecord returns.
    s = WriteRecord(
        entry.ns, key, entry.layer_count, staging->subspan(kRecordHeaderBytes, entry.payload_bytes), [](Status) {},
        entry.payload_checksum, &entry);
  }
  if (staging) staging_->Free(*staging);
  return s;
}

void NvmeTier::ReinsertAndEvict(Turn turn, EvictionSink sink) {
  bool guarded_copied = true;
  for (const auto& [key, entry] : turn.guarded) {
    Status s = CopyForward(key, entry);
    MutexLock lock(mu_);
    if (s.ok()) {
      ++counters_.share_copies;
      continue;
    }
    auto it = entries_.find(key);
    if (it == entries_.end() || it->second.offset != entry.offset) continue;  // gone meanwhile: nothing to keep
    if (s.code() == StatusCode::kCorruption || s.code() == StatusCode::kIoError) {
      // Its record cannot be read back: it is lost whatever reclaim does.
      ++(s.code() == StatusCode::kCorruption ? counters_.corrupt_reads : counters_.read_failures);
      DropIfCurrent(key, entry);
      continue;
    }
    ++counters_.share_copy_failures;  // Busy: the region waits for another turn
    guarded_copied = false;
  }
  for (const auto& [key, entry] : turn.reinsert) {
    Status s = CopyForward(key, entry);
    if (!s.ok()) {
      MutexLock lock(mu_);
      ++counters_.reinsert_failures;
    }
    if (!s.ok() && sink) turn.evict.emplace_back(key, entry);  // it leaves after all: offer it below
  }
  for (const auto& [key, entry] : turn.evict) {
    const uint64_t bytes = RecordBytes(entry.payload_bytes, device_->alignment_bytes());
    {
      MutexLock lock(mu_);
      auto it = entries_.find(key);
      // Erased, replaced or already reclaimed: nothing to hand down.
      if (it == entries_.end() || it->second.offset != entry.offset ||
          it->second.region_generation != entry.region_generation) {
        if (regions_.Generation(entry.region) != entry.region_generation) ++counters_.evictions_missed;
        continue;
      }
    }
    // The reads it had when the turn was taken (`entry`, as the reclaim
    // order weighed them), not those that ended since: the tier below's
    // admission sees what decided the block's going, whichever of this job
    // and a read racing it runs first (a read that lands meanwhile is a
    // promotion: the block is in the host tier then).
    const uint64_t hits = entry.hits;
    auto staging = staging_->Allocate(bytes);
    Status s = staging ? ReadRecordSync(key, entry, staging->first(bytes)) : Busy("no staging memory");
    if (s.ok()) {
      sink(Evicted{entry.ns, key, entry.layer_count, entry.payload_checksum, hits},
           staging->subspan(kRecordHeaderBytes, entry.payload_bytes));
    }
    if (staging) staging_->Free(*staging);
    MutexLock lock(mu_);
    ++(s.ok() ? counters_.evictions_offered : counters_.eviction_read_failures);
  }
  {
    MutexLock lock(mu_);
    reinserting_ = false;
    regions_.HoldReclaim(std::nullopt);
    regions_.EndCopies();
    if (shares_ && !turn.guarded.empty()) {
      if (guarded_copied) {
        cleared_ = turn.scan;
      } else {
        reinsert_scanned_ = {~0u, 0};  // the next write scans it again
      }
    }
  }
  EndIo();
}

}  // namespace kvtier

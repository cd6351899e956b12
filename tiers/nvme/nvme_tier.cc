// NvmeTier (nvme_tier.h): construction, the I/O in flight, the index
// writer's queue of mutations, lookups, Erase and the counters. Writes are
// in nvme_write.cc, reads in nvme_read.cc, the bytes held per namespace and
// share owner in nvme_accounting.cc, start-up in nvme_recovery.cc and the
// reclaim scan in nvme_reclaim_scan.cc.
#include "tiers/nvme/nvme_tier.h"

#include <algorithm>

#include "common/logging.h"

namespace kvtier {

NvmeTier::NvmeTier(std::unique_ptr<BlockDevice> device, std::unique_ptr<NvmeIndex> index,
                   std::unique_ptr<StagingPool> staging, const NvmeTierOptions& options, Clock& clock)
    : device_(std::move(device)),
      index_(std::move(index)),
      staging_(std::move(staging)),
      options_(options),
      clock_(clock),
      regions_(device_->capacity_bytes(), options.region_bytes, device_->alignment_bytes()),
      region_keys_(regions_.region_count()),
      shareable_bytes_(regions_.region_count() > 3 ? (regions_.region_count() - 3) * options.region_bytes : 0),
      reinsert_budget_(options.reinsert_share, options.region_bytes),
      reclaim_(options.reclaim),
      turn_taken_(regions_.region_count(), 0),
      verifiers_(options.verify_threads) {}

Result<std::unique_ptr<NvmeTier>> NvmeTier::Open(std::unique_ptr<BlockDevice> device, std::unique_ptr<NvmeIndex> index,
                                                 const NvmeTierOptions& options, Clock& clock) {
  if (Status s = RegionManager::Validate(device->capacity_bytes(), options.region_bytes, device->alignment_bytes());
      !s.ok()) {
    return s;
  }
  auto staging = StagingPool::Create(options.staging_bytes, *device);
  if (!staging.ok()) return staging.status();
  std::unique_ptr<NvmeTier> tier(
      new NvmeTier(std::move(device), std::move(index), std::move(*staging), options, clock));
  if (Status s = tier->Recover(); !s.ok()) return s;
  return tier;
}

NvmeTier::~NvmeTier() { WaitForIdle(); }

void NvmeTier::WaitForIdle() const {
  MutexLock lock(mu_);
  while (io_in_flight_ != 0) idle_cv_.Wait(mu_);
}

void NvmeTier::BeginIo() { ++io_in_flight_; }  // caller holds mu_

void NvmeTier::EndIo() {
  MutexLock lock(mu_);
  if (--io_in_flight_ == 0) idle_cv_.NotifyAll();
}

void NvmeTier::PersistRegions(const RegionManager::Allocation& a) {
  for (const RegionState& state : a.changed) {
    if (a.reclaimed && state.region == *a.reclaimed) {
      // In log order: the policy's state after the drops does not depend on
      // a hash set's order (the replay drops them in the same order).
      std::vector<std::pair<uint64_t, BlockKey>> by_offset;
      by_offset.reserve(region_keys_[state.region].size());
      for (const BlockKey& k : region_keys_[state.region]) by_offset.emplace_back(entries_[k].offset, k);
      std::sort(by_offset.begin(), by_offset.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      std::vector<BlockKey> dropped;
      dropped.reserve(by_offset.size());
      for (const auto& [offset, k] : by_offset) dropped.push_back(k);
      counters_.reclaim_dropped += static_cast<int64_t>(dropped.size());
      for (const BlockKey& k : dropped) {
        if (dropped_) dropped_(entries_[k].ns, k);
        Account(entries_[k], -1);
        entries_.erase(k);
        // A block whose reinsertion is in flight (the only writes of a key
        // the tier holds) stays in the policy: the copy may land (a failed
        // one drops it then, in OnWritten).
        if (writing_.count(k) == 0) reclaim_.OnDropped(k);
      }
      region_keys_[state.region].clear();
      PostIndex([this, state, dropped = std::move(dropped)] { return index_->ResetRegion(state, dropped); });
    } else {
      PostIndex([this, state] { return index_->PutRegion(state); });
    }
  }
}

void NvmeTier::PostIndex(std::function<Status()> mutation) {
  BeginIo();
  index_writer_.Post([this, mutation = std::move(mutation)] {
    Status s = mutation();
    if (!s.ok()) {
      // The in-memory index is right; the persistent one may keep a stale
      // entry (dropped at the next start-up or read, which verify against
      // the record) or miss a region's state (its entries then load as
      // stale): a restart may lose blocks, never serve wrong ones.
      spdlog::warn("nvme index write failed: {}", s.ToString());
      MutexLock lock(mu_);
      ++counters_.index_failures;
    }
    EndIo();
  });
}

void NvmeTier::SetNeededHint(NeededHint needed) {
  MutexLock lock(mu_);
  needed_ = std::move(needed);
}

void NvmeTier::SetDropListener(DropListener listener) {
  MutexLock lock(mu_);
  dropped_ = std::move(listener);
}

void NvmeTier::SetEvictionSink(EvictionSink sink) {
  MutexLock lock(mu_);
  eviction_sink_ = std::move(sink);
}

uint64_t NvmeTier::used_bytes() const {
  MutexLock lock(mu_);
  return static_cast<uint64_t>(counters_.stored_bytes);
}

std::optional<NvmeTier::BlockInfo> NvmeTier::Find(const BlockKey& key) const {
  MutexLock lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  return BlockInfo{it->second.ns, it->second.payload_bytes, it->second.layer_count, it->second.payload_checksum};
}

void NvmeTier::ForEachBlock(const BlockVisitor& visit) const {
  MutexLock lock(mu_);
  for (const auto& [key, e] : entries_) visit(key, BlockInfo{e.ns, e.payload_bytes, e.layer_count, e.payload_checksum});
  blocks_listed_.fetch_add(static_cast<int64_t>(entries_.size()), std::memory_order_relaxed);
}

Status NvmeTier::Erase(const BlockKey& key) {
  MutexLock lock(mu_);
  auto it = entries_.find(key);
  if (writing_.count(key) != 0) cancelled_.insert(key);  // a write or reinsertion in flight leaves nothing
  if (it == entries_.end() && writing_.count(key) != 0) {
    ++counters_.erases;
    return Status::Ok();
  }
  if (it == entries_.end()) return NotFound("block is not on the nvme tier");
  const IndexEntry entry = it->second;
  // Gone from memory at once; the index writer deletes the persistent
  // entry before any later write of the key indexes it again.
  PostIndex([this, key] { return index_->Delete(key); });
  Account(entry, -1);
  region_keys_[entry.region].erase(key);
  entries_.erase(it);
  reclaim_.OnDropped(key);
  ++counters_.erases;
  return Status::Ok();
}

NvmeTier::WriteTotals NvmeTier::write_totals() const {
  MutexLock lock(mu_);
  return counters_.submitted;
}

bool NvmeTier::full() const {
  MutexLock lock(mu_);
  return full_;
}

void NvmeTier::VisitCounters(CounterVisitor& v) const {
  {
    MutexLock lock(mu_);
    v.VisitGauge("nvme.blocks", static_cast<int64_t>(entries_.size()));
    v.VisitGauge("nvme.stored_bytes", counters_.stored_bytes);
    v.VisitGauge("nvme.capacity_bytes", static_cast<int64_t>(device_->capacity_bytes()));
    v.VisitGauge("nvme.full", full_ ? 1 : 0);
    v.Visit("nvme.writes", counters_.writes);
    v.Visit("nvme.write_failures", counters_.write_failures);
    v.Visit("nvme.write_rejections", counters_.write_rejections);
    v.Visit("nvme.index_failures", counters_.index_failures);
    v.Visit("nvme.enospc", counters_.enospc);
    v.Visit("nvme.reads", counters_.reads);
    v.Visit("nvme.header_cache_hits", counters_.header_cache_hits);
    v.Visit("nvme.blocks_listed", blocks_listed_.load(std::memory_order_relaxed));
    v.Visit("nvme.share_copies", counters_.share_copies);
    v.Visit("nvme.share_copy_failures", counters_.share_copy_failures);
    v.Visit("nvme.share_refusals", counters_.share_refusals);
    v.Visit("nvme.read_failures", counters_.read_failures);
    v.Visit("nvme.corrupt_reads", counters_.corrupt_reads);
    v.Visit("nvme.reclaimed_reads", counters_.reclaimed_reads);
    v.Visit("nvme.erases", counters_.erases);
    v.Visit("nvme.reinserted", counters_.reinserted);
    v.Visit("nvme.reinserted_bytes", counters_.reinserted_bytes);
    v.Visit("nvme.reinsert_failures", counters_.reinsert_failures);
    v.Visit("nvme.reinsert_over_budget", counters_.reinsert_over_budget);
    v.Visit("nvme.reinsert_needed", counters_.reinserted_needed);
    v.VisitGauge("nvme.policy_blocks", static_cast<int64_t>(reclaim_.tracked_blocks()));
    v.Visit("nvme.policy_spared", reclaim_.spared());
    v.Visit("nvme.evictions_offered", counters_.evictions_offered);
    v.Visit("nvme.eviction_read_failures", counters_.eviction_read_failures);
    v.Visit("nvme.evictions_missed", counters_.evictions_missed);
    v.Visit("nvme.write_checksum_mismatches", counters_.write_checksum_mismatches);
    v.Visit("nvme.recovery_loaded", recovery_.entries_loaded);
    v.Visit("nvme.recovery_dropped_stale", recovery_.dropped_stale);
    v.Visit("nvme.recovery_dropped_corrupt", recovery_.dropped_corrupt);
    // Blocks that left the tier, by why (the tier-independent family).
    v.Visit("tier.evictions{tier=\"nvme\",reason=\"capacity\"}", counters_.reclaim_dropped);
    v.Visit("tier.evictions{tier=\"nvme\",reason=\"corrupt\"}", counters_.corrupt_reads);
    v.Visit("tier.evictions{tier=\"nvme\",reason=\"erased\"}", counters_.erases);
    regions_.VisitCounters(v);
  }
  staging_->VisitCounters(v);
  device_->VisitCounters(v);
}

}  // namespace kvtier

// NvmeTier start-up: the index reloaded and checked against the regions,
// and the records of the region that was open when the daemon stopped
// verified (nvme_tier.h, "Open()").
#include <algorithm>
#include <unordered_map>

#include "common/logging.h"
#include "tiers/nvme/nvme_tier.h"

namespace kvtier {

Status NvmeTier::Recover() {
  // No other thread uses the tier yet (Open has not returned it): held so
  // that the analysis sees every guarded member under its lock.
  MutexLock lock(mu_);
  std::vector<RegionState> persisted;
  if (Status s = index_->ForEachRegion([&](const RegionState& r) { persisted.push_back(r); }); !s.ok()) return s;
  std::unordered_set<uint32_t> was_open;
  std::unordered_map<uint32_t, uint64_t> log_rank;  // region -> its place in the log (oldest lowest)
  for (const auto& r : persisted) {
    if (r.status == RegionStatus::kOpen) was_open.insert(r.region);
    log_rank[r.region] = r.status == RegionStatus::kOpen ? ~uint64_t{0} : r.seal_sequence;
  }
  for (const RegionState& changed : regions_.Restore(persisted)) {
    if (Status s = index_->PutRegion(changed); !s.ok()) return s;
    ++recovery_.regions_resealed;
  }
  std::vector<std::pair<BlockKey, IndexEntry>> loaded;
  Status scan = index_->ForEachEntry([&](const BlockKey& k, const IndexEntry& e) { loaded.emplace_back(k, e); });
  if (!scan.ok()) return scan;
  std::vector<std::pair<std::pair<uint64_t, uint64_t>, BlockKey>> kept;  // (log rank, offset), key
  for (const auto& [key, entry] : loaded) {
    const bool in_device = entry.region < regions_.region_count() &&
                           entry.offset >= uint64_t{entry.region} * regions_.region_bytes() &&
                           entry.offset + RecordBytes(entry.payload_bytes, device_->alignment_bytes()) <=
                               uint64_t{entry.region + 1} * regions_.region_bytes();
    bool keep = in_device && regions_.StatusOf(entry.region) != RegionStatus::kFree &&
                regions_.Generation(entry.region) == entry.region_generation;
    if (!keep) {
      ++recovery_.dropped_stale;
    } else if (was_open.count(entry.region) != 0) {
      if (Status v = VerifyRecord(key, entry); !v.ok()) {
        spdlog::warn("nvme: dropping block {:016x}{:016x} at offset {}: {}", key.hi, key.lo, entry.offset,
                     v.ToString());
        ++recovery_.dropped_corrupt;
        keep = false;
      }
    }
    if (!keep) {
      if (Status s = index_->Delete(key); !s.ok()) return s;
      continue;
    }
    entries_.emplace(key, entry);
    region_keys_[entry.region].insert(key);
    Account(entry, +1);
    ++recovery_.entries_loaded;
    kept.push_back({{log_rank[entry.region], entry.offset}, key});
  }
  // The reclaim policy learns the blocks in the order they were written
  // (their read history is not persisted).
  std::sort(kept.begin(), kept.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [place, key] : kept) reclaim_.OnWritten(key, clock_.NowUs());
  return Status::Ok();
}

Status NvmeTier::VerifyRecord(const BlockKey& key, const IndexEntry& entry) {
  const uint64_t bytes = RecordBytes(entry.payload_bytes, device_->alignment_bytes());
  auto staging = staging_->Allocate(bytes);
  if (!staging) return Busy("no staging memory to verify a record at start-up");
  Status outcome = ReadRecordSync(key, entry, staging->first(bytes));
  staging_->Free(*staging);
  return outcome;
}

}  // namespace kvtier

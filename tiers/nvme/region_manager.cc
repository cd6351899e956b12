#include "tiers/nvme/region_manager.h"

#include <algorithm>
#include <string>

#include "common/check.h"

namespace kvtier {

Status RegionManager::Validate(uint64_t device_bytes, uint64_t region_bytes, uint32_t alignment_bytes) {
  if (region_bytes == 0 || region_bytes % alignment_bytes != 0) {
    return InvalidArgument("nvme.region_bytes (" + std::to_string(region_bytes) + ") must be a positive multiple of " +
                           std::to_string(alignment_bytes));
  }
  if (device_bytes / region_bytes < 2) {
    return InvalidArgument("nvme.capacity_bytes (" + std::to_string(device_bytes) +
                           ") must hold at least 2 regions of nvme.region_bytes (" + std::to_string(region_bytes) +
                           ")");
  }
  return Status::Ok();
}

RegionManager::RegionManager(uint64_t device_bytes, uint64_t region_bytes, uint32_t alignment_bytes)
    : region_bytes_(region_bytes), alignment_bytes_(alignment_bytes), regions_(device_bytes / region_bytes) {
  KVTIER_CHECK(Validate(device_bytes, region_bytes, alignment_bytes).ok(), "invalid region geometry");
  for (uint32_t r = 0; r < regions_.size(); ++r) free_.push_back(r);
}

RegionState RegionManager::StateOf(uint32_t region) const {
  const Region& r = regions_[region];
  return RegionState{region, r.generation, r.status, r.seal_sequence};
}

std::vector<RegionState> RegionManager::Restore(std::span<const RegionState> persisted) {
  std::vector<RegionState> changed;
  for (const RegionState& s : persisted) {
    if (s.region >= regions_.size()) continue;  // the device shrank: those records are gone
    regions_[s.region].generation = s.generation;
    regions_[s.region].status = s.status;
    regions_[s.region].seal_sequence = s.seal_sequence;
    next_seal_sequence_ = std::max(next_seal_sequence_, s.seal_sequence + 1);
  }
  free_.clear();
  sealed_.clear();
  open_.reset();
  std::vector<uint32_t> sealed, was_open;
  for (uint32_t r = 0; r < regions_.size(); ++r) {
    if (regions_[r].status == RegionStatus::kFree) free_.push_back(r);
    if (regions_[r].status == RegionStatus::kSealed) sealed.push_back(r);
    if (regions_[r].status == RegionStatus::kOpen) was_open.push_back(r);
  }
  std::stable_sort(sealed.begin(), sealed.end(),
                   [this](uint32_t a, uint32_t b) { return regions_[a].seal_sequence < regions_[b].seal_sequence; });
  sealed_.assign(sealed.begin(), sealed.end());
  for (uint32_t r : was_open) Seal(r, changed);  // newest: appended after the older seals
  return changed;
}

void RegionManager::Seal(uint32_t region, std::vector<RegionState>& changed) {
  regions_[region].status = RegionStatus::kSealed;
  regions_[region].seal_sequence = next_seal_sequence_++;
  sealed_.push_back(region);
  changed.push_back(StateOf(region));
}

Result<uint32_t> RegionManager::ReclaimableVictim(const ReclaimGate& may_reclaim) const {
  auto it = sealed_.begin();
  for (; it != sealed_.end() && regions_[*it].writes_in_flight != 0; ++it) {
    if (held_ == *it) break;
  }
  if (it != sealed_.end() && held_ == *it) {
    return Busy("the next nvme region to reclaim is still being read out to the tier below");
  }
  if (it == sealed_.end()) return Busy("every nvme region has writes in flight; none can be reclaimed yet");
  if (may_reclaim && !may_reclaim(*it)) {
    return Busy("the next nvme region to reclaim has not had its turn yet (its blocks copied forward or handed down)");
  }
  return *it;
}

void RegionManager::Reclaim(uint32_t region) {
  sealed_.erase(std::find(sealed_.begin(), sealed_.end(), region));
  regions_[region].generation += 1;
  regions_[region].seal_sequence = 0;
  ++reclaims_;
}

std::optional<RegionManager::Allocation> RegionManager::RestoreReserve(const ReclaimGate& may_reclaim) {
  if (free_.size() >= reserve_) return std::nullopt;
  auto victim = ReclaimableVictim(may_reclaim);
  if (!victim.ok()) return std::nullopt;
  Reclaim(*victim);
  regions_[*victim].status = RegionStatus::kFree;
  free_.push_back(*victim);
  Allocation a;
  a.reclaimed = *victim;
  a.changed.push_back(StateOf(*victim));
  return a;
}

Result<RegionManager::Allocation> RegionManager::Allocate(uint64_t record_bytes, Purpose purpose,
                                                          const ReclaimGate& may_reclaim) {
  if (record_bytes == 0 || record_bytes % alignment_bytes_ != 0) {
    return InvalidArgument("record of " + std::to_string(record_bytes) + " bytes is not aligned");
  }
  if (record_bytes > region_bytes_) {
    return InvalidArgument("a record of " + std::to_string(record_bytes) + " bytes does not fit a region of " +
                           std::to_string(region_bytes_) + " bytes (raise nvme.region_bytes)");
  }
  if (purpose == Purpose::kWrite && copies_only_) {
    return Busy("protected blocks are being copied forward into the nvme tier's reserve");
  }
  Allocation a;
  if (!open_ || open_offset_ + record_bytes > region_bytes_) {
    const size_t keep = purpose == Purpose::kCopy ? 0 : reserve_;
    std::optional<uint32_t> next;
    if (free_.size() > keep) {
      next = free_.front();
      free_.pop_front();
      if (free_.size() < reserve_) copies_only_ = true;  // only a copy gets here
    } else {
      auto victim = ReclaimableVictim(may_reclaim);
      if (!victim.ok()) return victim.status();
      next = *victim;
      Reclaim(*next);
      a.reclaimed = *next;
    }
    // Sealed only now, after the choice: the region just filled is never
    // the one reclaimed for the next record.
    if (open_) Seal(*open_, a.changed);
    Region& r = regions_[*next];
    if (!a.reclaimed) r.generation += 1;
    r.status = RegionStatus::kOpen;
    r.seal_sequence = 0;
    a.changed.push_back(StateOf(*next));
    open_ = next;
    open_offset_ = 0;
  }
  a.placement = Placement{*open_, uint64_t{*open_} * region_bytes_ + open_offset_, regions_[*open_].generation};
  open_offset_ += record_bytes;
  return a;
}

std::optional<uint32_t> RegionManager::NextVictim() const {
  auto it =
      std::find_if(sealed_.begin(), sealed_.end(), [this](uint32_t r) { return regions_[r].writes_in_flight == 0; });
  if (it == sealed_.end()) return std::nullopt;
  return *it;
}

void RegionManager::WriteStarted(uint32_t region) { ++regions_[region].writes_in_flight; }

void RegionManager::WriteFinished(uint32_t region) {
  KVTIER_CHECK(regions_[region].writes_in_flight > 0, "WriteFinished without WriteStarted");
  --regions_[region].writes_in_flight;
}

void RegionManager::VisitCounters(CounterVisitor& v) const {
  int64_t open = open_ ? 1 : 0;
  v.VisitGauge("nvme.regions_free", static_cast<int64_t>(free_.size()));
  v.VisitGauge("nvme.regions_open", open);
  v.VisitGauge("nvme.regions_sealed", static_cast<int64_t>(sealed_.size()));
  v.Visit("nvme.region_reclaims", reclaims_);
}

}  // namespace kvtier

#include "tools/replay/replay_log.h"

#include <algorithm>

#include "tiers/nvme/block_record.h"

namespace kvtier::tools {

Result<std::unique_ptr<SimLog>> SimLog::Create(const SimLogOptions& options, Hooks hooks) {
  if (Status s = RegionManager::Validate(options.device_bytes, options.region_bytes, options.alignment_bytes);
      !s.ok()) {
    return s;
  }
  return std::unique_ptr<SimLog>(new SimLog(options, std::move(hooks)));
}

SimLog::SimLog(const SimLogOptions& options, Hooks hooks)
    : options_(options),
      hooks_(std::move(hooks)),
      regions_(options.device_bytes, options.region_bytes, options.alignment_bytes),
      reclaim_(options.order),
      budget_(options.reinsert_share, options.region_bytes),
      region_ids_(regions_.region_count()) {}

uint64_t SimLog::RecordBytesOf(uint64_t payload_bytes) const {
  return RecordBytes(payload_bytes, options_.alignment_bytes);
}

bool SimLog::Write(uint32_t id, const BlockKey& key, uint64_t payload_bytes, uint64_t now_us) {
  if (Holds(id)) return false;
  return Place(id, key, payload_bytes, now_us, /*moving=*/false);
}

void SimLog::Read(uint32_t id, uint64_t now_us) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  ++it->second.hits;
  reclaim_.OnRead(it->second.key, now_us);
}

bool SimLog::Place(uint32_t id, const BlockKey& key, uint64_t payload_bytes, uint64_t now_us, bool moving) {
  const uint64_t record = RecordBytesOf(payload_bytes);
  auto allocation = regions_.Allocate(record);
  if (!allocation.ok()) return false;
  if (allocation->reclaimed) {
    // As the tier's PersistRegions: the region's blocks are gone. A block
    // being copied forward out of it is dropped for its policy too, but
    // its copy lands: it stays (nvme_write.cc's OnWritten).
    const uint32_t region = *allocation->reclaimed;
    std::vector<uint32_t> gone_ids(region_ids_[region].begin(), region_ids_[region].end());
    std::sort(gone_ids.begin(), gone_ids.end(),
              [this](uint32_t a, uint32_t b) { return entries_.at(a).offset < entries_.at(b).offset; });  // log order
    for (uint32_t gone : gone_ids) {
      const Entry& e = entries_.at(gone);
      reclaim_.OnDropped(e.key);
      stored_payload_ -= e.payload_bytes;
      entries_.erase(gone);
      if (!(moving && gone == id) && hooks_.dropped) hooks_.dropped(gone);
    }
    region_ids_[region].clear();
  }
  device_bytes_ += record;
  if (moving) {
    reinserted_bytes_ += record;
    ++reinserted_;
  } else {
    budget_.OnWrite(record);
  }
  MaybeTakeTurn(now_us);
  // The write completes: the block is readable at its new place.
  if (auto old = entries_.find(id); old != entries_.end()) {
    region_ids_[old->second.region].erase(id);
    stored_payload_ -= old->second.payload_bytes;
    entries_.erase(old);
  }
  const RegionManager::Placement& p = allocation->placement;
  entries_[id] = Entry{key, p.region, p.generation, p.offset, record, payload_bytes, 0};
  region_ids_[p.region].insert(id);
  stored_payload_ += payload_bytes;
  if (!moving) reclaim_.OnWritten(key, now_us);  // a moved block keeps its place in the policy
  return true;
}

void SimLog::MaybeTakeTurn(uint64_t now_us) {
  // nvme_reclaim_scan.cc's MaybeScanNextVictim, run to its end at once.
  if ((!budget_.enabled() && !hooks_.has_below) || in_turn_ || regions_.free_count() > 0) return;
  const std::optional<uint32_t> victim = regions_.NextVictim();
  if (!victim) return;
  const std::pair<uint32_t, uint64_t> turn_of{*victim, regions_.Generation(*victim)};
  if (turn_of == scanned_) return;
  scanned_ = turn_of;
  const bool ask = options_.order == ReclaimOrder::kQueueAware && hooks_.needed;
  std::vector<ReclaimCandidate> candidates;
  std::unordered_map<BlockKey, uint32_t> id_of;
  for (uint32_t id : region_ids_[*victim]) {
    const Entry& e = entries_.at(id);
    candidates.push_back(ReclaimCandidate{e.key, e.hits, ask && hooks_.needed(id), e.offset, e.record_bytes});
    id_of.emplace(e.key, id);
  }
  ReclaimTurn turn = PlanReclaimTurn(std::move(candidates), reclaim_, budget_);
  if (!hooks_.has_below) turn.evict.clear();  // no sink: nothing is offered
  if (turn.reinsert.empty() && turn.evict.empty()) return;
  const auto current = [&](uint32_t id) {
    auto it = entries_.find(id);
    return it != entries_.end() && it->second.region == turn_of.first && it->second.generation == turn_of.second;
  };
  if (!turn.evict.empty()) regions_.HoldReclaim(*victim);
  in_turn_ = true;
  std::vector<uint32_t> offer;
  for (const ReclaimCandidate& c : turn.evict) offer.push_back(id_of.at(c.key));
  for (const ReclaimCandidate& c : turn.reinsert) {
    const uint32_t id = id_of.at(c.key);
    if (!current(id)) continue;
    const bool copied = Place(id, c.key, entries_.at(id).payload_bytes, now_us, /*moving=*/true);
    if (!copied && hooks_.has_below) offer.push_back(id);  // it leaves after all: offered below
  }
  for (uint32_t id : offer) {
    if (current(id) && hooks_.offered) hooks_.offered(id, entries_.at(id).hits);
  }
  in_turn_ = false;
  regions_.HoldReclaim(std::nullopt);
}

}  // namespace kvtier::tools

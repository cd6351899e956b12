// NvmeTier's bytes held (nvme_tier.h): stored bytes per namespace (the
// NamespaceSums capability) and per share owner, and the shares that keep
// owners' blocks through reclaim (ReclaimShares).
#include <algorithm>

#include "common/check.h"
#include "tiers/nvme/nvme_tier.h"

namespace kvtier {

void NvmeTier::Account(const IndexEntry& entry, int sign) {
  counters_.stored_bytes += sign * static_cast<int64_t>(entry.payload_bytes);
  const HeldBytes bytes{entry.payload_bytes, RecordBytes(entry.payload_bytes, device_->alignment_bytes())};
  if (shares_) AccountOwner(entry.ns, bytes, sign);
  if (sign > 0) {
    namespace_bytes_[entry.ns].payload += bytes.payload;
    namespace_bytes_[entry.ns].record += bytes.record;
    return;
  }
  auto it = namespace_bytes_.find(entry.ns);
  KVTIER_CHECK(it != namespace_bytes_.end() && it->second.payload >= bytes.payload && it->second.record >= bytes.record,
               "nvme: a namespace's stored bytes went negative");
  it->second.payload -= bytes.payload;
  it->second.record -= bytes.record;
  if (it->second.payload == 0) namespace_bytes_.erase(it);
}

void NvmeTier::AccountOwner(const NamespaceFingerprint& ns, const HeldBytes& bytes, int sign) {
  const ShareOwner owner = shares_(ns);
  if (owner.owner == 0) return;
  OwnerBytes& o = owner_bytes_[owner.owner];
  o.share_bytes = owner.share_bytes;
  if (sign > 0) {
    o.held.payload += bytes.payload;
    o.held.record += bytes.record;
    return;
  }
  KVTIER_CHECK(o.held.payload >= bytes.payload && o.held.record >= bytes.record,
               "nvme: a share owner's stored bytes went negative");
  o.held.payload -= bytes.payload;
  o.held.record -= bytes.record;
  if (o.held.payload == 0) owner_bytes_.erase(owner.owner);
}

void NvmeTier::SetShares(ShareOf shares) {
  MutexLock lock(mu_);
  shares_ = std::move(shares);
  owner_bytes_.clear();
  if (shares_) {
    for (const auto& [ns, bytes] : namespace_bytes_) AccountOwner(ns, bytes, +1);
  }
  regions_.SetReserve(shares_ ? 1 : 0);
  regions_.EndCopies();
  cleared_ = {~0u, 0};
  reinsert_scanned_ = {~0u, 0};  // the next victim is scanned again, with the shares
}

uint64_t NvmeTier::shareable_bytes() const { return shareable_bytes_; }

bool NvmeTier::ShareRoomFor(const NamespaceFingerprint& ns, uint64_t record_bytes) {
  const ShareOwner owner = shares_(ns);
  if (owner.owner == 0) return true;  // its block is protected by no share: it may go again
  auto mine = owner_bytes_.find(owner.owner);
  const uint64_t held = mine == owner_bytes_.end() ? 0 : mine->second.held.record;
  if (held + record_bytes > owner.share_bytes) return true;  // over its share: its own blocks make room
  // O(owners): the bytes on the device that shares protect. With shares
  // that add up to at most shareable_bytes() (what kvtierd configures)
  // this always fits; the check keeps the log able to make room whatever
  // shares are installed.
  uint64_t guarded = 0;
  for (const auto& [id, o] : owner_bytes_) guarded += std::min(o.held.record, o.share_bytes);
  return guarded + record_bytes <= shareable_bytes_;
}

RegionManager::ReclaimGate NvmeTier::Gate() const {
  // The scan (NextVictim) and a reclaim each take the oldest sealed region
  // without writes in flight, but at different times: a region whose
  // write ended after a younger region's turn would otherwise be
  // reclaimed with its blocks neither copied forward nor handed down. The
  // allocation that finds it unscanned is Busy and starts its turn.
  if (!TakesTurns()) return {};
  // Called by regions_, whose every use is under mu_.
  return [this](uint32_t region) {
    mu_.AssertHeld();
    const uint64_t generation = regions_.Generation(region);
    if (turn_taken_[region] != generation + 1) return false;
    return !shares_ || cleared_ == std::pair{region, generation};
  };
}

void NvmeTier::ForEachNamespaceBytes(const NamespaceBytesVisitor& visit) const {
  MutexLock lock(mu_);
  for (const auto& [ns, bytes] : namespace_bytes_) visit(ns, bytes.payload);
}

}  // namespace kvtier

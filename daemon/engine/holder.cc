#include "daemon/engine/holder.h"

#include <memory>
#include <string>
#include <utility>

#include "daemon/engine/block_index.h"

namespace kvtier {

Holder::Holder(const Clock& clock, Pinner& pinner, Promoter& promoter, EngineCounters& counters)
    : clock_(clock), pinner_(pinner), promoter_(promoter), counters_(counters) {}

void Holder::ReleaseOwn(std::span<const LeaseId> leases) {
  // Only this class releases kHoldConnection's leases, each once.
  for (const Status& s : pinner_.Release(kHoldConnection, leases)) s.IgnoreError();
}

size_t Holder::ReleaseExpired() {
  std::vector<LeaseId> leases = table_.TakeExpired(clock_.NowUs());
  if (leases.empty()) return 0;
  ReleaseOwn(leases);
  Bump(counters_.holds_expired, static_cast<int64_t>(leases.size()));
  return leases.size();
}

std::vector<EngineHoldResult> Holder::Hold(const NamespaceFingerprint& ns, std::span<const BlockKey> keys,
                                           uint64_t ttl_us) {
  std::vector<EngineHoldResult> out(keys.size());
  ReleaseExpired();
  if (ttl_us == 0 || ttl_us > kMaxHoldTtlUs) {
    const Status bad = InvalidArgument("a hold's TTL must be 1 us to 30 days, got " + std::to_string(ttl_us) + " us");
    for (EngineHoldResult& r : out) r.status = bad;
    return out;
  }
  const uint64_t expires_us = clock_.NowUs() + ttl_us;
  // Keys held already get the new expiry; the others are pinned.
  const uint64_t epoch = table_.DropEpoch(ns);
  const std::vector<size_t> slots = table_.ExtendHeld(ns, keys, expires_us);
  std::vector<BlockKey> to_pin;
  for (size_t i : slots) to_pin.push_back(keys[i]);
  if (to_pin.empty()) return out;
  auto batch = std::make_shared<PinBatch>();
  batch->connection = kHoldConnection;
  batch->done = [](std::vector<PinGrant>) {};
  // Runs for each key that waited (a promotion, a demotion ending), on the
  // thread that settled it, with no shard lock held.
  batch->on_resolve = [this, ns, to_pin, expires_us, epoch](size_t j, const PinGrant& grant) {
    if (!Landed(ns, to_pin[j], grant, expires_us, epoch).ok()) Bump(counters_.hold_failures);
  };
  pinner_.ProbeUnknown(ns, to_pin);
  PinClaims claims = pinner_.ClaimPins(batch, ns, to_pin, LayerSpan{});
  // Settled inline (host hits, misses) before any read starts: nobody else
  // writes these grants.
  for (size_t j = 0; j < to_pin.size(); ++j) {
    EngineHoldResult& r = out[slots[j]];
    if (batch->waiting[j]) {
      r.pending = true;
      continue;
    }
    r.status = Landed(ns, to_pin[j], batch->grants[j], expires_us, epoch);
  }
  for (const PinClaim& c : claims.promote) promoter_.Promote(c.key, c.from);
  pinner_.EndClaims(batch);
  return out;
}

Status Holder::Landed(const NamespaceFingerprint& ns, const BlockKey& key, const PinGrant& grant, uint64_t expires_us,
                      uint64_t epoch) {
  if (!grant.status.ok()) return grant.status;
  const HoldTable::Landing landing = table_.Record(ns, key, grant.lease, grant.length, expires_us, epoch);
  if (landing == HoldTable::Landing::kRecorded) return Status::Ok();
  ReleaseOwn({&grant.lease, 1});  // our own lease, granted just now
  if (landing == HoldTable::Landing::kAlreadyHeld) return Status::Ok();
  return NotFound("block " + key.ToHex() + ": its namespace was dropped while the hold was taken");
}

std::vector<Status> Holder::Unhold(const NamespaceFingerprint& ns, std::span<const BlockKey> keys) {
  ReleaseExpired();
  std::vector<Status> out(keys.size());
  std::vector<LeaseId> leases;
  const std::vector<LeaseId> taken = table_.Take(ns, keys);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (taken.empty() || taken[i] == 0) {
      out[i] = NotFound("block " + keys[i].ToHex() + " is not held");
    } else {
      leases.push_back(taken[i]);
    }
  }
  ReleaseOwn(leases);
  Bump(counters_.holds_ended, static_cast<int64_t>(leases.size()));
  return out;
}

size_t Holder::EndHolds(const NamespaceFingerprint& ns, std::span<const BlockKey> keys) {
  std::vector<LeaseId> leases;
  for (LeaseId lease : table_.Take(ns, keys)) {
    if (lease != 0) leases.push_back(lease);
  }
  if (leases.empty()) return 0;  // every Erase comes here: no holds, no work
  ReleaseOwn(leases);
  Bump(counters_.holds_ended, static_cast<int64_t>(leases.size()));
  return leases.size();
}

void Holder::EndNamespaceHolds(const NamespaceFingerprint& ns) {
  // Holds of ns still pending fail when they land.
  const std::vector<LeaseId> leases = table_.TakeNamespace(ns);
  ReleaseOwn(leases);
  Bump(counters_.holds_ended, static_cast<int64_t>(leases.size()));
}

HoldTable::InForce Holder::InForce() const { return table_.CountInForce(clock_.NowUs()); }

}  // namespace kvtier

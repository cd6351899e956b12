// Operator holds (`kvtier pin` / `kvtier unpin`): blocks of a namespace an
// operator keeps in the host tier for a while, whatever the eviction
// policy says.
//
// A hold is an ordinary pin (Pinner::ClaimPins, the path a client's Pin
// takes) under kHoldConnection, which no client connection ever gets, so a
// held block is kPinned and never an eviction candidate, and a block found
// only below the host tier is promoted into it first. Hold never waits:
// such a block's hold is pending until its read lands (the PinBatch's
// on_resolve records it then). The HoldTable (hold_table.h) keeps each
// held key's lease and expiry.
//
// Expiry is lazy, with no sweeper thread: ReleaseExpiredHolds runs at every
// Hold and Unhold call and in Evictor::Allocate whenever the arena has
// no room, before anything is evicted. An expired hold therefore never
// keeps a block from eviction: the only thing a pin keeps a block from.
//
// Lock order: the HoldTable's mutex is a leaf. Leases are released (shard
// locks) only after it is dropped.
#include <algorithm>

#include "daemon/engine/engine.h"
#include "daemon/engine/block_index.h"

namespace kvtier {

size_t Engine::ReleaseExpiredHolds() {
  std::vector<LeaseId> leases = holds_.TakeExpired(clock_.NowUs());
  if (leases.empty()) return 0;
  // Only this file releases kHoldConnection's leases, each once.
  for (const Status& s : pinner_->Release(kHoldConnection, leases)) s.IgnoreError();
  Bump(counters_.holds_expired, static_cast<int64_t>(leases.size()));
  return leases.size();
}

std::vector<Engine::HoldResult> Engine::Hold(const NamespaceFingerprint& ns, std::span<const BlockKey> keys,
                                             uint64_t ttl_us) {
  std::vector<HoldResult> out(keys.size());
  ReleaseExpiredHolds();
  if (ttl_us == 0 || ttl_us > kMaxHoldTtlUs) {
    const Status bad = InvalidArgument("a hold's TTL must be 1 us to 30 days, got " + std::to_string(ttl_us) + " us");
    for (HoldResult& r : out) r.status = bad;
    return out;
  }
  const uint64_t expires_us = clock_.NowUs() + ttl_us;
  // Keys held already get the new expiry; the others are pinned.
  const uint64_t epoch = holds_.DropEpoch(ns);
  const std::vector<size_t> slots = holds_.ExtendHeld(ns, keys, expires_us);
  std::vector<BlockKey> to_pin;
  for (size_t i : slots) to_pin.push_back(keys[i]);
  if (to_pin.empty()) return out;
  auto batch = std::make_shared<PinBatch>();
  batch->connection = kHoldConnection;
  batch->done = [](std::vector<PinGrant>) {};
  // Runs for each key that waited (a promotion, a demotion ending), on the
  // thread that settled it, with no shard lock held.
  batch->on_resolve = [this, ns, to_pin, expires_us, epoch](size_t j, const PinGrant& grant) {
    if (!HoldLanded(ns, to_pin[j], grant, expires_us, epoch).ok()) Bump(counters_.hold_failures);
  };
  pinner_->ProbeUnknown(ns, to_pin);
  PinClaims claims = pinner_->ClaimPins(batch, ns, to_pin, LayerSpan{});
  // Settled inline (host hits, misses) before any read starts: nobody else
  // writes these grants.
  for (size_t j = 0; j < to_pin.size(); ++j) {
    HoldResult& r = out[slots[j]];
    if (batch->waiting[j]) {
      r.pending = true;
      continue;
    }
    r.status = HoldLanded(ns, to_pin[j], batch->grants[j], expires_us, epoch);
  }
  for (const PinClaim& c : claims.promote) promoter_->Promote(c.key, c.from);
  if (batch->outstanding.fetch_sub(1, std::memory_order_acq_rel) == 1) batch->done(std::move(batch->grants));
  if (prefetcher_->TakeUse()) SchedulePrefetch();
  return out;
}

Status Engine::HoldLanded(const NamespaceFingerprint& ns, const BlockKey& key, const PinGrant& grant,
                          uint64_t expires_us, uint64_t epoch) {
  if (!grant.status.ok()) return grant.status;
  const HoldTable::Landing landing = holds_.Record(ns, key, grant.lease, grant.length, expires_us, epoch);
  if (landing == HoldTable::Landing::kRecorded) return Status::Ok();
  // Our own lease, granted just now: releasing it cannot fail.
  for (const Status& s : pinner_->Release(kHoldConnection, {&grant.lease, 1})) s.IgnoreError();
  if (landing == HoldTable::Landing::kAlreadyHeld) return Status::Ok();
  return NotFound("block " + key.ToHex() + ": its namespace was dropped while the hold was taken");
}

std::vector<Status> Engine::Unhold(const NamespaceFingerprint& ns, std::span<const BlockKey> keys) {
  ReleaseExpiredHolds();
  std::vector<Status> out(keys.size());
  std::vector<LeaseId> leases;
  const std::vector<LeaseId> taken = holds_.Take(ns, keys);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (taken.empty() || taken[i] == 0) {
      out[i] = NotFound("block " + keys[i].ToHex() + " is not held");
    } else {
      leases.push_back(taken[i]);
    }
  }
  for (const Status& s : pinner_->Release(kHoldConnection, leases)) s.IgnoreError();  // ours, each once
  Bump(counters_.holds_ended, static_cast<int64_t>(leases.size()));
  return out;
}

size_t Engine::EndHolds(const NamespaceFingerprint& ns, std::span<const BlockKey> keys) {
  std::vector<LeaseId> leases;
  for (LeaseId lease : holds_.Take(ns, keys)) {
    if (lease != 0) leases.push_back(lease);
  }
  if (leases.empty()) return 0;  // every Erase comes here: no holds, no work
  for (const Status& s : pinner_->Release(kHoldConnection, leases)) s.IgnoreError();  // ours, each once
  Bump(counters_.holds_ended, static_cast<int64_t>(leases.size()));
  return leases.size();
}

void Engine::EndNamespaceHolds(const NamespaceFingerprint& ns) {
  // Holds of ns still pending fail when they land.
  const std::vector<LeaseId> leases = holds_.TakeNamespace(ns);
  for (const Status& s : pinner_->Release(kHoldConnection, leases)) s.IgnoreError();  // ours, each once
  Bump(counters_.holds_ended, static_cast<int64_t>(leases.size()));
}

}  // namespace kvtier

// Operator holds (`kvtier pin` / `kvtier unpin`): blocks of a namespace an
// operator keeps in the host tier for a while, whatever the eviction
// policy says.
//
// A hold is an ordinary pin (Engine::ClaimPins, the path a client's Pin
// takes) under kHoldConnection, which no client connection ever gets, so a
// held block is kPinned and never an eviction candidate, and a block found
// only below the host tier is promoted into it first. Hold never waits:
// such a block's hold is pending until its read lands (the PinBatch's
// on_resolve records it then). holds_ maps each held key to its lease and
// expiry; hold_expiries_ orders the expiries, and next_hold_expiry_us_
// caches the earliest so that checking for expired holds costs one atomic
// load.
//
// Expiry is lazy, with no sweeper thread: ReleaseExpiredHolds runs at every
// Hold and Unhold call and in AllocateWithEviction whenever the arena has
// no room, before anything is evicted. An expired hold therefore never
// keeps a block from eviction: the only thing a pin keeps a block from.
//
// Lock order: holds_mu_ is a leaf. Leases are released (shard locks) only
// after it is dropped.
#include <algorithm>

#include "daemon/engine/engine.h"
#include "daemon/engine/engine_shard.h"

namespace kvtier {

void Engine::SetHoldExpiry(const BlockKey& key, uint64_t expires_us) {
  HoldRecord& hold = holds_.at(key);
  hold_expiries_.erase({hold.expires_us, key});
  hold.expires_us = expires_us;
  hold_expiries_.emplace(expires_us, key);
  next_hold_expiry_us_.store(hold_expiries_.begin()->first, std::memory_order_relaxed);
}

LeaseId Engine::TakeHold(const BlockKey& key) {
  auto it = holds_.find(key);
  if (it == holds_.end()) return 0;
  const LeaseId lease = it->second.lease;
  hold_expiries_.erase({it->second.expires_us, key});
  holds_.erase(it);
  next_hold_expiry_us_.store(hold_expiries_.empty() ? std::numeric_limits<uint64_t>::max()
                                                    : hold_expiries_.begin()->first,
                             std::memory_order_relaxed);
  return lease;
}

size_t Engine::ReleaseExpiredHolds() {
  const uint64_t now = clock_.NowUs();
  if (now < next_hold_expiry_us_.load(std::memory_order_relaxed)) return 0;
  std::vector<LeaseId> leases;
  {
    std::lock_guard lock(holds_mu_);
    while (!hold_expiries_.empty() && hold_expiries_.begin()->first <= now) {
      leases.push_back(TakeHold(hold_expiries_.begin()->second));
    }
  }
  // Only this file releases kHoldConnection's leases, each once.
  for (const Status& s : Release(kHoldConnection, leases)) s.IgnoreError();
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
  std::vector<size_t> slots;
  std::vector<BlockKey> to_pin;
  uint64_t epoch = 0;
  {
    std::lock_guard lock(holds_mu_);
    if (auto d = hold_drops_.find(ns); d != hold_drops_.end()) epoch = d->second;
    for (size_t i = 0; i < keys.size(); ++i) {
      auto it = holds_.find(keys[i]);
      if (it != holds_.end() && it->second.ns == ns) {
        SetHoldExpiry(keys[i], expires_us);
        continue;
      }
      slots.push_back(i);
      to_pin.push_back(keys[i]);
    }
  }
  if (to_pin.empty()) return out;
  auto batch = std::make_shared<PinBatch>();
  batch->connection = kHoldConnection;
  batch->done = [](std::vector<PinGrant>) {};
  // Runs for each key that waited (a promotion, a demotion ending), on the
  // thread that settled it, with no shard lock held.
  batch->on_resolve = [this, ns, to_pin, expires_us, epoch](size_t j, const PinGrant& grant) {
    if (!HoldLanded(ns, to_pin[j], grant, expires_us, epoch).ok()) Bump(counters_.hold_failures);
  };
  ProbeUnknown(ns, to_pin);
  PinClaims claims = ClaimPins(batch, ns, to_pin, LayerSpan{});
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
  for (const PinClaim& c : claims.promote) Promote(c.key, c.from);
  if (batch->outstanding.fetch_sub(1, std::memory_order_acq_rel) == 1) batch->done(std::move(batch->grants));
  if (prefetch_budget_freed_.exchange(false, std::memory_order_relaxed)) SchedulePrefetch();
  return out;
}

Status Engine::HoldLanded(const NamespaceFingerprint& ns, const BlockKey& key, const PinGrant& grant,
                          uint64_t expires_us, uint64_t epoch) {
  if (!grant.status.ok()) return grant.status;
  Status outcome = Status::Ok();
  bool extra_pin = false;
  {
    std::lock_guard lock(holds_mu_);
    auto d = hold_drops_.find(ns);
    if ((d == hold_drops_.end() ? 0 : d->second) != epoch) {
      outcome = NotFound("block " + key.ToHex() + ": its namespace was dropped while the hold was taken");
      extra_pin = true;
    } else if (auto it = holds_.find(key); it != holds_.end()) {
      // Held meanwhile (a concurrent Hold, or the key twice): one pin, the
      // later expiry.
      if (expires_us > it->second.expires_us) SetHoldExpiry(key, expires_us);
      extra_pin = true;
    } else {
      holds_.emplace(key, HoldRecord{ns, grant.lease, grant.length, expires_us});
      hold_expiries_.emplace(expires_us, key);
      next_hold_expiry_us_.store(hold_expiries_.begin()->first, std::memory_order_relaxed);
    }
  }
  if (extra_pin) {
    // Our own lease, granted just now: releasing it cannot fail.
    for (const Status& s : Release(kHoldConnection, {&grant.lease, 1})) s.IgnoreError();
  }
  return outcome;
}

std::vector<Status> Engine::Unhold(const NamespaceFingerprint& ns, std::span<const BlockKey> keys) {
  ReleaseExpiredHolds();
  std::vector<Status> out(keys.size());
  std::vector<LeaseId> leases;
  {
    std::lock_guard lock(holds_mu_);
    for (size_t i = 0; i < keys.size(); ++i) {
      auto it = holds_.find(keys[i]);
      if (it == holds_.end() || it->second.ns != ns) {
        out[i] = NotFound("block " + keys[i].ToHex() + " is not held");
        continue;
      }
      leases.push_back(TakeHold(keys[i]));
    }
  }
  for (const Status& s : Release(kHoldConnection, leases)) s.IgnoreError();  // ours, each once
  Bump(counters_.holds_ended, static_cast<int64_t>(leases.size()));
  return out;
}

size_t Engine::EndHolds(const NamespaceFingerprint& ns, std::span<const BlockKey> keys) {
  std::vector<LeaseId> leases;
  {
    std::lock_guard lock(holds_mu_);
    if (holds_.empty()) return 0;
    for (const BlockKey& key : keys) {
      auto it = holds_.find(key);
      if (it != holds_.end() && it->second.ns == ns) leases.push_back(TakeHold(key));
    }
  }
  for (const Status& s : Release(kHoldConnection, leases)) s.IgnoreError();  // ours, each once
  Bump(counters_.holds_ended, static_cast<int64_t>(leases.size()));
  return leases.size();
}

void Engine::EndNamespaceHolds(const NamespaceFingerprint& ns) {
  std::vector<LeaseId> leases;
  {
    std::lock_guard lock(holds_mu_);
    ++hold_drops_[ns];  // holds of ns still pending fail when they land
    std::vector<BlockKey> keys;
    for (const auto& [key, hold] : holds_) {
      if (hold.ns == ns) keys.push_back(key);
    }
    for (const BlockKey& key : keys) leases.push_back(TakeHold(key));
  }
  for (const Status& s : Release(kHoldConnection, leases)) s.IgnoreError();  // ours, each once
  Bump(counters_.holds_ended, static_cast<int64_t>(leases.size()));
}

}  // namespace kvtier

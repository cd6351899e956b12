#include "daemon/engine/hold_table.h"

namespace kvtier {

uint64_t HoldTable::DropEpoch(const NamespaceFingerprint& ns) const {
  MutexLock lock(mu_);
  auto d = drops_.find(ns);
  return d == drops_.end() ? 0 : d->second;
}

std::vector<size_t> HoldTable::ExtendHeld(const NamespaceFingerprint& ns, std::span<const BlockKey> keys,
                                          uint64_t expires_us) {
  std::vector<size_t> not_held;
  MutexLock lock(mu_);
  for (size_t i = 0; i < keys.size(); ++i) {
    auto it = holds_.find(keys[i]);
    if (it != holds_.end() && it->second.ns == ns) {
      SetExpiry(keys[i], expires_us);
    } else {
      not_held.push_back(i);
    }
  }
  return not_held;
}

HoldTable::Landing HoldTable::Record(const NamespaceFingerprint& ns, const BlockKey& key, LeaseId lease, uint64_t bytes,
                                     uint64_t expires_us, uint64_t epoch) {
  MutexLock lock(mu_);
  auto d = drops_.find(ns);
  if ((d == drops_.end() ? 0 : d->second) != epoch) return Landing::kNamespaceDropped;
  if (auto it = holds_.find(key); it != holds_.end()) {
    // Held meanwhile (a concurrent Hold, or the key twice): one pin, the
    // later expiry.
    if (expires_us > it->second.expires_us) SetExpiry(key, expires_us);
    return Landing::kAlreadyHeld;
  }
  holds_.emplace(key, Held{ns, lease, bytes, expires_us});
  expiries_.emplace(expires_us, key);
  NoteEarliest();
  return Landing::kRecorded;
}

std::vector<LeaseId> HoldTable::TakeExpired(uint64_t now_us) {
  std::vector<LeaseId> leases;
  if (now_us < earliest_us_.load(std::memory_order_relaxed)) return leases;
  MutexLock lock(mu_);
  while (!expiries_.empty() && expiries_.begin()->first <= now_us) {
    leases.push_back(Remove(expiries_.begin()->second));
  }
  return leases;
}

std::vector<LeaseId> HoldTable::Take(const NamespaceFingerprint& ns, std::span<const BlockKey> keys) {
  std::vector<LeaseId> leases;
  MutexLock lock(mu_);
  if (holds_.empty()) return leases;
  leases.assign(keys.size(), 0);
  for (size_t i = 0; i < keys.size(); ++i) {
    auto it = holds_.find(keys[i]);
    if (it != holds_.end() && it->second.ns == ns) leases[i] = Remove(keys[i]);
  }
  return leases;
}

std::vector<LeaseId> HoldTable::TakeNamespace(const NamespaceFingerprint& ns) {
  std::vector<LeaseId> leases;
  MutexLock lock(mu_);
  ++drops_[ns];
  std::vector<BlockKey> keys;
  for (const auto& [key, hold] : holds_) {
    if (hold.ns == ns) keys.push_back(key);
  }
  for (const BlockKey& key : keys) leases.push_back(Remove(key));
  return leases;
}

HoldTable::InForce HoldTable::CountInForce(uint64_t now_us) const {
  InForce out;
  MutexLock lock(mu_);
  for (const auto& [key, hold] : holds_) {
    if (hold.expires_us <= now_us) continue;
    ++out.holds;
    out.bytes += static_cast<int64_t>(hold.bytes);
  }
  return out;
}

void HoldTable::SetExpiry(const BlockKey& key, uint64_t expires_us) {
  Held& hold = holds_.at(key);
  expiries_.erase({hold.expires_us, key});
  hold.expires_us = expires_us;
  expiries_.emplace(expires_us, key);
  NoteEarliest();
}

LeaseId HoldTable::Remove(const BlockKey& key) {
  auto it = holds_.find(key);
  if (it == holds_.end()) return 0;
  const LeaseId lease = it->second.lease;
  expiries_.erase({it->second.expires_us, key});
  holds_.erase(it);
  NoteEarliest();
  return lease;
}

void HoldTable::NoteEarliest() {
  earliest_us_.store(expiries_.empty() ? std::numeric_limits<uint64_t>::max() : expiries_.begin()->first,
                     std::memory_order_relaxed);
}

}  // namespace kvtier

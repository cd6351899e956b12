// HoldTable: the records of operator holds (`kvtier pin` / `unpin`): which
// key is held, under which namespace and lease, how many bytes, until when.
// Pure bookkeeping: it never pins or releases anything itself. The Holder
// (holder.h) takes a pin for each hold and hands the table the
// lease; every lease the table gives back (expired, ended, dropped) the
// caller releases, once.
//
// Expiry is lazy: TakeExpired hands back the holds whose time has come and
// costs one atomic load when none has. A namespace's drops are counted
// (its epoch), so that a hold whose pin lands after a drop of its
// namespace that began after the hold is refused.
//
// Thread-safe; its mutex is a leaf (nothing is called under it).
#pragma once

#include <atomic>
#include <cstdint>
#include <limits>
#include <mutex>
#include <set>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "daemon/engine/block_entry.h"
#include "daemon/engine/lease_table.h"
#include "kvtier/block_key.h"

namespace kvtier {

class HoldTable {
 public:
  // The drop epoch of `ns` now: a hold started now records it and hands it
  // to Record when its pin lands.
  uint64_t DropEpoch(const NamespaceFingerprint& ns) const;

  // For each key of `keys` held under `ns`, sets its expiry to
  // `expires_us` (later or earlier). Returns the indices of the keys not
  // held under `ns` (to pin).
  std::vector<size_t> ExtendHeld(const NamespaceFingerprint& ns, std::span<const BlockKey> keys, uint64_t expires_us);

  // What Record did with a landed pin.
  enum class Landing {
    kRecorded,          // `key` is now held under `lease`
    kAlreadyHeld,       // held meanwhile: the later expiry stays; the caller releases `lease`
    kNamespaceDropped,  // `ns` was dropped since `epoch`: the caller releases `lease`
  };
  // Records the pin `lease` (of `bytes`) of `key` as a hold until
  // `expires_us`, unless one of the other two Landings applies.
  Landing Record(const NamespaceFingerprint& ns, const BlockKey& key, LeaseId lease, uint64_t bytes,
                 uint64_t expires_us, uint64_t epoch);

  // Removes every hold whose expiry is at or before `now_us`; returns
  // their leases. One atomic load when none has expired.
  std::vector<LeaseId> TakeExpired(uint64_t now_us);
  // Removes the holds of `keys` under `ns`: per key its lease, or 0 when
  // it was not held under `ns`; empty (no allocation) when nothing at all
  // is held, which is what every Erase meets unless an operator holds
  // blocks.
  std::vector<LeaseId> Take(const NamespaceFingerprint& ns, std::span<const BlockKey> keys);
  // Removes every hold of `ns` and advances its drop epoch (holds of it
  // still pending are refused when they land); returns their leases.
  std::vector<LeaseId> TakeNamespace(const NamespaceFingerprint& ns);

  // Holds in force at `now_us` (expired ones not yet taken excluded) and
  // their bytes.
  struct InForce {
    int64_t holds = 0;
    int64_t bytes = 0;
  };
  InForce CountInForce(uint64_t now_us) const;

 private:
  struct Held {
    NamespaceFingerprint ns;
    LeaseId lease = 0;
    uint64_t bytes = 0;
    uint64_t expires_us = 0;
  };
  // Sets `key`'s expiry; mu_ held.
  void SetExpiry(const BlockKey& key, uint64_t expires_us) REQUIRES(mu_);
  // Removes `key`'s hold and returns its lease (0: none); mu_ held.
  LeaseId Remove(const BlockKey& key) REQUIRES(mu_);
  // Caches the earliest expiry for TakeExpired's check; mu_ held.
  void NoteEarliest() REQUIRES(mu_);

  mutable Mutex mu_;
  std::unordered_map<BlockKey, Held> holds_ GUARDED_BY(mu_);
  std::set<std::pair<uint64_t, BlockKey>> expiries_ GUARDED_BY(mu_);
  std::unordered_map<NamespaceFingerprint, uint64_t> drops_ GUARDED_BY(mu_);
  // The earliest expiry in expiries_ (max: none), read without the lock.
  std::atomic<uint64_t> earliest_us_{std::numeric_limits<uint64_t>::max()};
};

}  // namespace kvtier

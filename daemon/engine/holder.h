// Holder: operator holds (`kvtier pin` / `kvtier unpin`), blocks of a
// namespace an operator keeps in the host tier for a while, whatever the
// eviction policy says, until Unhold, their TTL, a drop of their
// namespace (EndNamespaceHolds) or an Erase (EndHolds).
//
// A hold is an ordinary pin (Pinner::ClaimPins, the path a client's Pin
// takes) under kHoldConnection, which no client connection ever gets, so a
// held block is kPinned and never an eviction candidate, and a block found
// only below the host tier is promoted into it first (Promoter::Promote).
// Hold never waits: such a block's hold is pending until its read lands
// (the pin's on_resolve records it then, or counts engine.hold_failures).
// The HoldTable (hold_table.h), which the Holder owns, keeps each held
// key's lease and expiry.
//
// Expiry is lazy, with no sweeper thread: ReleaseExpired runs at every
// Hold and Unhold and (through the engine) before an allocation evicts
// anything, so an expired hold never keeps a block from eviction: the
// only thing a pin keeps a block from. In memory only.
//
// Thread-safe, no thread of its own, no lock of its own: the HoldTable's
// mutex is a leaf, and leases are released (shard locks, through the
// Pinner) only after it is dropped. Call every method with no lock held.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/clock.h"
#include "daemon/engine/engine_counters.h"
#include "daemon/engine/engine_types.h"
#include "daemon/engine/hold_table.h"
#include "daemon/engine/pinner.h"
#include "daemon/engine/promoter.h"
#include "kvtier/block_key.h"
#include "kvtier/result.h"

namespace kvtier {

class Holder {
 public:
  static constexpr uint64_t kMaxHoldTtlUs = 30ull * 24 * 3600 * 1'000'000;  // 30 days

  // Every reference is borrowed and outlives the Holder.
  Holder(const Clock& clock, Pinner& pinner, Promoter& promoter, EngineCounters& counters);
  Holder(const Holder&) = delete;
  Holder& operator=(const Holder&) = delete;

  // Holds `keys` of `ns` for `ttl_us` from now (1..kMaxHoldTtlUs, else
  // InvalidArgument for every key). A key this namespace holds already
  // gets the new expiry, now + ttl_us, and stays one pin. A hold is a use
  // (recency, hits), as a pin is. Never waits for I/O: a key being read
  // in (or whose demotion is still written) is ok and pending.
  std::vector<EngineHoldResult> Hold(const NamespaceFingerprint& ns, std::span<const BlockKey> keys, uint64_t ttl_us);
  // Ends the holds of `keys` of `ns`: per key ok, or NotFound (not held:
  // never, expired, or still pending). engine.holds_ended.
  std::vector<Status> Unhold(const NamespaceFingerprint& ns, std::span<const BlockKey> keys);
  // Releases every hold whose expiry has come (the clock's now >= expiry);
  // returns how many (engine.holds_expired). Cheap when none has (one
  // atomic load).
  size_t ReleaseExpired();
  // Ends the holds of `keys` of `ns` (they were erased); returns how many
  // there were. Cheap when nothing is held.
  size_t EndHolds(const NamespaceFingerprint& ns, std::span<const BlockKey> keys);
  // Ends every hold of `ns` (it was dropped); its holds still pending fail
  // when they land.
  void EndNamespaceHolds(const NamespaceFingerprint& ns);

  // Holds in force now (expired ones not yet released excluded) and their
  // bytes: the engine.holds and engine.held_bytes gauges.
  HoldTable::InForce InForce() const;

 private:
  // Records the pin `grant` of `key` as a hold until `expires_us`, unless
  // the key is held already (the later expiry stays, the extra pin goes)
  // or `ns` was dropped since the hold began (drop epoch `epoch`: the pin
  // goes, NotFound). A failed grant's status is returned as it is.
  Status Landed(const NamespaceFingerprint& ns, const BlockKey& key, const PinGrant& grant, uint64_t expires_us,
                uint64_t epoch);
  // Releases our own `leases` (each granted to kHoldConnection, each
  // released once: it cannot fail).
  void ReleaseOwn(std::span<const LeaseId> leases);

  const Clock& clock_;
  Pinner& pinner_;
  Promoter& promoter_;
  EngineCounters& counters_;
  HoldTable table_;
};

}  // namespace kvtier

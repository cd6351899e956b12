// Locator: where a chain of keys is, for a client's Lookup. Each key is
// placed from what the tiers know now, without I/O: the tier above the
// host first (if there is one), then the host tier's index (a committed
// or pinned block of the namespace; one reserved or being promoted is not
// there yet), then the highest tier below holding it, or the tier a
// demotion in flight is writing it to (it is there as soon as the write
// ends). The answer is the longest prefix found, with each key's tier as
// clients know it (TierLevel::reported). Tiers below that learn of keys
// only when asked (Prober, tiers/tier.h) are probed once per lookup, with
// no lock held, for every key from the first one no tier knows on. A
// lookup is not a use: it never changes what eviction sees.
//
// Thread-safe, and no thread of its own. Each key is placed under its
// shard's lock alone; under it only the tiers' Find (their leaf locks) is
// called, through `find_below` and on the tier above, as the lock order
// allows (docs/ARCHITECTURE.md, "One lock order"). Counters: per lookup
// engine.lookups, lookup_keys, lookup_hit_blocks and lookup_misses (a
// prefix shorter than the chain); per key placed, the hits of its tier.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "daemon/engine/engine_counters.h"
#include "daemon/engine/engine_levels.h"
#include "daemon/engine/engine_types.h"
#include "kvtier/block_key.h"
#include "kvtier/client.h"

namespace kvtier {

class BlockIndex;

class Locator {
 public:
  struct Hooks {
    // The level record of the tier above the host, or null when there is
    // none; it outlives the Locator. Takes no lock.
    std::function<TierLevel*()> above;
    // The highest tier below the host holding `key` under `ns`, now
    // (Engine::FindBelow); takes only the tiers' leaf locks, and is called
    // with a shard's lock held.
    std::function<std::optional<Located>(const BlockKey& key, const NamespaceFingerprint& ns)> find_below;
  };

  // Every reference is borrowed and outlives the Locator: the shards of
  // the host tier's index, the levels below the host (highest first;
  // Located::level indexes them) and the counters.
  Locator(const std::vector<std::unique_ptr<BlockIndex>>& shards, const std::vector<std::unique_ptr<TierLevel>>& below,
          EngineCounters& counters, Hooks hooks);
  Locator(const Locator&) = delete;
  Locator& operator=(const Locator&) = delete;

  // Longest prefix of `keys` committed under namespace `ns`, with tiers.
  LookupOutcome Lookup(const NamespaceFingerprint& ns, std::span<const BlockKey> keys);
  // The same Lookup in steps: places at most `max_keys` (at least one)
  // more of `keys` from `cursor.next` and sets `cursor.done` when a key
  // misses or none is left (then it counts as one lookup, and
  // `cursor.out` is Lookup's answer). A caller may do other work between
  // steps; the tiers below are probed at most once per cursor.
  // Precondition: `keys` is the same span on every step of a cursor.
  void LookupSome(const NamespaceFingerprint& ns, std::span<const BlockKey> keys, LookupCursor& cursor,
                  size_t max_keys);

  // Where `key` of `ns` is now, placed as Lookup places it (no probe, no
  // counter): its tier as clients know it, the tier below it is read from
  // (`below`, an index into the levels below; none in the host tier or
  // above), its bytes, and whether a promotion of it from there is in
  // flight (kPromoting; placed in that tier, as Lookup does). nullopt when
  // no tier knows it. Takes its shard's lock and the tiers' leaf locks.
  struct Placed {
    Tier tier = Tier::kNone;
    std::optional<size_t> below;
    uint64_t bytes = 0;
    bool promoting = false;
  };
  std::optional<Placed> Where(const NamespaceFingerprint& ns, const BlockKey& key) const;

 private:
  // Where, counting a hit of that tier.
  std::optional<Tier> Place(const NamespaceFingerprint& ns, const BlockKey& key);

  const std::vector<std::unique_ptr<BlockIndex>>& shards_;
  const std::vector<std::unique_ptr<TierLevel>>& below_;
  EngineCounters& counters_;
  const Hooks hooks_;
};

}  // namespace kvtier

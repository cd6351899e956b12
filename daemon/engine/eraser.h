// Eraser: removes blocks of a namespace from every tier of the stack
// (Engine::Erase, and through it DropNamespace). Per key, under its shard's
// lock:
//   the host tier  a committed (or pinned) block of `ns` leaves the index
//                  (BlockIndex::RemoveCommitted: a pinned one lives on as
//                  a zombie until its last release); one being promoted
//                  is marked so (kErasedWhilePromoting: the read ends as a
//                  miss); one whose demotion is in flight is marked
//                  (kErasedWhileDemoting: a write not started never
//                  starts, one done is undone when it ends).
//   the tiers below each copy stored under `ns` is erased; for a block
//                  that was moving (promoted or demoted), whatever the
//                  tier stores under the key, so that a write in flight
//                  is cancelled.
//   the tier above Hooks::erase_above, if there is one.
// With Reach::kThisNode (a hand-off's block a peer took) the levels off
// this node (reported remote: the shared pool, the peer tier) are left.
// A key counts as erased when any tier held it under `ns` or it was
// moving; the count is returned and added to engine.erases. Operator
// holds on the keys are the caller's to end (Holder::EndHolds).
//
// Thread-safe, no lock of its own: one shard lock at a time, held across
// the tiers' Find and Erase (leaf locks) and `erase_above`.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "daemon/engine/engine_counters.h"
#include "daemon/engine/engine_levels.h"
#include "kvtier/block_key.h"

namespace kvtier {

class BlockIndex;

class Eraser {
 public:
  struct Hooks {
    // Erases `key` from the tier above the host (AboveMover::Erase, with
    // `moving` as above); true when a stored block went. Null without a
    // tier above. Called under the key's shard lock.
    std::function<bool(const NamespaceFingerprint& ns, const BlockKey& key, bool moving)> erase_above;
  };

  // The shards of the host tier's index, the tiers below (highest first)
  // and the counters are borrowed and outlive the Eraser.
  Eraser(const std::vector<std::unique_ptr<BlockIndex>>& shards, const std::vector<std::unique_ptr<TierLevel>>& below,
         EngineCounters& counters, Hooks hooks);
  Eraser(const Eraser&) = delete;
  Eraser& operator=(const Eraser&) = delete;

  // Which tiers an erase reaches: all of them, or this node's only (not
  // the levels off this node, reported as remote: the remote pool, which
  // other nodes share, and the peer tier).
  enum class Reach { kEveryTier, kThisNode };
  // Erases `keys` of `ns` from the tiers `reach` names (see above);
  // returns how many there were.
  size_t Erase(const NamespaceFingerprint& ns, std::span<const BlockKey> keys, Reach reach = Reach::kEveryTier);

 private:
  const std::vector<std::unique_ptr<BlockIndex>>& shards_;
  const std::vector<std::unique_ptr<TierLevel>>& below_;
  EngineCounters& counters_;
  const Hooks hooks_;
};

}  // namespace kvtier

#include "daemon/engine/eraser.h"

#include <utility>

#include "daemon/engine/block_index.h"

namespace kvtier {

Eraser::Eraser(const std::vector<std::unique_ptr<BlockIndex>>& shards,
               const std::vector<std::unique_ptr<TierLevel>>& below, EngineCounters& counters, Hooks hooks)
    : shards_(shards), below_(below), counters_(counters), hooks_(std::move(hooks)) {}

size_t Eraser::Erase(const NamespaceFingerprint& ns, std::span<const BlockKey> keys, Reach reach) {
  size_t erased = 0;
  for (const BlockKey& key : keys) {
    BlockIndex& shard = ShardOf(shards_, key);
    MutexLock lock(shard.mu);
    auto it = shard.index.find(key);
    bool found = false;
    // A block on its way between tiers is erased in both: a promotion ends
    // as a miss, and a demotion's write in flight is cancelled by the
    // tier's Erase below.
    bool moving = false;
    if (it != shard.index.end() && it->second.ns == ns) {
      if (it->second.cached()) {
        shard.RemoveCommitted(it);
        found = true;
      } else if (it->second.promoting()) {
        shard.EraseWhilePromoting(it);
        moving = true;
      }
    }
    auto demoting = shard.demoting.find(key);
    if (demoting != shard.demoting.end() && demoting->second.ns == ns) {
      // A write not started yet never starts, one done is undone.
      shard.EraseWhileDemoting(demoting);
      moving = true;
    }
    for (const auto& b : below_) {
      if (reach == Reach::kThisNode && b->reported == Tier::kRemote) continue;
      // A quarantined copy is erased too (MeasuredTier::Find hides it).
      auto info = b->measured != nullptr ? b->measured->inner().Find(key) : b->tier->Find(key);
      if ((moving || (info && info->ns == ns)) && b->tier->Erase(key).ok()) found = true;
    }
    if (hooks_.erase_above != nullptr && hooks_.erase_above(ns, key, moving)) found = true;
    if (found || moving) ++erased;
  }
  Bump(counters_.erases, static_cast<int64_t>(erased));
  return erased;
}

}  // namespace kvtier

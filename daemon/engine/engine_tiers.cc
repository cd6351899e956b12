// Engine data movement down the tiers: a host victim's demotion to the
// tier below chosen for it (the Demoter, demoter.h, writes it) and the
// end of that demotion in its shard. Choosing the victims is the
// Evictor's (evictor.h); moving blocks up is the Promoter's (promoter.h).
#include "daemon/engine/engine.h"
#include "daemon/engine/block_index.h"

namespace kvtier {

void Engine::Demote(size_t level, const NamespaceFingerprint& ns, const BlockKey& key, HostTier::Extent extent,
                    uint64_t size, uint64_t checksum) {
  // A whole block keeps its layer split; any other size is one layer.
  const uint32_t layers = namespaces_.LayoutOf(ns, size).layer_count;
  demoter_->Demote(level, ns, key, layers, host_.Bytes(extent).first(size), checksum);
}

bool Engine::DemotionErased(const BlockKey& key) {
  BlockIndex& shard = ShardFor(key);
  MutexLock lock(shard.mu);
  auto it = shard.demoting.find(key);
  return it != shard.demoting.end() && it->second.state() == BlockState::kErasedWhileDemoting;
}

void Engine::FinishDemotion(const BlockKey& key, const Status& written) {
  BlockIndex& shard = ShardFor(key);
  std::vector<std::function<void()>> waiters;
  {
    MutexLock lock(shard.mu);
    if (std::optional<BlockIndex::Demoting> ended = shard.EndDemotion(key)) {
      waiters = std::move(ended->waiters);
      if (ended->state() == BlockState::kErasedWhileDemoting && written.ok()) {
        below_[ended->level]->tier->Erase(key).IgnoreError();
      }
    }
  }
  for (auto& retry : waiters) retry();
}

}  // namespace kvtier

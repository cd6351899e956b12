#include "daemon/engine/prefetch_stack.h"

#include <optional>
#include <utility>

#include "daemon/engine/block_index.h"

namespace kvtier {

Prefetcher::Stack MakePrefetchStack(PrefetchStackParts parts) {
  auto p = std::make_shared<PrefetchStackParts>(std::move(parts));
  const auto shard_for = [p](const BlockKey& key) -> BlockIndex& { return ShardOf(p->shards, key); };
  Prefetcher::Stack stack;
  stack.place = [p, shard_for](const NamespaceFingerprint& ns, const BlockKey& key) {
    PrefetchBlock b{key, 0, BlockPlace::kNowhere};
    {
      BlockIndex& shard = shard_for(key);
      MutexLock lock(shard.mu);
      auto it = shard.index.find(key);
      if (it != shard.index.end() && it->second.ns == ns && (it->second.cached() || it->second.promoting())) {
        b.place = BlockPlace::kHost;
        return b;
      }
    }
    if (std::optional<Located> below = FindBelow(p->below, key, ns)) {
      b.place = BlockPlace::kBelow;
      b.level = static_cast<uint32_t>(below->level);
      b.bytes = below->info.payload_bytes;
    }
    return b;
  };
  stack.read_bandwidths = [p] {
    std::vector<BandwidthEstimate> bandwidths;  // one read channel per tier below
    for (const auto& b : p->below) bandwidths.push_back(b->read_meter.estimate());
    return bandwidths;
  };
  stack.unused_prefetched_bytes = [p] {
    uint64_t bytes = 0;
    for (auto& shard : p->shards) {
      MutexLock lock(shard->mu);
      bytes += shard->prefetched_bytes;
    }
    return bytes;
  };
  stack.start_read = [p, shard_for](const NamespaceFingerprint& ns, const BlockKey& key) -> std::optional<uint64_t> {
    std::optional<Located> below = FindBelow(p->below, key, ns);
    if (!below) return std::nullopt;  // evicted meanwhile
    {
      // Claim the key as a Pin's promotion does: pins wait for this read.
      BlockIndex& shard = shard_for(key);
      MutexLock lock(shard.mu);
      if (shard.index.count(key) != 0) return std::nullopt;  // cached or being written meanwhile
      shard.BeginPromotion(key, ns, below->info.payload_bytes, /*prefetched=*/true);
    }
    p->read_started();
    p->promoter.Promote(key, *below);
    return below->info.payload_bytes;
  };
  return stack;
}

}  // namespace kvtier

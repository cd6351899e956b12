#include "daemon/engine/locator.h"

#include <algorithm>
#include <utility>

#include "daemon/engine/block_index.h"

namespace kvtier {

Locator::Locator(const std::vector<std::unique_ptr<BlockIndex>>& shards,
                 const std::vector<std::unique_ptr<TierLevel>>& below, EngineCounters& counters, Hooks hooks)
    : shards_(shards), below_(below), counters_(counters), hooks_(std::move(hooks)) {}

LookupOutcome Locator::Lookup(const NamespaceFingerprint& ns, std::span<const BlockKey> keys) {
  LookupCursor cursor;
  LookupSome(ns, keys, cursor, keys.size());
  return std::move(cursor.out);
}

std::optional<Locator::Placed> Locator::Where(const NamespaceFingerprint& ns, const BlockKey& key) const {
  if (TierLevel* above = hooks_.above()) {
    std::optional<BlockTier::BlockInfo> info = above->tier->Find(key);
    if (info && info->ns == ns) return Placed{above->reported, std::nullopt, info->payload_bytes, false};
  }
  BlockIndex& shard = ShardOf(shards_, key);
  MutexLock lock(shard.mu);
  auto it = shard.index.find(key);
  const bool ours = it != shard.index.end() && it->second.ns == ns;
  if (ours && it->second.cached()) return Placed{Tier::kHost, std::nullopt, it->second.size, false};
  if (std::optional<Located> below = hooks_.find_below(key, ns)) {
    const bool promoting = ours && it->second.state() == BlockState::kPromoting;
    return Placed{below_[below->level]->reported, below->level, below->info.payload_bytes, promoting};
  }
  // Being demoted: in that tier as soon as its write ends.
  auto demoting = shard.demoting.find(key);
  if (demoting == shard.demoting.end() || demoting->second.ns != ns) return std::nullopt;
  const size_t level = demoting->second.level;
  return Placed{below_[level]->reported, level, demoting->second.bytes, false};
}

std::optional<Tier> Locator::Place(const NamespaceFingerprint& ns, const BlockKey& key) {
  std::optional<Placed> placed = Where(ns, key);
  if (!placed) return std::nullopt;
  if (placed->below) {
    Bump(below_[*placed->below]->lookup_hits);
  } else if (placed->tier == Tier::kHost) {
    Bump(counters_.host_lookup_hits);
  } else {
    Bump(hooks_.above()->lookup_hits);
  }
  return placed->tier;
}

void Locator::LookupSome(const NamespaceFingerprint& ns, std::span<const BlockKey> keys, LookupCursor& cursor,
                         size_t max_keys) {
  if (cursor.done) return;
  LookupOutcome& out = cursor.out;
  if (cursor.next == 0) out.tiers.reserve(keys.size());
  max_keys = std::max<size_t>(max_keys, 1);
  const size_t end = keys.size() - cursor.next > max_keys ? cursor.next + max_keys : keys.size();
  bool missed = false;
  for (; cursor.next < end; ++cursor.next) {
    const size_t i = cursor.next;
    std::optional<Tier> tier = Place(ns, keys[i]);
    if (!tier && !cursor.probed && !below_.empty()) {
      // The rest of the chain is not known here: tiers that others write
      // too (the remote tier) learn about it now, with no lock held, in
      // one round trip for all of it.
      cursor.probed = true;
      for (const auto& b : below_) {
        if (Prober* prober = b->tier->prober()) prober->Probe(ns, keys.subspan(i));
      }
      tier = Place(ns, keys[i]);
    }
    if (!tier) {
      missed = true;
      break;
    }
    out.tiers.push_back(*tier);
  }
  if (!missed && cursor.next < keys.size()) return;  // more steps to come
  cursor.done = true;
  out.prefix_blocks = out.tiers.size();
  if (out.prefix_blocks < keys.size()) Bump(counters_.lookup_misses);
  Bump(counters_.lookups);
  Bump(counters_.lookup_keys, static_cast<int64_t>(keys.size()));
  Bump(counters_.lookup_hit_blocks, static_cast<int64_t>(out.prefix_blocks));
}

}  // namespace kvtier

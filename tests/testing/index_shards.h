// What the tests of the engine's parts (evictor, promoter, layer streamer)
// share when they run without an Engine: the index shards over a test
// arena, a pin of a committed host block as Pinner::PinLocked takes it,
// and block bytes that say which block and layer they are.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "daemon/engine/block_index.h"
#include "policy/policy_registry.h"
#include "tiers/host/host_tier.h"

namespace kvtier::testing {

// `count` shards over `host`, each with its own LRU policy.
inline std::vector<std::unique_ptr<BlockIndex>> MakeShards(HostTier& host, size_t count) {
  std::vector<std::unique_ptr<BlockIndex>> shards;
  for (size_t s = 0; s < count; ++s) {
    shards.push_back(std::make_unique<BlockIndex>(s, 1, MakeEvictionPolicy(EvictionPolicyId::kLru), host));
  }
  return shards;
}

// The host entry of `key` in `shards` (a copy, taken under its shard's
// lock), if there is one.
inline std::optional<BlockEntry> EntryOf(std::vector<std::unique_ptr<BlockIndex>>& shards, const BlockKey& key) {
  BlockIndex& shard = *shards[ShardIndexOf(key, shards.size())];
  MutexLock lock(shard.mu);
  auto it = shard.index.find(key);
  if (it == shard.index.end()) return std::nullopt;
  return it->second;
}

// Pins the committed block `key` of `shard` for `connection`, with its
// layer checksums when `with_layers`. The caller holds the shard's lock.
inline PinGrant PinCommitted(BlockIndex& shard, ConnectionId connection, const BlockKey& key, uint64_t now_us,
                             bool with_layers) {
  shard.mu.AssertHeld();
  BlockEntry& entry = shard.index.at(key);
  bool prefetched = false;
  const LeaseId lease = shard.Pin(key, entry, connection, now_us, &prefetched);
  PinGrant grant{Status::Ok(), entry.extent.offset, entry.size, lease, entry.checksum, 0, 0, {}};
  if (with_layers) grant.layer_checksums = entry.layer_checksums;
  return grant;
}

// `block_bytes` bytes of block `i` whose every byte depends on the block,
// its layer (of `layer_bytes`) and its place: a misplaced layer shows.
inline std::vector<std::byte> LayeredBlockBytes(uint64_t i, uint64_t block_bytes, uint64_t layer_bytes) {
  std::vector<std::byte> bytes(block_bytes);
  for (size_t b = 0; b < bytes.size(); ++b)
    bytes[b] = std::byte(static_cast<uint8_t>(i * 31 + b / layer_bytes * 7 + b));
  return bytes;
}

}  // namespace kvtier::testing

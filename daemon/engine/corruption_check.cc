// CorruptionCheck (corruption_check.h): a reported block is pinned at
// once and hashed again off the request thread; only a block that does
// not match what was recorded at its commit is dropped.
#include "daemon/engine/corruption_check.h"

#include <string>
#include <utility>

#include "common/checksum.h"
#include "common/mutex.h"
#include "daemon/engine/block_index.h"

namespace kvtier {
namespace {

// Whether `block` matches what was recorded at its commit: the whole-block
// checksum and, when the block has several layers, each layer's.
bool MatchesRecord(std::span<const std::byte> block, const PinGrant& pin) {
  if (BlockChecksum(block) != pin.checksum) return false;
  const std::vector<uint64_t>& layers = pin.layer_checksums;
  return layers.size() <= 1 || FirstBadLayer(block, layers) == layers.size();
}

}  // namespace

CorruptionCheck::CorruptionCheck(const std::vector<std::unique_ptr<BlockIndex>>& shards, const HostTier& host,
                                 const Clock& clock, Mover& io, EngineCounters& counters, Hooks hooks)
    : shards_(shards), host_(host), clock_(clock), io_(io), counters_(counters), hooks_(std::move(hooks)) {}

BlockIndex& CorruptionCheck::ShardFor(const BlockKey& key) const { return ShardOf(shards_, key); }

void CorruptionCheck::Check(const NamespaceFingerprint& ns, std::span<const BlockKey> keys,
                            std::function<void(Result<size_t>)> done) {
  if (keys.size() > kMaxReportedKeys) {
    done(InvalidArgument("a corruption report names " + std::to_string(keys.size()) + " blocks; at most " +
                         std::to_string(kMaxReportedKeys)));
    return;
  }
  if (!io_.TryReserve(0)) {
    done(Busy("the host tier's check queue is full; the reported blocks were not checked"));
    return;
  }
  std::vector<Reported> held;
  const uint64_t now_us = clock_.NowUs();
  for (const BlockKey& key : keys) {
    BlockIndex& shard = ShardFor(key);
    MutexLock lock(shard.mu);
    auto it = shard.index.find(key);
    // Only the host tier's copy was read; another namespace's block under
    // the same key is not the one reported.
    if (it == shard.index.end() || !it->second.cached() || it->second.ns != ns) continue;
    held.push_back(Reported{key, hooks_.pin(shard, key, now_us)});
  }
  if (held.empty()) {
    io_.Unreserve(0);
    done(size_t{0});
    return;
  }
  Bump(counters_.corrupt_reports, static_cast<int64_t>(held.size()));
  hooks_.io_started();
  io_.Submit(0, [this, ns, held = std::move(held), done = std::move(done)]() mutable {
    done(CheckHeld(ns, held));
    hooks_.io_finished();
  });
}

size_t CorruptionCheck::CheckHeld(const NamespaceFingerprint& ns, std::vector<Reported>& held) {
  size_t dropped = 0;
  for (Reported& r : held) {
    const bool intact = MatchesRecord(host_.Bytes(HostTier::Extent{r.pin.offset, r.pin.length}), r.pin);
    if (intact) {
      Bump(counters_.corrupt_reports_refuted);
    } else {
      BlockIndex& shard = ShardFor(r.key);
      MutexLock lock(shard.mu);
      auto it = shard.index.find(r.key);
      // Still the block that was hashed (our pin kept its extent); a
      // pinned block becomes a zombie its last release frees.
      if (it != shard.index.end() && it->second.cached() && it->second.ns == ns &&
          it->second.extent.offset == r.pin.offset && it->second.checksum == r.pin.checksum) {
        shard.RemoveCommitted(it);
        Bump(counters_.corrupt_drops);
        ++dropped;
        if (hooks_.corrupt) hooks_.corrupt(r.key);  // a leaf lock, under the shard lock
      }
    }
    hooks_.release(r.pin.lease);
  }
  return dropped;
}

}  // namespace kvtier

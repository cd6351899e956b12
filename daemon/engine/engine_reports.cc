// Engine::CheckReportedCorrupt: blocks a client's verified read found not
// matching their checksums, checked again by the daemon before anything is
// dropped (see engine.h). The reporter's connection is answered only once
// the check is done, so by the time its read returns Corruption the block
// is gone for every later reader, verifying or not.
#include <string>
#include <utility>
#include <vector>

#include "common/checksum.h"
#include "daemon/engine/engine.h"
#include "daemon/engine/block_index.h"

namespace kvtier {
namespace {

// A reported block, pinned (under kHostTierConnection) until checked.
struct ReportedBlock {
  BlockKey key;
  PinGrant pin;  // with the checksum of every layer
};

// Whether `block` matches what was recorded at its commit: the whole-block
// checksum and, when the block has several layers, each layer's.
bool MatchesRecord(std::span<const std::byte> block, const PinGrant& pin) {
  if (BlockChecksum(block) != pin.checksum) return false;
  const std::vector<uint64_t>& layers = pin.layer_checksums;
  return layers.size() <= 1 || FirstBadLayer(block, layers) == layers.size();
}

}  // namespace

void Engine::CheckReportedCorrupt(const NamespaceFingerprint& ns, std::span<const BlockKey> keys,
                                  std::function<void(Result<size_t>)> done) {
  if (keys.size() > kMaxReportedKeys) {
    done(InvalidArgument("a corruption report names " + std::to_string(keys.size()) + " blocks; at most " +
                         std::to_string(kMaxReportedKeys)));
    return;
  }
  if (!host_io_->TryReserve(0)) {
    done(Busy("the host tier's check queue is full; the reported blocks were not checked"));
    return;
  }
  std::vector<ReportedBlock> held;
  const uint64_t now_us = clock_.NowUs();
  for (const BlockKey& key : keys) {
    BlockIndex& shard = ShardFor(key);
    MutexLock lock(shard.mu);
    auto it = shard.index.find(key);
    // Only the host tier's copy was read; another namespace's block under
    // the same key is not the one reported.
    if (it == shard.index.end() || !it->second.cached() || it->second.ns != ns) continue;
    held.push_back(
        ReportedBlock{key, pinner_->PinLocked(shard, kHostTierConnection, key, now_us, /*with_layers=*/true)});
  }
  if (held.empty()) {
    host_io_->Unreserve(0);
    done(size_t{0});
    return;
  }
  Bump(counters_.corrupt_reports, static_cast<int64_t>(held.size()));
  IoStarted();
  host_io_->Submit(0, [this, ns, held = std::move(held), done = std::move(done)]() mutable {
    size_t dropped = 0;
    for (ReportedBlock& r : held) {
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
        }
      }
      pinner_->Release(kHostTierConnection, {&r.pin.lease, 1});
    }
    done(dropped);
    IoFinished();
  });
}

}  // namespace kvtier

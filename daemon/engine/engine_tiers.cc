// Engine data movement between the tiers: promotion (and layer reads)
// from a tier below into the host arena, and demotion to the tiers below,
// including blocks a lower tier evicts. Choosing the victims is the
// Evictor's (evictor.h).
#include <algorithm>
#include <chrono>
#include <cstring>

#include "common/check.h"
#include "daemon/engine/engine.h"
#include "daemon/engine/block_index.h"
#include "policy/demotion_target.h"

namespace kvtier {
namespace {

// How long a promotion a busy tier refused (out of read staging) is
// retried, a pause apart on the engine's clock, before its pins get Busy.
constexpr uint64_t kPromotionBusyWaitUs = 2'000'000;
constexpr uint64_t kPromotionRetryPauseUs = 1'000;

}  // namespace

void Engine::ReadLayers(const std::shared_ptr<PinBatch>& batch, size_t index, const BlockKey& key,
                        const Located& from, LayerSpan layers) {
  IoStarted();
  const uint64_t bytes = (layers.last - layers.first) * (from.info.payload_bytes / from.info.layer_count);
  auto finish = [this, batch, index, key, bytes](Status status, HostTier::Extent extent,
                                                 std::vector<uint64_t> layer_checksums) {
    PinGrant grant;
    if (status.ok()) {
      // The transient extent lives as an invisible (zombie) entry held by
      // one lease: the last Release, or the connection's end, frees it.
      BlockIndex& shard = ShardFor(key);
      MutexLock lock(shard.mu);
      const LeaseId lease = shard.AddLayerRead(key, extent, bytes, next_handle_.fetch_add(1, std::memory_order_relaxed),
                                               batch->connection);
      grant = PinGrant{Status::Ok(), extent.offset, bytes, lease, 0, 0, 0, std::move(layer_checksums)};
      Bump(counters_.pins);
      Bump(counters_.layer_reads);
    } else {
      if (extent.length != 0) host_.Free(extent);
      EndTransient(bytes);
      grant.status = status.code() == StatusCode::kNoSpace || status.code() == StatusCode::kBusy
                         ? status
                         : NotFound("layers of block " + key.ToHex() + " could not be read from the tier below (" +
                                    status.ToString() + ")");
      Bump(counters_.pin_misses);
    }
    Resolve(batch, index, std::move(grant));
    IoFinished();
  };
  if (!TakeTransient(bytes)) {
    Bump(counters_.layer_reads_busy);
    PinGrant busy{Busy("layer reads in flight hold the whole layer-read pool (" +
                       std::to_string(layer_read_pool_bytes_) + " bytes, engine.layer_read_share); retry")};
    Resolve(batch, index, std::move(busy));
    return IoFinished();
  }
  Result<HostTier::Extent> extent = evictor_->Allocate(bytes);
  if (!extent.ok()) return finish(extent.status(), {}, {});
  TierLevel& below = SourceAt(from.level);
  below.read_meter.Started(clock_.NowUs());
  // The tier's own checksums of the layers it verified travel with the
  // grant, so that a client that verifies checks the bytes it reads.
  Status started = below.tier->ReadWithLayerChecksums(
      key, layers.first, layers.last, host_.Bytes(*extent).first(bytes),
      [this, &below, finish, extent = *extent, bytes, count = layers.last - layers.first](
          Result<BlockTier::LayerRead> r) {
        below.read_meter.Ended(r.ok() ? r->bytes : 0, clock_.NowUs());
        if (!r.ok()) return finish(r.status(), extent, {});
        if (r->bytes != bytes) return finish(IoError("short layer read"), extent, {});
        if (r->layer_checksums.size() != count) {
          return finish(Internal("the tier gave no checksum per layer read"), extent, {});
        }
        finish(Status::Ok(), extent, std::move(r->layer_checksums));
      });
  if (!started.ok()) {
    below.read_meter.Ended(0, clock_.NowUs());
    finish(started, *extent, {});
  }
}

void Engine::Promote(const BlockKey& key, const Located& from) {
  Promote(key, from, clock_.NowUs() + kPromotionBusyWaitUs);
}

void Engine::Promote(const BlockKey& key, const Located& from, uint64_t deadline_us) {
  IoStarted();
  const uint64_t checksum = from.info.payload_checksum;
  Result<HostTier::Extent> extent = evictor_->Allocate(from.info.payload_bytes);
  if (!extent.ok()) return FinishPromotion(key, extent.status(), {}, checksum);
  TierLevel& below = SourceAt(from.level);
  below.read_meter.Started(clock_.NowUs());
  // With the layers' checksums, which the host entry records, from a tier
  // that keeps them (no extra pass); else a plain read (the block then has
  // none, as a block whose writer sent none).
  Status started =
      from.info.layer_count > 1 && below.tier->keeps_layer_checksums()
          ? below.tier->ReadWithLayerChecksums(key, 0, from.info.layer_count, host_.Bytes(*extent),
                                               [this, &below, key, extent = *extent, checksum](
                                                   Result<BlockTier::LayerRead> r) {
                                                 below.read_meter.Ended(r.ok() ? r->bytes : 0, clock_.NowUs());
                                                 if (!r.ok()) return FinishPromotion(key, r.status(), extent, checksum);
                                                 FinishPromotion(key, Status::Ok(), extent, checksum,
                                                                 std::move(r->layer_checksums));
                                               })
          : below.tier->Read(key, 0, from.info.layer_count, host_.Bytes(*extent),
                             [this, &below, key, extent = *extent, checksum](Result<size_t> r) {
                               below.read_meter.Ended(r.ok() ? *r : 0, clock_.NowUs());
                               FinishPromotion(key, r.status(), extent, checksum);
                             });
  if (started.ok()) return;
  below.read_meter.Ended(0, clock_.NowUs());
  host_.Free(*extent);
  // Out of read staging for now: not a miss. It is tried again a moment
  // later (the pins keep waiting), until the deadline; a full retry queue
  // fails it now.
  if (started.code() == StatusCode::kBusy && clock_.NowUs() < deadline_us) {
    IoStarted();  // the retry's, ended by the job
    const bool queued = retries_->RunAfter(kPromotionRetryPauseUs, [this, key, from, deadline_us] {
      Bump(counters_.promotion_retries);
      Promote(key, from, deadline_us);
      IoFinished();
    });
    if (queued) return IoFinished();  // this attempt's
    IoFinished();
  }
  FinishPromotion(key, started, {}, checksum);
}

void Engine::FinishPromotion(const BlockKey& key, Status status, HostTier::Extent extent, uint64_t checksum,
                             std::vector<uint64_t> layer_checksums) {
  BlockIndex& shard = ShardFor(key);
  const uint64_t now = clock_.NowUs();
  if (status.ok() && !layer_checksums.empty()) {
    // The host entry keeps the layer checksums the tier verified when they
    // fit the namespace's layout (always, for blocks the engine demoted).
    NamespaceFingerprint ns;
    uint64_t size = 0;
    {
      MutexLock lock(shard.mu);
      auto it = shard.index.find(key);
      if (it != shard.index.end()) {
        ns = it->second.ns;
        size = it->second.size;
      }
    }
    const uint32_t layers = size == 0 ? 1 : namespaces_.LayoutOf(ns, size).layer_count;
    if (layers <= 1 || layer_checksums.size() != layers) layer_checksums.clear();
  }
  std::vector<PromotionWaiter> waiters;
  std::vector<PinGrant> grants;
  bool prefetched = false;
  {
    MutexLock lock(shard.mu);
    auto node = shard.promotion_waiters.extract(key);
    if (!node.empty()) waiters = std::move(node.mapped());
    auto it = shard.index.find(key);
    KVTIER_CHECK(it != shard.index.end() && it->second.promoting(), "promotion lost its entry");
    BlockEntry& entry = it->second;
    prefetched = entry.prefetched;
    if (status.ok() && entry.state() == BlockState::kErasedWhilePromoting) {
      status = NotFound("block " + key.ToHex() + " was erased during its promotion");
    }
    if (status.ok()) {
      // kCommitted, then kPinned with the waiters' pins below.
      shard.CommitPromoted(it, extent, checksum, std::move(layer_checksums),
                           next_handle_.fetch_add(1, std::memory_order_relaxed), now);
      for (const auto& w : waiters) {
        grants.push_back(PinLocked(shard, w.batch->connection, key, now, w.batch->with_layers));
      }
      Bump(counters_.promotions);
    } else {
      shard.FailPromotion(it, extent);
      // No room (NoSpace) or a tier still busy after its retries (Busy) is
      // not a miss: the caller may try again.
      Status miss = status.code() == StatusCode::kNoSpace || status.code() == StatusCode::kBusy
                        ? status
                        : NotFound("block " + key.ToHex() + " could not be read from the tier below (" +
                                   status.ToString() + ")");
      for (size_t i = 0; i < waiters.size(); ++i) grants.push_back(PinGrant{miss});
      Bump(counters_.promotion_failures);
      Bump(counters_.pin_misses, static_cast<int64_t>(waiters.size()));
    }
  }
  for (size_t i = 0; i < waiters.size(); ++i) Resolve(waiters[i].batch, waiters[i].index, std::move(grants[i]));
  // The last read of a prefetch plan landed: plan again with the measured
  // bandwidth and whatever changed meanwhile. Not after a failure, which a
  // new plan could only repeat (and a synchronous one would recurse).
  const bool last_prefetch = prefetched && prefetcher_->ReadLanded();
  if (last_prefetch && status.ok()) SchedulePrefetch();
  IoFinished();
}

bool Engine::TakeTransient(uint64_t bytes) {
  uint64_t held = transient_bytes_.load(std::memory_order_relaxed);
  do {
    if (held + bytes > layer_read_pool_bytes_) return false;
  } while (!transient_bytes_.compare_exchange_weak(held, held + bytes, std::memory_order_relaxed));
  return true;
}

void Engine::EndTransient(uint64_t bytes) {
  if (bytes != 0) transient_bytes_.fetch_sub(bytes, std::memory_order_relaxed);
}

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

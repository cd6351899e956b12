#include "daemon/engine/promoter.h"

#include <string>
#include <utility>

#include "common/check.h"
#include "daemon/engine/block_index.h"

namespace kvtier {

Promoter::Promoter(const std::vector<std::unique_ptr<BlockIndex>>& shards, HostTier& host, const Clock& clock,
                   RetryScheduler& retries, uint64_t layer_read_pool_bytes, EngineCounters& counters, Hooks hooks)
    : shards_(shards),
      host_(host),
      clock_(clock),
      retries_(retries),
      layer_read_pool_bytes_(layer_read_pool_bytes),
      counters_(counters),
      hooks_(std::move(hooks)) {}

BlockIndex& Promoter::ShardFor(const BlockKey& key) const { return ShardOf(shards_, key); }

void Promoter::ReadLayers(const std::shared_ptr<PinBatch>& batch, size_t index, const BlockKey& key,
                          const Located& from, LayerSpan layers) {
  hooks_.io_started();
  const uint64_t bytes = (layers.last - layers.first) * (from.info.payload_bytes / from.info.layer_count);
  auto finish = [this, batch, index, key, bytes](Status status, HostTier::Extent extent,
                                                 std::vector<uint64_t> layer_checksums) {
    PinGrant grant;
    if (status.ok()) {
      // The transient extent lives as an invisible (zombie) entry held by
      // one lease: the last Release, or the connection's end, frees it.
      BlockIndex& shard = ShardFor(key);
      MutexLock lock(shard.mu);
      const LeaseId lease = shard.AddLayerRead(key, extent, bytes, hooks_.next_handle(), batch->connection);
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
    hooks_.io_finished();
  };
  if (!TakeTransient(bytes)) {
    Bump(counters_.layer_reads_busy);
    PinGrant busy{Busy("layer reads in flight hold the whole layer-read pool (" +
                       std::to_string(layer_read_pool_bytes_) + " bytes, engine.layer_read_share); retry")};
    Resolve(batch, index, std::move(busy));
    return hooks_.io_finished();
  }
  Result<HostTier::Extent> extent = hooks_.allocate(bytes);
  if (!extent.ok()) return finish(extent.status(), {}, {});
  TierLevel& below = hooks_.source(from.level);
  below.read_meter.Started(bytes, clock_.NowUs());
  // The tier's own checksums of the layers it verified travel with the
  // grant, so that a client that verifies checks the bytes it reads.
  Status started = below.tier->ReadWithLayerChecksums(
      key, layers.first, layers.last, host_.Bytes(*extent).first(bytes),
      [this, &below, finish, batch, index, key, from, layers, extent = *extent, bytes,
       count = layers.last - layers.first](Result<BlockTier::LayerRead> r) {
        below.read_meter.Ended(bytes, r.ok() ? r->bytes : 0, clock_.NowUs());
        if (r.status().code() == StatusCode::kNotFound && FollowLayersDown(batch, index, key, from, layers, extent)) {
          return hooks_.io_finished();  // this attempt's
        }
        if (!r.ok()) return finish(r.status(), extent, {});
        if (r->bytes != bytes) return finish(IoError("short layer read"), extent, {});
        if (r->layer_checksums.size() != count) {
          return finish(Internal("the tier gave no checksum per layer read"), extent, {});
        }
        finish(Status::Ok(), extent, std::move(r->layer_checksums));
      });
  if (!started.ok()) {
    below.read_meter.Ended(bytes, 0, clock_.NowUs());
    if (started.code() == StatusCode::kNotFound && FollowLayersDown(batch, index, key, from, layers, *extent)) {
      return hooks_.io_finished();  // this attempt's
    }
    finish(started, *extent, {});
  }
}

bool Promoter::FollowLayersDown(const std::shared_ptr<PinBatch>& batch, size_t index, const BlockKey& key,
                                const Located& from, LayerSpan layers, HostTier::Extent extent) {
  std::optional<Located> again = hooks_.find_below(key, from.info.ns);
  if (!again || again->level <= from.level) return false;  // only further down, as FollowDown
  // This attempt's space and pool share go back before the next one takes its own.
  host_.Free(extent);
  EndTransient((layers.last - layers.first) * (from.info.payload_bytes / from.info.layer_count));
  Bump(counters_.layer_reads_followed_down);
  hooks_.io_started();  // the job's, which it ends
  const bool queued = retries_.RunAfter(0, [this, batch, index, key, again = *again, layers] {
    ReadLayers(batch, index, key, again, layers);
    hooks_.io_finished();
  });
  if (!queued) {
    hooks_.io_finished();
    Bump(counters_.pin_misses);
    Resolve(batch, index, PinGrant{Busy("the retry queue is full; retry the layer read")});
  }
  return true;
}

void Promoter::Promote(const BlockKey& key, const Located& from) {
  Promote(key, from, clock_.NowUs() + kPromotionBusyWaitUs);
}

void Promoter::Promote(const BlockKey& key, const Located& from, uint64_t deadline_us) {
  hooks_.io_started();
  const uint64_t checksum = from.info.payload_checksum;
  Result<HostTier::Extent> extent = hooks_.allocate(from.info.payload_bytes);
  if (!extent.ok()) return FinishPromotion(key, extent.status(), {}, checksum);
  TierLevel& below = hooks_.source(from.level);
  const uint64_t bytes = from.info.payload_bytes;
  below.read_meter.Started(bytes, clock_.NowUs());
  // With the layers' checksums, which the host entry records, from a tier
  // that keeps them (no extra pass); else a plain read (the block then has
  // none, as a block whose writer sent none).
  Status started =
      from.info.layer_count > 1 && below.tier->keeps_layer_checksums()
          ? below.tier->ReadWithLayerChecksums(key, 0, from.info.layer_count, host_.Bytes(*extent),
                                               [this, &below, key, from, deadline_us, extent = *extent, checksum,
                                                bytes](Result<BlockTier::LayerRead> r) {
                                                 below.read_meter.Ended(bytes, r.ok() ? r->bytes : 0, clock_.NowUs());
                                                 if (!r.ok())
                                                   return EndRead(key, from, deadline_us, r.status(), extent);
                                                 FinishPromotion(key, Status::Ok(), extent, checksum,
                                                                 std::move(r->layer_checksums));
                                               })
          : below.tier->Read(key, 0, from.info.layer_count, host_.Bytes(*extent),
                             [this, &below, key, from, deadline_us, extent = *extent, bytes](Result<size_t> r) {
                               below.read_meter.Ended(bytes, r.ok() ? *r : 0, clock_.NowUs());
                               EndRead(key, from, deadline_us, r.status(), extent);
                             });
  if (started.ok()) return;
  below.read_meter.Ended(bytes, 0, clock_.NowUs());
  host_.Free(*extent);
  if (started.code() == StatusCode::kNotFound && FollowDown(key, from, deadline_us)) return hooks_.io_finished();
  // Out of read staging for now: not a miss. It is tried again a moment
  // later (the pins keep waiting), until the deadline; a full retry queue
  // fails it now.
  if (started.code() == StatusCode::kBusy && clock_.NowUs() < deadline_us) {
    hooks_.io_started();  // the retry's, ended by the job
    const bool queued = retries_.RunAfter(kPromotionRetryPauseUs, [this, key, from, deadline_us] {
      Bump(counters_.promotion_retries);
      Promote(key, from, deadline_us);
      hooks_.io_finished();
    });
    if (queued) return hooks_.io_finished();  // this attempt's
    hooks_.io_finished();
  }
  FinishPromotion(key, started, {}, checksum);
}

void Promoter::EndRead(const BlockKey& key, const Located& from, uint64_t deadline_us, Status status,
                       HostTier::Extent extent) {
  if (status.code() == StatusCode::kNotFound) {
    host_.Free(extent);
    if (FollowDown(key, from, deadline_us)) return hooks_.io_finished();  // this attempt's
    return FinishPromotion(key, std::move(status), {}, from.info.payload_checksum);
  }
  FinishPromotion(key, std::move(status), extent, from.info.payload_checksum);
}

bool Promoter::FollowDown(const BlockKey& key, const Located& from, uint64_t deadline_us) {
  std::optional<Located> again = hooks_.find_below(key, from.info.ns);
  // Only further down (so a block moves at most the stack's depth), and
  // never from the tier above, whose evictions go to the host tier.
  if (!again || again->level <= from.level) return false;
  Bump(counters_.promotions_followed_down);
  hooks_.io_started();  // the job's, which it ends
  const bool queued = retries_.RunAfter(0, [this, key, again = *again, deadline_us] {
    Promote(key, again, deadline_us);
    hooks_.io_finished();
  });
  if (!queued) hooks_.io_finished();
  return queued;
}

std::vector<uint64_t> Promoter::FittingLayerChecksums(const BlockKey& key, std::vector<uint64_t> layer_checksums) {
  // The host entry keeps the layer checksums the tier verified when they
  // fit the namespace's layout (always, for blocks the engine demoted).
  NamespaceFingerprint ns;
  uint64_t size = 0;
  {
    BlockIndex& shard = ShardFor(key);
    MutexLock lock(shard.mu);
    auto it = shard.index.find(key);
    if (it != shard.index.end()) {
      ns = it->second.ns;
      size = it->second.size;
    }
  }
  const uint32_t layers = size == 0 ? 1 : hooks_.layer_count(ns, size);
  if (layers <= 1 || layer_checksums.size() != layers) layer_checksums.clear();
  return layer_checksums;
}

void Promoter::FinishPromotion(const BlockKey& key, Status status, HostTier::Extent extent, uint64_t checksum,
                               std::vector<uint64_t> layer_checksums) {
  BlockIndex& shard = ShardFor(key);
  const uint64_t now = clock_.NowUs();
  if (status.ok() && !layer_checksums.empty()) {
    layer_checksums = FittingLayerChecksums(key, std::move(layer_checksums));
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
      shard.CommitPromoted(it, extent, checksum, std::move(layer_checksums), hooks_.next_handle(), now);
      for (const auto& w : waiters) {
        grants.push_back(hooks_.pin(shard, w.batch->connection, key, now, w.batch->with_layers));
      }
      Bump(counters_.promotions);
    } else {
      shard.FailPromotion(it, extent);
      // No room (NoSpace) or a tier still busy after its retries (Busy) is
      // not a miss: the caller may try again.
      Status miss =
          status.code() == StatusCode::kNoSpace || status.code() == StatusCode::kBusy
              ? status
              : NotFound("block " + key.ToHex() + " could not be read from the tier below (" + status.ToString() + ")");
      for (size_t i = 0; i < waiters.size(); ++i) grants.push_back(PinGrant{miss});
      Bump(counters_.promotion_failures);
      Bump(counters_.pin_misses, static_cast<int64_t>(waiters.size()));
    }
  }
  for (size_t i = 0; i < waiters.size(); ++i) Resolve(waiters[i].batch, waiters[i].index, std::move(grants[i]));
  // The last read of a prefetch plan may have landed: the engine plans
  // again (not after a failure, which a new plan could only repeat).
  if (prefetched) hooks_.prefetch_read_ended(status.ok());
  hooks_.io_finished();
}

bool Promoter::TakeTransient(uint64_t bytes) {
  uint64_t held = transient_bytes_.load(std::memory_order_relaxed);
  do {
    if (held + bytes > layer_read_pool_bytes_) return false;
  } while (!transient_bytes_.compare_exchange_weak(held, held + bytes, std::memory_order_relaxed));
  return true;
}

void Promoter::EndTransient(uint64_t bytes) {
  if (bytes != 0) transient_bytes_.fetch_sub(bytes, std::memory_order_relaxed);
}

}  // namespace kvtier

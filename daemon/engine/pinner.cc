#include "daemon/engine/pinner.h"

#include <future>
#include <string>
#include <utility>

#include "daemon/engine/block_index.h"

namespace kvtier {
namespace {

// Checks `layers` against a block of `layer_count` layers.
Status CheckSpan(LayerSpan layers, uint32_t layer_count, const BlockKey& key) {
  if (layers.first < layers.last && layers.last <= layer_count) return Status::Ok();
  return InvalidArgument("layer range [" + std::to_string(layers.first) + ", " + std::to_string(layers.last) +
                         ") is not within the " + std::to_string(layer_count) + " layers of block " + key.ToHex());
}

}  // namespace

Pinner::Pinner(const std::vector<std::unique_ptr<BlockIndex>>& shards, const Clock& clock, Promoter& promoter,
               EngineCounters& counters, Hooks hooks)
    : shards_(shards), clock_(clock), promoter_(promoter), counters_(counters), hooks_(std::move(hooks)) {}

BlockIndex& Pinner::ShardFor(const BlockKey& key) const { return ShardOf(shards_, key); }

PinGrant Pinner::PinLocked(BlockIndex& shard, ConnectionId connection, const BlockKey& key, uint64_t now_us,
                           bool with_layers) {
  shard.mu.AssertHeld();
  BlockEntry& entry = shard.index.at(key);
  bool was_prefetched = false;
  const LeaseId lease = shard.Pin(key, entry, connection, now_us, &was_prefetched);
  if (was_prefetched) {
    hooks_.note_prefetch_use();
    Bump(counters_.prefetches_on_time);
  }
  Bump(counters_.pins);
  Bump(counters_.host_pinned_bytes, static_cast<int64_t>(entry.size));
  PinGrant grant{Status::Ok(), entry.extent.offset, entry.size, lease, entry.checksum, 0, 0, {}};
  if (with_layers) {
    const uint32_t layers = hooks_.layer_count(entry.ns, entry.size);
    grant.layer_checksums = LayerChecksumsOf(entry, layers, 0, layers);
  }
  return grant;
}

std::vector<uint64_t> Pinner::LayerChecksumsOf(const BlockEntry& entry, uint32_t layer_count, uint32_t first,
                                               uint32_t last) {
  if (layer_count <= 1) return {entry.checksum};
  // Every committed block of several layers has them (Commit, promotion);
  // none here only for a layout registered after the block was committed.
  if (entry.layer_checksums.size() != layer_count || first >= last || last > layer_count) return {};
  return std::vector<uint64_t>(entry.layer_checksums.begin() + first, entry.layer_checksums.begin() + last);
}

void Pinner::PinAsync(ConnectionId connection, const NamespaceFingerprint& ns, std::vector<BlockKey> keys, PinDone done,
                      LayerSpan layers) {
  auto batch = std::make_shared<PinBatch>();
  batch->connection = connection;
  batch->done = std::move(done);
  RunPins(batch, ns, keys, layers);
}

std::vector<PinGrant> Pinner::Pin(ConnectionId connection, const NamespaceFingerprint& ns,
                                  std::span<const BlockKey> keys, LayerSpan layers) {
  std::promise<std::vector<PinGrant>> promise;
  auto future = promise.get_future();
  PinAsync(
      connection, ns, std::vector<BlockKey>(keys.begin(), keys.end()),
      [&promise](std::vector<PinGrant> grants) { promise.set_value(std::move(grants)); }, layers);
  return future.get();
}

void Pinner::RunPins(const std::shared_ptr<PinBatch>& batch, const NamespaceFingerprint& ns,
                     std::span<const BlockKey> keys, LayerSpan layers) {
  ProbeUnknown(ns, keys);
  PinClaims claims = ClaimPins(batch, ns, keys, layers);
  for (const auto& p : claims.promote) promoter_.Promote(p.key, p.from);
  for (const auto& r : claims.read_layers) promoter_.ReadLayers(batch, r.index, r.key, r.from, layers);
  EndClaims(batch);
}

void Pinner::EndClaims(const std::shared_ptr<PinBatch>& batch) {
  if (batch->outstanding.fetch_sub(1, std::memory_order_acq_rel) == 1) batch->done(std::move(batch->grants));
  // A prefetched block was used: the budget it held may go to the next
  // queued requests.
  hooks_.uses_noted();
}

void Pinner::RetryPin(const std::shared_ptr<PinBatch>& batch, size_t index, const BlockKey& key,
                      const NamespaceFingerprint& ns, LayerSpan layers) {
  auto retry = std::make_shared<PinBatch>();
  retry->connection = batch->connection;
  retry->with_layers = batch->with_layers;
  retry->done = [batch, index](std::vector<PinGrant> grants) { Resolve(batch, index, std::move(grants[0])); };
  RunPins(retry, ns, {&key, 1}, layers);
}

void Pinner::ProbeUnknown(const NamespaceFingerprint& ns, std::span<const BlockKey> keys) {
  if (!hooks_.probe) return;
  std::vector<BlockKey> unknown;
  for (const BlockKey& key : keys) {
    BlockIndex& shard = ShardFor(key);
    MutexLock lock(shard.mu);
    if (shard.index.count(key) != 0 || shard.demoting.count(key) != 0) continue;
    if (!hooks_.find_outside(key, ns)) unknown.push_back(key);
  }
  if (!unknown.empty()) hooks_.probe(ns, unknown);
}

PinClaims Pinner::ClaimPins(const std::shared_ptr<PinBatch>& batch, const NamespaceFingerprint& ns,
                            std::span<const BlockKey> keys, LayerSpan layers) {
  const ConnectionId connection = batch->connection;
  batch->grants.resize(keys.size());
  // Only a load or a hold (on_resolve) reads which keys waited: a plain
  // Pin does not pay for the vector.
  if (batch->on_resolve) batch->waiting.assign(keys.size(), false);
  const uint64_t now = clock_.NowUs();
  PinClaims claims;
  auto wait_for = [&batch](size_t i) {
    batch->outstanding.fetch_add(1, std::memory_order_relaxed);
    if (!batch->waiting.empty()) batch->waiting[i] = true;
  };
  auto miss = [&](size_t i, const BlockKey& key) {
    batch->grants[i].status = NotFound("block " + key.ToHex() + " is not cached");
    Bump(counters_.pin_misses);
  };
  for (size_t i = 0; i < keys.size(); ++i) {
    const BlockKey& key = keys[i];
    BlockIndex& shard = ShardFor(key);
    MutexLock lock(shard.mu);
    auto it = shard.index.find(key);
    if (it != shard.index.end() && it->second.cached() && it->second.ns == ns) {
      if (layers.whole()) {
        batch->grants[i] = PinLocked(shard, connection, key, now, batch->with_layers);
        continue;
      }
      const uint32_t layer_count = hooks_.layer_count(ns, it->second.size);
      if (Status s = CheckSpan(layers, layer_count, key); !s.ok()) {
        batch->grants[i].status = s;
        continue;
      }
      const uint64_t layer_bytes = it->second.size / layer_count;
      PinGrant grant = PinLocked(shard, connection, key, now);
      grant.offset += layers.first * layer_bytes;
      grant.length = (layers.last - layers.first) * layer_bytes;
      grant.block_offset = it->second.extent.offset;  // `checksum` stays the whole block's
      grant.block_length = it->second.size;
      grant.layer_checksums = LayerChecksumsOf(it->second, layer_count, layers.first, layers.last);
      batch->grants[i] = grant;
      continue;
    }
    if (it == shard.index.end()) {
      auto demoting = shard.demoting.find(key);
      if (demoting != shard.demoting.end() && demoting->second.ns == ns) {
        // Evicted a moment ago and not yet readable below: try again once
        // its write ends (it does, with success or an error).
        wait_for(i);
        demoting->second.waiters.push_back([this, batch, i, key, ns, layers] { RetryPin(batch, i, key, ns, layers); });
        continue;
      }
    }
    if (!layers.whole()) {
      // Not in the host tier (or still being promoted): read just the
      // layers from below, which keeps its copy while a promotion runs.
      std::optional<Located> below = hooks_.find_outside(key, ns);
      if (!below) {
        miss(i, key);
        continue;
      }
      if (Status s = CheckSpan(layers, below->info.layer_count, key); !s.ok()) {
        batch->grants[i].status = s;
        continue;
      }
      wait_for(i);
      claims.read_layers.push_back(PinClaim{i, key, *below});
      continue;
    }
    if (it != shard.index.end() && it->second.state() == BlockState::kPromoting && it->second.ns == ns) {
      // A prefetch still reading when its block is asked for came late;
      // the block is in use now, no longer held against the prefetch budget.
      if (shard.EndPrefetched(it->second)) {
        hooks_.note_prefetch_use();
        Bump(counters_.prefetches_late);
      }
      wait_for(i);
      shard.promotion_waiters[key].push_back(PromotionWaiter{batch, i});
      continue;
    }
    std::optional<Located> below;
    if (it == shard.index.end()) below = hooks_.find_outside(key, ns);
    if (!below) {
      miss(i, key);
      continue;
    }
    // Claim the key: later pins wait for this promotion, writers see it taken.
    shard.BeginPromotion(key, ns, below->info.payload_bytes, /*prefetched=*/false);
    wait_for(i);
    shard.promotion_waiters[key].push_back(PromotionWaiter{batch, i});
    claims.promote.push_back(PinClaim{i, key, *below});
  }
  return claims;
}

std::vector<Status> Pinner::Release(ConnectionId connection, std::span<const LeaseId> leases) {
  std::vector<Status> out(leases.size());
  const uint64_t now = clock_.NowUs();
  for (size_t i = 0; i < leases.size(); ++i) {
    const LeaseId lease = leases[i];
    const size_t shard_index = LeaseShard(lease);
    Bump(counters_.releases);
    if (shard_index >= shards_.size()) {
      out[i] = NotFound("lease " + std::to_string(lease) + " is not held (unknown or already released)");
      Bump(counters_.release_failures);
      continue;
    }
    BlockIndex& shard = *shards_[shard_index];
    MutexLock lock(shard.mu);
    Result<LeaseRecord> record = shard.leases.Take(connection, lease);
    if (!record.ok()) {
      out[i] = record.status();
      Bump(counters_.release_failures);
      continue;
    }
    promoter_.EndTransient(shard.Unpin(*record, now));
  }
  return out;
}

void Pinner::EndConnection(ConnectionId connection) {
  const uint64_t now = clock_.NowUs();
  for (const auto& shard_ptr : shards_) {
    BlockIndex& shard = *shard_ptr;
    MutexLock lock(shard.mu);
    shard.DropReservations(connection);
    for (const LeaseRecord& record : shard.leases.TakeAll(connection)) promoter_.EndTransient(shard.Unpin(record, now));
  }
}

size_t Pinner::RecordUses(const NamespaceFingerprint& ns, std::span<const BlockKey> keys) {
  const uint64_t now = clock_.NowUs();
  size_t counted = 0;
  for (const BlockKey& key : keys) {
    BlockIndex& shard = ShardFor(key);
    MutexLock lock(shard.mu);
    auto it = shard.index.find(key);
    if (it == shard.index.end() || !it->second.cached() || it->second.ns != ns) continue;
    it->second.hits++;
    if (shard.EndPrefetched(it->second)) {
      hooks_.note_prefetch_use();
      Bump(counters_.prefetches_on_time);
    }
    it->second.last_use_us = now;
    shard.policy->OnAccess(it->second.handle, now);
    ++counted;
  }
  Bump(counters_.directory_uses, static_cast<int64_t>(counted));
  Bump(counters_.directory_stale_uses, static_cast<int64_t>(keys.size() - counted));
  hooks_.uses_noted();
  return counted;
}

}  // namespace kvtier

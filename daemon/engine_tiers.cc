// Engine data movement between the tiers: promotion (and layer reads)
// from a tier below into the host arena, eviction from the host tier and
// demotion to the tiers below, including blocks a lower tier evicts.
#include <algorithm>
#include <chrono>
#include <limits>

#include "common/check.h"
#include "daemon/engine.h"
#include "daemon/engine_shard.h"

namespace kvtier {
namespace {

// An allocation gives up after this many evictions without finding room
// (guards against pathological churn; each eviction frees real space).
constexpr int kMaxEvictionsPerAllocation = 1 << 16;
// How long an eviction waits for a tier below to take its block when the
// tier is momentarily out of staging memory or free regions (Busy): a burst
// of writes then slows the writer instead of dropping blocks.
constexpr auto kDemotionBusyWait = std::chrono::milliseconds(200);

// True on a thread running a tier completion (it completes the very I/O
// that would free tier resources, so it must never wait for them).
thread_local bool t_in_tier_callback = false;

struct TierCallbackScope {
  TierCallbackScope() : was(t_in_tier_callback) { t_in_tier_callback = true; }
  ~TierCallbackScope() { t_in_tier_callback = was; }
  bool was;
};

}  // namespace

void Engine::ReadLayers(const std::shared_ptr<PinBatch>& batch, size_t index, const BlockKey& key,
                        const Located& from, LayerSpan layers) {
  IoStarted();
  const uint64_t bytes = (layers.last - layers.first) * (from.info.payload_bytes / from.info.layer_count);
  auto finish = [this, batch, index, key, bytes](Status status, HostTier::Extent extent) {
    PinGrant grant;
    if (status.ok()) {
      // The transient extent lives as an invisible (zombie) entry held by
      // one lease: the last Release, or the connection's end, frees it.
      const size_t shard_index = ShardIndex(key);
      EngineShard& shard = *shards_[shard_index];
      std::lock_guard lock(shard.mu);
      BlockEntry entry;
      entry.extent = extent;
      entry.size = bytes;
      entry.allocated = true;
      entry.transient = true;
      entry.pins = 1;
      entry.handle = next_handle_.fetch_add(1, std::memory_order_relaxed);
      const LeaseId lease = (next_lease_.fetch_add(1, std::memory_order_relaxed) << kLeaseShardBits) | shard_index;
      shard.leases.emplace(lease, LeaseRecord{batch->connection, key, entry.handle});
      shard.connections[batch->connection].leases.insert(lease);
      shard.zombies.emplace(entry.handle, std::move(entry));
      grant = PinGrant{Status::Ok(), extent.offset, bytes, lease, 0};
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
  Result<HostTier::Extent> extent = AllocateWithEviction(bytes);
  if (!extent.ok()) return finish(extent.status(), {});
  Status started = below_[from.level]->tier->Read(key, layers.first, layers.last, host_.Bytes(*extent).first(bytes),
                               [finish, extent = *extent, bytes](Result<size_t> r) {
                                 TierCallbackScope scope;
                                 if (r.ok() && *r != bytes) return finish(IoError("short layer read"), extent);
                                 finish(r.ok() ? Status::Ok() : r.status(), extent);
                               });
  if (!started.ok()) finish(started, *extent);
}

void Engine::Promote(const BlockKey& key, const Located& from) {
  IoStarted();
  const uint64_t checksum = from.info.payload_checksum;
  Result<HostTier::Extent> extent = AllocateWithEviction(from.info.payload_bytes);
  if (!extent.ok()) return FinishPromotion(key, extent.status(), {}, checksum);
  const uint64_t issued_us = clock_.NowUs();
  Below& below = *below_[from.level];
  Status started = below.tier->Read(key, 0, from.info.layer_count, host_.Bytes(*extent),
                                    [this, &below, key, extent = *extent, checksum, issued_us](Result<size_t> r) {
                                      TierCallbackScope scope;
                                      if (r.ok()) {
                                        std::lock_guard lock(bandwidth_mu_);
                                        below.read_bandwidth.Observe(*r, clock_.NowUs() - issued_us);
                                      }
                                      FinishPromotion(key, r.status(), extent, checksum);
                                    });
  if (!started.ok()) {
    host_.Free(*extent);
    FinishPromotion(key, started, {}, checksum);
  }
}

void Engine::FinishPromotion(const BlockKey& key, Status status, HostTier::Extent extent, uint64_t checksum) {
  const size_t shard_index = ShardIndex(key);
  EngineShard& shard = *shards_[shard_index];
  const uint64_t now = clock_.NowUs();
  std::vector<PromotionWaiter> waiters;
  std::vector<PinGrant> grants;
  bool prefetched = false;
  {
    std::lock_guard lock(shard.mu);
    auto node = shard.promotion_waiters.extract(key);
    if (!node.empty()) waiters = std::move(node.mapped());
    auto it = shard.index.find(key);
    KVTIER_CHECK(it != shard.index.end() && it->second.promoting, "promotion lost its entry");
    BlockEntry& entry = it->second;
    prefetched = entry.prefetched;
    if (status.ok() && entry.erased) {
      status = NotFound("block " + key.ToHex() + " was erased during its promotion");
    }
    if (status.ok()) {
      entry.promoting = false;
      entry.extent = extent;
      entry.allocated = true;
      entry.committed = true;
      entry.checksum = checksum;
      entry.handle = next_handle_.fetch_add(1, std::memory_order_relaxed);
      entry.last_use_us = now;
      shard.committed.emplace(entry.handle, key);
      shard.policy->OnInsertKeyed(entry.handle, key, now);
      shard.stored_bytes += entry.size;
      Publish(host_, key, entry);
      for (const auto& w : waiters) grants.push_back(PinLocked(shard, shard_index, w.batch->connection, key, now));
      Bump(counters_.promotions);
    } else {
      EndPrefetched(shard, entry);
      shard.index.erase(it);
      if (extent.length != 0) host_.Free(extent);
      Status miss = status.code() == StatusCode::kNoSpace
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
  const bool last_prefetch = prefetched && prefetch_reads_.fetch_sub(1, std::memory_order_acq_rel) == 1;
  if (last_prefetch && status.ok()) Prefetch();
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

Result<HostTier::Extent> Engine::AllocateWithEviction(uint64_t bytes) {
  const uint64_t evict_at_most = kEvictionBytesFactor * ArenaAllocator::ClassSize(bytes);
  uint64_t evicted_bytes = 0;
  int victims = 0;
  for (int attempt = 0; attempt < kMaxEvictionsPerAllocation; ++attempt) {
    Result<HostTier::Extent> extent = host_.Allocate(bytes);
    if (extent.ok() || extent.status().code() != StatusCode::kNoSpace) return extent;
    if (victims >= kMinVictimsPerAllocation && evicted_bytes >= evict_at_most) {
      Bump(counters_.eviction_bound_hits);
      return NoSpace(extent.status().message() + "; " + std::to_string(victims) + " blocks (" +
                     std::to_string(evicted_bytes) +
                     " bytes) were evicted without freeing a range that fits (the arena is fragmented): "
                     "giving up rather than flushing the host tier");
    }
    uint64_t freed = 0;
    if (!EvictOne(&freed)) {
      Bump(counters_.eviction_failures);
      return NoSpace(extent.status().message() +
                     "; nothing is evictable: every cached block is pinned or being written");
    }
    if (freed > 0) {  // 0: raced with a use, nothing evicted; look again
      ++victims;
      evicted_bytes += freed;
    }
  }
  Bump(counters_.eviction_failures);
  return NoSpace("no room for " + std::to_string(bytes) + " bytes after " +
                 std::to_string(kMaxEvictionsPerAllocation) + " evictions");
}

TierAdmission::Facts Engine::GatherFacts(const BlockKey& key, uint64_t uses) {
  TierAdmission::Facts facts;
  facts.uses = uses;
  if (std::optional<Lineage::Info> info = lineage_.Find(key)) {
    if (info->conversation != 0) facts.conversation = lineage_.ConversationState(info->conversation);
    if (info->parent) facts.parent_held = HeldAnywhere(*info->parent);
  }
  return facts;
}

bool Engine::EvictOne(uint64_t* evicted_bytes) {
  // Find the shard whose policy ranks its victim lowest, one lock at a time.
  size_t best = shards_.size();
  uint64_t best_rank = std::numeric_limits<uint64_t>::max();
  BlockHandle best_handle = 0;
  BlockKey best_key{};
  for (size_t i = 0; i < shards_.size(); ++i) {
    std::lock_guard lock(shards_[i]->mu);
    auto candidate = shards_[i]->policy->Victim();
    if (candidate && (best == shards_.size() || candidate->rank < best_rank)) {
      best = i;
      best_rank = candidate->rank;
      best_handle = candidate->handle;
      best_key = shards_[i]->committed.at(candidate->handle);
    }
  }
  if (best == shards_.size()) return false;
  // What admission weighs, gathered with no shard lock held: the parent may
  // live in another shard. Uses are filled in under the lock.
  TierAdmission::Facts facts;
  if (!below_.empty()) facts = GatherFacts(best_key, 0);
  EngineShard& shard = *shards_[best];
  std::unique_lock lock(shard.mu);
  auto candidate = shard.policy->Victim();
  if (!candidate || candidate->handle != best_handle) return true;  // raced with a pin or a use; the caller retries
  auto key = shard.committed.find(candidate->handle);
  KVTIER_CHECK(key != shard.committed.end(), "policy names an unknown block");
  auto it = shard.index.find(key->second);
  KVTIER_CHECK(it != shard.index.end() && it->second.pins == 0, "victim is pinned or missing");
  facts.uses = it->second.hits;
  Bump(counters_.evictions);
  if (evicted_bytes != nullptr) *evicted_bytes = it->second.extent.length;
  const bool needed = shard.policy->NeededWithin(candidate->handle, clock_.NowUs(), lookahead_us_);
  if (needed) Bump(counters_.needed_evictions);
  // The first tier below that takes it. A block some tier below already
  // holds (promoted from there) costs no write. A block a queued request
  // needs soon goes to the first tier whatever its admission says (its
  // bytes are still charged); any other goes through each tier's admission
  // in turn, and one that none takes is dropped.
  std::optional<size_t> target;
  bool held_below = false;
  for (size_t level = 0; level < below_.size() && !target && !held_below; ++level) {
    Below& b = *below_[level];
    if (b.tier->Find(it->first)) {
      held_below = true;
    } else if (needed && level == 0 && b.admission->Force(it->second.size)) {
      Bump(counters_.forced_demotions);
      target = level;
    } else if (b.admission->Admit(it->second.size, facts)) {
      target = level;
    }
  }
  if (!target) {
    if (!below_.empty() && !held_below) Bump(counters_.admission_drops);
    RemoveCommitted(shard, host_, it);
    return true;
  }
  // Take it out of the index but keep its bytes until the tier has copied
  // them (Demote copies before it returns), outside the shard lock.
  const BlockKey victim = it->first;
  const NamespaceFingerprint ns = it->second.ns;
  const HostTier::Extent extent = it->second.extent;
  const uint64_t size = it->second.size;
  const uint64_t checksum = it->second.checksum;
  EndPrefetched(shard, it->second);
  Withdraw(host_, victim, it->second);
  shard.policy->OnRemove(it->second.handle);
  shard.committed.erase(it->second.handle);
  shard.stored_bytes -= size;
  shard.index.erase(it);
  EngineShard::Demoting& demoting = shard.demoting[victim];
  demoting.ns = ns;
  demoting.level = *target;
  lock.unlock();
  Demote(*target, ns, victim, extent, size, checksum);
  host_.Free(extent);
  return true;
}

bool Engine::HeldAnywhere(const BlockKey& key) {
  {
    EngineShard& shard = ShardFor(key);
    std::lock_guard lock(shard.mu);
    if (shard.index.count(key) > 0 || shard.demoting.count(key) > 0) return true;
  }
  for (const auto& b : below_) {
    if (b->tier->Find(key)) return true;
  }
  return false;
}

void Engine::Demote(size_t level, const NamespaceFingerprint& ns, const BlockKey& key, HostTier::Extent extent,
                    uint64_t size, uint64_t checksum) {
  // A whole block keeps its layer split; any other size is one layer.
  const uint32_t layers = LayoutOf(ns, size).layer_count;
  BlockTier& tier = *below_[level]->tier;
  IoStarted();
  auto written_done = [this, key](Status written) {
    TierCallbackScope scope;
    if (written.ok()) {
      Bump(counters_.demotions);
    } else {
      Bump(counters_.demotion_failures);
    }
    {
      std::lock_guard lock(io_mu_);
      ++demotions_finished_;
    }
    demotion_finished_.notify_all();
    FinishDemotion(key);
    IoFinished();
  };
  const auto deadline = std::chrono::steady_clock::now() + kDemotionBusyWait;
  Status accepted;
  for (;;) {
    uint64_t finished_before;
    {
      std::lock_guard lock(io_mu_);
      finished_before = demotions_finished_;
    }
    accepted = tier.Write(ns, key, layers, host_.Bytes(extent).first(size), written_done, checksum);
    if (accepted.code() != StatusCode::kBusy || t_in_tier_callback) break;
    // Out of staging memory or writable regions: both come back when a
    // write in flight finishes, or when the tier's own background work
    // (a region read out to the tier below) ends, which it does not
    // signal: look again every millisecond.
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) break;
    std::unique_lock lock(io_mu_);
    demotion_finished_.wait_until(lock, std::min(deadline, now + std::chrono::milliseconds(1)),
                                  [&] { return demotions_finished_ != finished_before; });
    Bump(counters_.demotion_waits);
  }
  if (!accepted.ok()) {
    // AlreadyExists: the copy from an earlier demotion is still there.
    if (accepted.code() != StatusCode::kAlreadyExists) Bump(counters_.demotion_rejections);
    if (accepted.code() == StatusCode::kCorruption) Bump(counters_.demotion_corrupt);
    FinishDemotion(key);
    IoFinished();
  }
}

void Engine::DemoteBelow(size_t from, const BlockTier::Evicted& block, std::span<const std::byte> payload) {
  const TierAdmission::Facts facts = GatherFacts(block.key, block.hits);
  for (size_t level = from + 1; level < below_.size(); ++level) {
    Below& b = *below_[level];
    if (b.tier->Find(block.key)) return;  // already there: nothing to write
    if (!b.admission->Admit(payload.size(), facts)) continue;
    IoStarted();
    Status accepted = b.tier->Write(block.ns, block.key, block.layer_count, payload,
                                    [this, &b](Status written) {
                                      Bump(written.ok() ? b.demotions_in : counters_.demotion_failures);
                                      IoFinished();
                                    },
                                    block.payload_checksum);
    if (!accepted.ok()) {
      if (accepted.code() != StatusCode::kAlreadyExists) Bump(counters_.demotion_rejections);
      IoFinished();
    }
    return;
  }
  Bump(below_[from]->demotion_drops);
}

void Engine::FinishDemotion(const BlockKey& key) {
  EngineShard& shard = ShardFor(key);
  std::vector<std::function<void()>> waiters;
  {
    std::lock_guard lock(shard.mu);
    auto node = shard.demoting.extract(key);
    if (!node.empty()) waiters = std::move(node.mapped().waiters);
  }
  for (auto& retry : waiters) retry();
}

}  // namespace kvtier

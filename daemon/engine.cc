#include "daemon/engine.h"

#include <chrono>
#include <future>
#include <limits>
#include <optional>

#include "common/checksum.h"
#include "common/check.h"
#include "common/logging.h"
#include "daemon/engine_shard.h"
#include "daemon/nvme_admission.h"
#include "tiers/nvme/nvme_tier.h"

namespace kvtier {
namespace {

// An allocation gives up after this many evictions without finding room
// (guards against pathological churn; each eviction frees real space).
constexpr int kMaxEvictionsPerAllocation = 1 << 16;
// Lease ids carry their shard in the low bits, so Release locks one shard.
constexpr int kLeaseShardBits = 8;
// How long an eviction waits for the NVMe tier to take its block when the
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

void Bump(std::atomic<int64_t>& counter, int64_t by = 1) {
  counter.fetch_add(by, std::memory_order_relaxed);
}

// Removes `key`'s reservation by `session` from `shard`, freeing its space.
// Caller holds shard.mu. Returns false if there was no such reservation.
bool DropReservation(EngineShard& shard, HostTier& host, SessionId session, const BlockKey& key) {
  auto it = shard.index.find(key);
  if (it == shard.index.end() || it->second.committed || it->second.writer != session) return false;
  if (it->second.allocated) host.Free(it->second.extent);
  shard.index.erase(it);
  auto s = shard.sessions.find(session);
  if (s != shard.sessions.end()) s->second.reserved.erase(key);
  return true;
}

// Drops one pin of the block a lease refers to, freeing a zombie when its
// last pin goes. Caller holds shard.mu and has removed the lease record.
void Unpin(EngineShard& shard, HostTier& host, const LeaseRecord& lease, uint64_t now_us) {
  auto it = shard.index.find(lease.key);
  if (it != shard.index.end() && it->second.committed && it->second.handle == lease.handle) {
    KVTIER_CHECK(it->second.pins > 0, "unpin of an unpinned block");
    if (--it->second.pins == 0) shard.policy->OnUnpin(lease.handle, now_us);
    return;
  }
  auto z = shard.zombies.find(lease.handle);
  KVTIER_CHECK(z != shard.zombies.end(), "lease refers to no block");
  KVTIER_CHECK(z->second.pins > 0, "unpin of an unpinned zombie");
  if (--z->second.pins == 0) {
    host.Free(z->second.extent);
    shard.zombies.erase(z);
  }
}

// Makes the just-committed `entry` of `key` visible to clients' directory
// reads (when the host tier has a directory). Caller holds the shard lock.
void Publish(HostTier& host, const BlockKey& key, BlockEntry& entry) {
  HostDirectory* dir = host.directory();
  if (dir != nullptr) entry.published = dir->Publish(entry.ns, key, entry.extent.offset, entry.size, entry.checksum);
}

// Takes the committed `entry` of `key` out of the directory. Must run before
// its extent is freed or can be reused (the directory's extent-safety rule).
// Caller holds the shard lock.
void Withdraw(HostTier& host, const BlockKey& key, BlockEntry& entry) {
  HostDirectory* dir = host.directory();
  if (dir == nullptr) return;
  if (entry.published) {
    dir->Withdraw(key);
  } else {
    dir->ForgetUnpublished();
  }
  entry.published = false;
}

// A prefetched block was used or leaves: its bytes stop counting against
// the prefetch budget. Returns whether it was prefetched. Caller holds
// shard.mu.
bool EndPrefetched(EngineShard& shard, BlockEntry& entry) {
  if (!entry.prefetched) return false;
  entry.prefetched = false;
  shard.prefetched_bytes -= entry.size;
  return true;
}

// Removes the committed block `key` (evicted or erased); a pinned one
// becomes a zombie. Caller holds shard.mu.
void RemoveCommitted(EngineShard& shard, HostTier& host,
                     std::unordered_map<BlockKey, BlockEntry>::iterator it) {
  BlockEntry& entry = it->second;
  EndPrefetched(shard, entry);
  Withdraw(host, it->first, entry);
  shard.policy->OnRemove(entry.handle);
  shard.committed.erase(entry.handle);
  shard.stored_bytes -= entry.size;
  if (entry.pins > 0) {
    shard.zombies.emplace(entry.handle, std::move(entry));
  } else {
    host.Free(entry.extent);
  }
  shard.index.erase(it);
}

}  // namespace

Engine::Engine(const EngineOptions& options, HostTier& host, const Clock& clock, NvmeTier* nvme)
    : host_(host),
      clock_(clock),
      nvme_(nvme),
      lookahead_us_(options.lookahead_us),
      prefetch_share_(options.prefetch_share),
      prefetch_min_blocks_(options.prefetch_min_blocks) {
  for (uint32_t i = 0; i < options.shards; ++i) {
    shards_.push_back(std::make_unique<EngineShard>(MakeEvictionPolicy(options.eviction)));
  }
  if (host_.directory() != nullptr) host_.directory()->SetLowerTiers(nvme_ != nullptr);
}

Engine::~Engine() {
  if (nvme_ != nullptr) nvme_->SetNeededHint(nullptr);
  WaitForIdle();
}

Result<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options, HostTier& host,
                                               const Clock& clock, NvmeTier* nvme) {
  if (options.shards < 1 || options.shards > (1u << kLeaseShardBits)) {
    return InvalidArgument("engine.shards must be in [1, 256], got " + std::to_string(options.shards));
  }
  if (MakeEvictionPolicy(options.eviction) == nullptr) {
    return InvalidArgument("unknown eviction policy '" + options.eviction + "' (lru, fifo, queue_aware)");
  }
  std::unique_ptr<NvmeAdmission> admission;
  if (nvme != nullptr) {
    auto made = NvmeAdmission::Create(options.nvme_admission, options.dwpd, *nvme, clock);
    if (!made.ok()) return made.status();
    admission = std::move(made).value();
  }
  std::unique_ptr<Engine> engine(new Engine(options, host, clock, nvme));
  engine->admission_ = std::move(admission);
  if (nvme != nullptr) {
    // The tier asks from under its own lock; QueuedKeys' lock is a leaf.
    nvme->SetNeededHint([queued = &engine->queued_keys_](const BlockKey& key) { return queued->Contains(key); });
  }
  return engine;
}

void Engine::RegisterNamespace(const NamespaceFingerprint& ns, const NamespaceLayout& layout) {
  std::lock_guard lock(namespaces_mu_);
  namespaces_[ns] = layout;
}

size_t Engine::ShardIndex(const BlockKey& key) const { return std::hash<BlockKey>{}(key) % shards_.size(); }

EngineShard& Engine::ShardFor(const BlockKey& key) { return *shards_[ShardIndex(key)]; }

void Engine::IoStarted() {
  std::lock_guard lock(io_mu_);
  ++io_in_flight_;
}

void Engine::IoFinished() {
  std::lock_guard lock(io_mu_);
  if (--io_in_flight_ == 0) io_idle_.notify_all();
}

void Engine::WaitForIdle() {
  std::unique_lock lock(io_mu_);
  io_idle_.wait(lock, [this] { return io_in_flight_ == 0; });
}

LookupOutcome Engine::Lookup(const NamespaceFingerprint& ns, std::span<const BlockKey> keys) {
  LookupOutcome out;
  out.tiers.reserve(keys.size());
  for (const BlockKey& key : keys) {
    EngineShard& shard = ShardFor(key);
    std::lock_guard lock(shard.mu);
    auto it = shard.index.find(key);
    if (it != shard.index.end() && it->second.committed && it->second.ns == ns) {
      out.tiers.push_back(Tier::kHost);
      continue;
    }
    std::optional<NvmeTier::BlockInfo> on_nvme = nvme_ != nullptr ? nvme_->Find(key) : std::nullopt;
    if (!on_nvme || on_nvme->ns != ns) {
      // Being demoted: on NVMe as soon as its write ends.
      auto demoting = shard.demoting.find(key);
      if (demoting == shard.demoting.end() || demoting->second.ns != ns) break;
    }
    out.tiers.push_back(Tier::kNvme);
    Bump(counters_.nvme_lookup_hits);
  }
  out.prefix_blocks = out.tiers.size();
  Bump(counters_.lookups);
  Bump(counters_.lookup_keys, static_cast<int64_t>(keys.size()));
  Bump(counters_.lookup_hit_blocks, static_cast<int64_t>(out.prefix_blocks));
  return out;
}

std::vector<SlotGrant> Engine::Reserve(SessionId session, const NamespaceFingerprint& ns,
                                       std::span<const BlockKey> keys,
                                       std::span<const uint64_t> sizes) {
  KVTIER_CHECK(keys.size() == sizes.size(), "Reserve: keys and sizes differ in length");
  std::vector<SlotGrant> grants(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    const BlockKey& key = keys[i];
    SlotGrant& grant = grants[i];
    Bump(counters_.reserves);
    if (!host_.CanEverHold(sizes[i])) {
      grant.status = InvalidArgument("block size " + std::to_string(sizes[i]) +
                                     " can never fit the host tier (" +
                                     std::to_string(host_.capacity_bytes()) +
                                     "-byte arena, sizes rounded up to their class)");
      Bump(counters_.reserve_failures);
      continue;
    }
    EngineShard& shard = ShardFor(key);
    {
      // Claim the key first so that a concurrent writer sees it as taken.
      std::lock_guard lock(shard.mu);
      auto [it, inserted] = shard.index.try_emplace(key);
      if (!inserted) {
        grant.status = AlreadyExists(it->second.committed ? "block " + key.ToHex() + " is cached"
                                                          : "block " + key.ToHex() + " is being written");
        continue;
      }
      it->second.ns = ns;
      it->second.size = sizes[i];
      it->second.writer = session;
      shard.sessions[session].reserved.insert(key);
    }
    Result<HostTier::Extent> extent = AllocateWithEviction(sizes[i]);
    std::lock_guard lock(shard.mu);
    auto it = shard.index.find(key);
    KVTIER_CHECK(it != shard.index.end() && it->second.writer == session, "reservation vanished");
    if (!extent.ok()) {
      shard.index.erase(it);
      shard.sessions[session].reserved.erase(key);
      grant.status = extent.status();
      Bump(counters_.reserve_failures);
      continue;
    }
    it->second.extent = *extent;
    it->second.allocated = true;
    grant.offset = extent->offset;
    grant.length = sizes[i];
  }
  return grants;
}

std::vector<Status> Engine::Commit(SessionId session, const NamespaceFingerprint& ns,
                                   std::span<const BlockKey> keys, std::span<const uint64_t> sizes) {
  KVTIER_CHECK(keys.size() == sizes.size(), "Commit: keys and sizes differ in length");
  std::vector<Status> out(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    const BlockKey& key = keys[i];
    EngineShard& shard = ShardFor(key);
    HostTier::Extent extent;
    uint64_t size = 0;
    {
      std::lock_guard lock(shard.mu);
      auto it = shard.index.find(key);
      if (it == shard.index.end() || it->second.committed || it->second.writer != session ||
          it->second.ns != ns) {
        out[i] = FailedPrecondition("Commit without Reserve: block " + key.ToHex() +
                                    " is not reserved by this connection");
        Bump(counters_.commit_failures);
        continue;
      }
      if (sizes[i] != it->second.size) {
        out[i] = InvalidArgument("size mismatch for block " + key.ToHex() + ": reserved " +
                                 std::to_string(it->second.size) + " bytes, committed " +
                                 std::to_string(sizes[i]) + "; the reservation is dropped");
        DropReservation(shard, host_, session, key);
        Bump(counters_.commit_failures);
        continue;
      }
      extent = it->second.extent;
      size = it->second.size;
    }
    // Hash outside the lock: only this session may touch its reservation.
    const uint64_t checksum = BlockChecksum(host_.Bytes(extent).first(size));
    const uint64_t now = clock_.NowUs();
    std::lock_guard lock(shard.mu);
    auto it = shard.index.find(key);
    KVTIER_CHECK(it != shard.index.end() && it->second.writer == session, "reservation vanished");
    BlockEntry& entry = it->second;
    entry.checksum = checksum;
    entry.committed = true;
    entry.writer = 0;
    entry.handle = next_handle_.fetch_add(1, std::memory_order_relaxed);
    entry.last_use_us = now;
    shard.committed.emplace(entry.handle, key);
    shard.policy->OnInsertKeyed(entry.handle, key, now);
    shard.stored_bytes += entry.size;
    shard.sessions[session].reserved.erase(key);
    Publish(host_, key, entry);
    Bump(counters_.commits);
  }
  return out;
}

size_t Engine::Abort(SessionId session, std::span<const BlockKey> keys) {
  size_t aborted = 0;
  for (const BlockKey& key : keys) {
    EngineShard& shard = ShardFor(key);
    std::lock_guard lock(shard.mu);
    if (DropReservation(shard, host_, session, key)) ++aborted;
  }
  Bump(counters_.aborts, static_cast<int64_t>(aborted));
  return aborted;
}

PinGrant Engine::PinLocked(EngineShard& shard, size_t shard_index, SessionId session, const BlockKey& key,
                           uint64_t now_us) {
  BlockEntry& entry = shard.index.at(key);
  if (entry.pins++ == 0) shard.policy->OnPin(entry.handle);
  entry.hits++;
  if (EndPrefetched(shard, entry)) prefetch_budget_freed_.store(true, std::memory_order_relaxed);
  entry.last_use_us = now_us;
  const LeaseId lease = (next_lease_.fetch_add(1, std::memory_order_relaxed) << kLeaseShardBits) | shard_index;
  shard.leases.emplace(lease, LeaseRecord{session, key, entry.handle});
  shard.sessions[session].leases.insert(lease);
  Bump(counters_.pins);
  return PinGrant{Status::Ok(), entry.extent.offset, entry.size, lease, entry.checksum};
}

namespace {

// Resolves one key of a batch; the last one to resolve completes it.
void Resolve(const std::shared_ptr<PinBatch>& batch, size_t index, PinGrant grant) {
  batch->grants[index] = std::move(grant);
  if (batch->outstanding.fetch_sub(1, std::memory_order_acq_rel) == 1) batch->done(std::move(batch->grants));
}

}  // namespace

NamespaceLayout Engine::LayoutOf(const NamespaceFingerprint& ns, uint64_t size) {
  std::lock_guard lock(namespaces_mu_);
  auto it = namespaces_.find(ns);
  if (it != namespaces_.end() && it->second.block_bytes == size && it->second.layer_count > 0) return it->second;
  return NamespaceLayout{1, size};
}

namespace {

// Checks `layers` against a block of `layer_count` layers.
Status CheckSpan(LayerSpan layers, uint32_t layer_count, const BlockKey& key) {
  if (layers.first < layers.last && layers.last <= layer_count) return Status::Ok();
  return InvalidArgument("layer range [" + std::to_string(layers.first) + ", " + std::to_string(layers.last) +
                         ") is not within the " + std::to_string(layer_count) + " layers of block " + key.ToHex());
}

}  // namespace

void Engine::PinAsync(SessionId session, const NamespaceFingerprint& ns, std::vector<BlockKey> keys, PinDone done,
                      LayerSpan layers) {
  auto batch = std::make_shared<PinBatch>();
  batch->session = session;
  batch->grants.resize(keys.size());
  batch->done = std::move(done);
  const uint64_t now = clock_.NowUs();
  struct ToPromote {
    size_t index;
    BlockKey key;
    NvmeTier::BlockInfo info;
  };
  std::vector<ToPromote> promote, read_layers;
  for (size_t i = 0; i < keys.size(); ++i) {
    const BlockKey& key = keys[i];
    const size_t shard_index = ShardIndex(key);
    EngineShard& shard = *shards_[shard_index];
    std::lock_guard lock(shard.mu);
    auto it = shard.index.find(key);
    if (it != shard.index.end() && it->second.committed && it->second.ns == ns) {
      if (layers.whole()) {
        batch->grants[i] = PinLocked(shard, shard_index, session, key, now);
        continue;
      }
      const NamespaceLayout layout = LayoutOf(ns, it->second.size);
      if (Status s = CheckSpan(layers, layout.layer_count, key); !s.ok()) {
        batch->grants[i].status = s;
        continue;
      }
      const uint64_t layer_bytes = it->second.size / layout.layer_count;
      PinGrant grant = PinLocked(shard, shard_index, session, key, now);
      grant.offset += layers.first * layer_bytes;
      grant.length = (layers.last - layers.first) * layer_bytes;
      grant.checksum = 0;
      batch->grants[i] = grant;
      continue;
    }
    if (it == shard.index.end()) {
      auto demoting = shard.demoting.find(key);
      if (demoting != shard.demoting.end() && demoting->second.ns == ns) {
        // Evicted a moment ago and not yet readable on NVMe: try again
        // once its write ends (it does, with success or an error).
        batch->outstanding.fetch_add(1, std::memory_order_relaxed);
        demoting->second.waiters.push_back([this, batch, i, key, ns, layers] { RetryPin(batch, i, key, ns, layers); });
        continue;
      }
    }
    if (!layers.whole()) {
      // Not in the host tier (or still being promoted): read just the
      // layers from NVMe, which keeps its copy while a promotion runs.
      std::optional<NvmeTier::BlockInfo> on_nvme = nvme_ != nullptr ? nvme_->Find(key) : std::nullopt;
      if (!on_nvme || on_nvme->ns != ns) {
        batch->grants[i].status = NotFound("block " + key.ToHex() + " is not cached");
        Bump(counters_.pin_misses);
        continue;
      }
      if (Status s = CheckSpan(layers, on_nvme->layer_count, key); !s.ok()) {
        batch->grants[i].status = s;
        continue;
      }
      batch->outstanding.fetch_add(1, std::memory_order_relaxed);
      read_layers.push_back(ToPromote{i, key, *on_nvme});
      continue;
    }
    if (it != shard.index.end() && it->second.promoting && it->second.ns == ns) {
      batch->outstanding.fetch_add(1, std::memory_order_relaxed);
      shard.promotion_waiters[key].push_back(PromotionWaiter{batch, i});
      continue;
    }
    std::optional<NvmeTier::BlockInfo> on_nvme;
    if (it == shard.index.end() && nvme_ != nullptr) on_nvme = nvme_->Find(key);
    if (!on_nvme || on_nvme->ns != ns) {
      batch->grants[i].status = NotFound("block " + key.ToHex() + " is not cached");
      Bump(counters_.pin_misses);
      continue;
    }
    // Claim the key: later pins wait for this promotion, writers see it taken.
    BlockEntry& entry = shard.index[key];
    entry.ns = ns;
    entry.size = on_nvme->payload_bytes;
    entry.promoting = true;
    batch->outstanding.fetch_add(1, std::memory_order_relaxed);
    shard.promotion_waiters[key].push_back(PromotionWaiter{batch, i});
    promote.push_back(ToPromote{i, key, *on_nvme});
  }
  for (const auto& p : promote) {
    Promote(p.key, p.info.payload_bytes, p.info.layer_count, p.info.payload_checksum);
  }
  for (const auto& r : read_layers) {
    ReadLayers(batch, r.index, r.key, r.info.payload_bytes, r.info.layer_count, layers);
  }
  if (batch->outstanding.fetch_sub(1, std::memory_order_acq_rel) == 1) batch->done(std::move(batch->grants));
  // A prefetched block was used: the budget it held may go to the next
  // queued requests.
  if (prefetch_budget_freed_.exchange(false, std::memory_order_relaxed)) Prefetch();
}

std::vector<PinGrant> Engine::Pin(SessionId session, const NamespaceFingerprint& ns,
                                  std::span<const BlockKey> keys, LayerSpan layers) {
  std::promise<std::vector<PinGrant>> promise;
  auto future = promise.get_future();
  PinAsync(session, ns, std::vector<BlockKey>(keys.begin(), keys.end()),
           [&promise](std::vector<PinGrant> grants) { promise.set_value(std::move(grants)); }, layers);
  return future.get();
}

void Engine::RetryPin(const std::shared_ptr<PinBatch>& batch, size_t index, const BlockKey& key,
                      const NamespaceFingerprint& ns, LayerSpan layers) {
  PinAsync(batch->session, ns, {key},
           [batch, index](std::vector<PinGrant> grants) { Resolve(batch, index, std::move(grants[0])); }, layers);
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

void Engine::ReadLayers(const std::shared_ptr<PinBatch>& batch, size_t index, const BlockKey& key,
                        uint64_t payload_bytes, uint32_t layer_count, LayerSpan layers) {
  IoStarted();
  const uint64_t bytes = (layers.last - layers.first) * (payload_bytes / layer_count);
  auto finish = [this, batch, index, key, bytes](Status status, HostTier::Extent extent) {
    PinGrant grant;
    if (status.ok()) {
      // The transient extent lives as an invisible (zombie) entry held by
      // one lease: the last Release, or the session's end, frees it.
      const size_t shard_index = ShardIndex(key);
      EngineShard& shard = *shards_[shard_index];
      std::lock_guard lock(shard.mu);
      BlockEntry entry;
      entry.extent = extent;
      entry.size = bytes;
      entry.allocated = true;
      entry.pins = 1;
      entry.handle = next_handle_.fetch_add(1, std::memory_order_relaxed);
      const LeaseId lease = (next_lease_.fetch_add(1, std::memory_order_relaxed) << kLeaseShardBits) | shard_index;
      shard.leases.emplace(lease, LeaseRecord{batch->session, key, entry.handle});
      shard.sessions[batch->session].leases.insert(lease);
      shard.zombies.emplace(entry.handle, std::move(entry));
      grant = PinGrant{Status::Ok(), extent.offset, bytes, lease, 0};
      Bump(counters_.pins);
      Bump(counters_.layer_reads);
    } else {
      if (extent.length != 0) host_.Free(extent);
      grant.status = status.code() == StatusCode::kNoSpace
                         ? status
                         : NotFound("layers of block " + key.ToHex() + " could not be read from the nvme tier (" +
                                    status.ToString() + ")");
      Bump(counters_.pin_misses);
    }
    Resolve(batch, index, std::move(grant));
    IoFinished();
  };
  Result<HostTier::Extent> extent = AllocateWithEviction(bytes);
  if (!extent.ok()) return finish(extent.status(), {});
  Status started = nvme_->Read(key, layers.first, layers.last, host_.Bytes(*extent).first(bytes),
                               [finish, extent = *extent, bytes](Result<size_t> r) {
                                 TierCallbackScope scope;
                                 if (r.ok() && *r != bytes) return finish(IoError("short layer read"), extent);
                                 finish(r.ok() ? Status::Ok() : r.status(), extent);
                               });
  if (!started.ok()) finish(started, *extent);
}

void Engine::Promote(const BlockKey& key, uint64_t payload_bytes, uint32_t layer_count, uint64_t checksum) {
  IoStarted();
  Result<HostTier::Extent> extent = AllocateWithEviction(payload_bytes);
  if (!extent.ok()) return FinishPromotion(key, extent.status(), {}, checksum);
  const uint64_t issued_us = clock_.NowUs();
  Status started = nvme_->Read(key, 0, layer_count, host_.Bytes(*extent),
                               [this, key, extent = *extent, checksum, issued_us](Result<size_t> r) {
                                 TierCallbackScope scope;
                                 if (r.ok()) {
                                   std::lock_guard lock(bandwidth_mu_);
                                   nvme_read_bandwidth_.Observe(*r, clock_.NowUs() - issued_us);
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
      for (const auto& w : waiters) grants.push_back(PinLocked(shard, shard_index, w.batch->session, key, now));
      Bump(counters_.promotions);
    } else {
      EndPrefetched(shard, entry);
      shard.index.erase(it);
      if (extent.length != 0) host_.Free(extent);
      Status miss = status.code() == StatusCode::kNoSpace
                        ? status
                        : NotFound("block " + key.ToHex() + " could not be read from the nvme tier (" +
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

std::vector<Status> Engine::Release(SessionId session, std::span<const LeaseId> leases) {
  std::vector<Status> out(leases.size());
  const uint64_t now = clock_.NowUs();
  for (size_t i = 0; i < leases.size(); ++i) {
    const LeaseId lease = leases[i];
    const size_t shard_index = lease & ((1u << kLeaseShardBits) - 1);
    Bump(counters_.releases);
    if (shard_index >= shards_.size()) {
      out[i] = NotFound("lease " + std::to_string(lease) + " is not held (unknown or already released)");
      Bump(counters_.release_failures);
      continue;
    }
    EngineShard& shard = *shards_[shard_index];
    std::lock_guard lock(shard.mu);
    auto it = shard.leases.find(lease);
    if (it == shard.leases.end()) {
      out[i] = NotFound("lease " + std::to_string(lease) + " is not held (unknown or already released)");
      Bump(counters_.release_failures);
      continue;
    }
    if (it->second.session != session) {
      out[i] = PermissionDenied("lease " + std::to_string(lease) + " belongs to another connection");
      Bump(counters_.release_failures);
      continue;
    }
    LeaseRecord record = it->second;
    shard.leases.erase(it);
    shard.sessions[session].leases.erase(lease);
    Unpin(shard, host_, record, now);
  }
  return out;
}

size_t Engine::RecordUses(const NamespaceFingerprint& ns, std::span<const BlockKey> keys) {
  const uint64_t now = clock_.NowUs();
  size_t counted = 0;
  for (const BlockKey& key : keys) {
    EngineShard& shard = ShardFor(key);
    std::lock_guard lock(shard.mu);
    auto it = shard.index.find(key);
    if (it == shard.index.end() || !it->second.committed || it->second.ns != ns) continue;
    it->second.hits++;
    if (EndPrefetched(shard, it->second)) prefetch_budget_freed_.store(true, std::memory_order_relaxed);
    it->second.last_use_us = now;
    shard.policy->OnAccess(it->second.handle, now);
    ++counted;
  }
  Bump(counters_.directory_uses, static_cast<int64_t>(counted));
  Bump(counters_.directory_stale_uses, static_cast<int64_t>(keys.size() - counted));
  if (prefetch_budget_freed_.exchange(false, std::memory_order_relaxed)) Prefetch();
  return counted;
}

void Engine::RecordLocalLookups(int64_t lookups, int64_t keys, int64_t hit_blocks) {
  Bump(counters_.lookups, lookups);
  Bump(counters_.local_lookups, lookups);
  Bump(counters_.lookup_keys, keys);
  Bump(counters_.lookup_hit_blocks, hit_blocks);
}

void Engine::RecordBadUsageReport() { Bump(counters_.bad_usage_reports); }

size_t Engine::Erase(const NamespaceFingerprint& ns, std::span<const BlockKey> keys) {
  size_t erased = 0;
  for (const BlockKey& key : keys) {
    EngineShard& shard = ShardFor(key);
    std::lock_guard lock(shard.mu);
    auto it = shard.index.find(key);
    bool found = false;
    if (it != shard.index.end() && it->second.committed && it->second.ns == ns) {
      RemoveCommitted(shard, host_, it);
      found = true;
    }
    if (nvme_ != nullptr) {
      auto on_nvme = nvme_->Find(key);
      if (on_nvme && on_nvme->ns == ns && nvme_->Erase(key).ok()) found = true;
    }
    if (found) ++erased;
  }
  Bump(counters_.erases, static_cast<int64_t>(erased));
  return erased;
}

void Engine::CloseSession(SessionId session) {
  DropQueuedRequests(session);
  const uint64_t now = clock_.NowUs();
  for (auto& shard_ptr : shards_) {
    EngineShard& shard = *shard_ptr;
    std::lock_guard lock(shard.mu);
    auto node = shard.sessions.extract(session);
    if (node.empty()) continue;
    for (const BlockKey& key : node.mapped().reserved) {
      auto it = shard.index.find(key);
      if (it == shard.index.end() || it->second.committed || it->second.writer != session) continue;
      if (it->second.allocated) host_.Free(it->second.extent);
      shard.index.erase(it);
    }
    for (LeaseId lease : node.mapped().leases) {
      auto it = shard.leases.find(lease);
      if (it == shard.leases.end()) continue;
      LeaseRecord record = it->second;
      shard.leases.erase(it);
      Unpin(shard, host_, record, now);
    }
  }
  Bump(counters_.sessions_closed);
}

Result<HostTier::Extent> Engine::AllocateWithEviction(uint64_t bytes) {
  for (int attempt = 0; attempt < kMaxEvictionsPerAllocation; ++attempt) {
    Result<HostTier::Extent> extent = host_.Allocate(bytes);
    if (extent.ok() || extent.status().code() != StatusCode::kNoSpace) return extent;
    if (!EvictOne()) {
      Bump(counters_.eviction_failures);
      return NoSpace(extent.status().message() +
                     "; nothing is evictable: every cached block is pinned or being written");
    }
  }
  Bump(counters_.eviction_failures);
  return NoSpace("no room for " + std::to_string(bytes) + " bytes after " +
                 std::to_string(kMaxEvictionsPerAllocation) + " evictions");
}

bool Engine::EvictOne() {
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
  // live in another shard.
  NvmeAdmission::Facts facts;
  if (nvme_ != nullptr) {
    if (std::optional<Lineage::Info> info = lineage_.Find(best_key)) {
      if (info->conversation != 0) facts.conversation = lineage_.ConversationState(info->conversation);
      if (info->parent) facts.parent_held = HeldAnywhere(*info->parent);
    }
  }
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
  const bool needed = shard.policy->NeededWithin(candidate->handle, clock_.NowUs(), lookahead_us_);
  if (needed) Bump(counters_.needed_evictions);
  if (nvme_ == nullptr) {
    RemoveCommitted(shard, host_, it);
    return true;
  }
  // A block the tier already holds (promoted earlier) costs no write. A
  // block a queued request needs soon is demoted whatever admission says
  // (its bytes are still charged); any other goes through admission, and a
  // refused one is dropped.
  if (!nvme_->Find(it->first)) {
    if (needed) {
      Bump(counters_.forced_demotions);
      admission_->Force(it->second.size);
    } else if (!admission_->Admit(it->second.size, facts)) {
      Bump(counters_.admission_drops);
      RemoveCommitted(shard, host_, it);
      return true;
    }
  }
  // Take it out of the index but keep its bytes until the NVMe tier has
  // copied them (Demote copies before it returns), outside the shard lock.
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
  shard.demoting[victim].ns = ns;
  lock.unlock();
  Demote(ns, victim, extent, size, checksum);
  host_.Free(extent);
  return true;
}

bool Engine::HeldAnywhere(const BlockKey& key) {
  {
    EngineShard& shard = ShardFor(key);
    std::lock_guard lock(shard.mu);
    if (shard.index.count(key) > 0 || shard.demoting.count(key) > 0) return true;
  }
  return nvme_ != nullptr && nvme_->Find(key).has_value();
}

void Engine::Demote(const NamespaceFingerprint& ns, const BlockKey& key, HostTier::Extent extent, uint64_t size,
                    uint64_t checksum) {
  NamespaceLayout layout;
  {
    std::lock_guard lock(namespaces_mu_);
    auto it = namespaces_.find(ns);
    if (it != namespaces_.end()) layout = it->second;
  }
  // A whole block keeps its layer split; any other size is one layer.
  const uint32_t layers = size == layout.block_bytes && layout.layer_count > 0 ? layout.layer_count : 1;
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
    accepted = nvme_->Write(ns, key, layers, host_.Bytes(extent).first(size), written_done, checksum);
    if (accepted.code() != StatusCode::kBusy || t_in_tier_callback) break;
    // Out of staging memory or writable regions: both come back when a
    // write in flight finishes.
    std::unique_lock lock(io_mu_);
    if (!demotion_finished_.wait_until(lock, deadline, [&] { return demotions_finished_ != finished_before; })) break;
    Bump(counters_.demotion_waits);
  }
  if (!accepted.ok()) {
    // AlreadyExists: the NVMe copy from an earlier demotion is still there.
    if (accepted.code() != StatusCode::kAlreadyExists) Bump(counters_.demotion_rejections);
    FinishDemotion(key);
    IoFinished();
  }
}

void Engine::VisitCounters(CounterVisitor& v) const {
  int64_t blocks = 0, pinned = 0, reserved = 0, zombies = 0, leases = 0, stored = 0;
  for (const auto& shard_ptr : shards_) {
    std::lock_guard lock(shard_ptr->mu);
    blocks += static_cast<int64_t>(shard_ptr->committed.size());
    zombies += static_cast<int64_t>(shard_ptr->zombies.size());
    leases += static_cast<int64_t>(shard_ptr->leases.size());
    stored += static_cast<int64_t>(shard_ptr->stored_bytes);
    for (const auto& [key, entry] : shard_ptr->index) {
      if (!entry.committed) ++reserved;
      else if (entry.pins > 0) ++pinned;
    }
  }
  v.Visit("engine.blocks", blocks);
  v.Visit("engine.stored_bytes", stored);
  v.Visit("engine.pinned_blocks", pinned);
  v.Visit("engine.reserved_blocks", reserved);
  v.Visit("engine.zombie_blocks", zombies);
  v.Visit("engine.leases", leases);
  const auto load = [](const std::atomic<int64_t>& c) { return c.load(std::memory_order_relaxed); };
  v.Visit("engine.lookups", load(counters_.lookups));
  v.Visit("engine.lookup_keys", load(counters_.lookup_keys));
  v.Visit("engine.lookup_hit_blocks", load(counters_.lookup_hit_blocks));
  v.Visit("engine.reserves", load(counters_.reserves));
  v.Visit("engine.reserve_failures", load(counters_.reserve_failures));
  v.Visit("engine.commits", load(counters_.commits));
  v.Visit("engine.commit_failures", load(counters_.commit_failures));
  v.Visit("engine.aborts", load(counters_.aborts));
  v.Visit("engine.pins", load(counters_.pins));
  v.Visit("engine.pin_misses", load(counters_.pin_misses));
  v.Visit("engine.releases", load(counters_.releases));
  v.Visit("engine.release_failures", load(counters_.release_failures));
  v.Visit("engine.erases", load(counters_.erases));
  v.Visit("engine.evictions", load(counters_.evictions));
  v.Visit("engine.eviction_failures", load(counters_.eviction_failures));
  v.Visit("engine.sessions_closed", load(counters_.sessions_closed));
  v.Visit("engine.promotions", load(counters_.promotions));
  v.Visit("engine.promotion_failures", load(counters_.promotion_failures));
  v.Visit("engine.demotions", load(counters_.demotions));
  v.Visit("engine.demotion_rejections", load(counters_.demotion_rejections));
  v.Visit("engine.demotion_failures", load(counters_.demotion_failures));
  v.Visit("engine.admission_drops", load(counters_.admission_drops));
  v.Visit("engine.enqueues", load(counters_.enqueues));
  v.Visit("engine.dequeues", load(counters_.dequeues));
  v.Visit("engine.needed_evictions", load(counters_.needed_evictions));
  v.Visit("engine.forced_demotions", load(counters_.forced_demotions));
  v.Visit("engine.prefetch_plans", load(counters_.prefetch_plans));
  v.Visit("engine.prefetches", load(counters_.prefetches));
  v.Visit("engine.prefetch_bytes", load(counters_.prefetch_bytes));
  v.Visit("engine.prefetch_skipped_short", load(counters_.prefetch_skipped_short));
  {
    std::lock_guard lock(bandwidth_mu_);
    v.Visit("engine.nvme_read_bytes_per_s", static_cast<int64_t>(nvme_read_bandwidth_.bytes_per_s()));
  }
  v.Visit("engine.nvme_lookup_hits", load(counters_.nvme_lookup_hits));
  v.Visit("engine.layer_reads", load(counters_.layer_reads));
  v.Visit("engine.demotion_waits", load(counters_.demotion_waits));
  v.Visit("engine.directory_uses", load(counters_.directory_uses));
  v.Visit("engine.directory_stale_uses", load(counters_.directory_stale_uses));
  v.Visit("engine.local_lookups", load(counters_.local_lookups));
  v.Visit("engine.bad_usage_reports", load(counters_.bad_usage_reports));
  host_.VisitCounters(v);
  if (nvme_ != nullptr) nvme_->VisitCounters(v);
  if (admission_ != nullptr) admission_->VisitCounters(v);
}

}  // namespace kvtier

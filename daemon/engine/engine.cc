#include "daemon/engine/engine.h"

#include <chrono>
#include <future>
#include <limits>
#include <optional>
#include <random>

#include "common/checksum.h"
#include "common/check.h"
#include "common/logging.h"
#include "daemon/engine/engine_shard.h"
#include "daemon/engine/host_block_tier.h"

namespace kvtier {
namespace {

// Jobs either mover may hold queued at once.
constexpr size_t kMoverJobs = 1 << 16;

}  // namespace

Engine::Engine(const EngineOptions& options, HostTier& host, const Clock& clock)
    : host_(host),
      clock_(clock),
      lookahead_us_(options.lookahead_us),
      layer_read_pool_bytes_(static_cast<uint64_t>(options.layer_read_share * double(host.capacity_bytes()))),
      max_queued_requests_per_connection_(options.max_queued_requests_per_connection),
      max_queued_keys_per_connection_(options.max_queued_keys_per_connection),
      prefetch_share_(options.prefetch_share),
      prefetch_min_blocks_(options.prefetch_min_blocks),
      verify_commits_(options.verify_commits),
      demoter_(std::make_unique<Mover>("engine.demoter", 1, options.demotion_buffer_bytes, kMoverJobs)),
      reader_(std::make_unique<Mover>("engine.reader", 1, 0, kMoverJobs)),
      host_block_tier_(std::make_unique<HostBlockTier>(*this)),
      host_io_(std::make_unique<Mover>("engine.host_io", 1, 0, kMoverJobs)) {
  // A random start below 2^55 (never 0, and 2^55 grants before the shift
  // overflows): lease numbers do not repeat across daemon starts.
  std::random_device entropy;
  const uint64_t first_lease = ((uint64_t{entropy()} << 32 | entropy()) & ((uint64_t{1} << 55) - 1)) | 1;
  for (uint32_t i = 0; i < options.shards; ++i) {
    shards_.push_back(
        std::make_unique<EngineShard>(shards_.size(), first_lease, MakeEvictionPolicy(options.eviction)));
  }
}

Engine::~Engine() {
  for (auto& below : below_) {
    if (ReclaimHooks* hooks = below->tier->reclaim_hooks()) {
      hooks->SetNeededHint(nullptr);
      hooks->SetEvictionSink(nullptr);
    }
  }
  // A tier thread may be inside the sink right now: wait for it, and make
  // any later call a no-op.
  {
    std::unique_lock lock(sink_gate_->mu);
    sink_gate_->engine = nullptr;
  }
  WaitForIdle();
}

Result<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options, HostTier& host, const Clock& clock,
                                               BlockTier* below) {
  std::vector<LowerTier> stack;
  if (below != nullptr) stack.push_back(LowerTier{below, options.admission, options.dwpd});
  return Create(options, host, clock, std::move(stack));
}

Result<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options, HostTier& host,
                                               const Clock& clock, std::vector<LowerTier> below,
                                               BlockTier* above) {
  if (options.shards < 1 || options.shards > (1u << kLeaseShardBits)) {
    return InvalidArgument("engine.shards must be in [1, 256], got " + std::to_string(options.shards));
  }
  if (MakeEvictionPolicy(options.eviction) == nullptr) {
    return InvalidArgument("unknown eviction policy '" + options.eviction + "' (lru, fifo, lru2, s3fifo, arc, queue_aware)");
  }
  std::unique_ptr<Engine> engine(new Engine(options, host, clock));
  for (const LowerTier& lower : below) {
    if (lower.tier == nullptr) return InvalidArgument("a tier of the stack is missing");
    auto made = TierAdmission::Create(lower.admission, lower.dwpd, lower.rate_bytes_per_second, *lower.tier, clock);
    if (!made.ok()) {
      return InvalidArgument(std::string(lower.tier->name()) + " admission: " + made.status().message());
    }
    auto level = std::make_unique<Below>();
    level->measured = std::make_unique<MeasuredTier>(*lower.tier);
    level->tier = level->measured.get();
    level->admission = std::move(made).value();
    if (level->tier->prober() != nullptr) engine->probing_ = true;
    engine->below_.push_back(std::move(level));
  }
  if (host.directory() != nullptr) host.directory()->SetLowerTiers(!below.empty() || above != nullptr);
  for (size_t level = 0; level < engine->below_.size(); ++level) {
    ReclaimHooks* tier = engine->below_[level]->tier->reclaim_hooks();
    if (tier == nullptr) continue;  // the tier does not reclaim on its own
    // The tier asks from under its own lock; QueuedKeys' lock is a leaf.
    tier->SetNeededHint([queued = &engine->queued_keys_](const BlockKey& key) { return queued->Contains(key); });
    if (level + 1 < engine->below_.size()) {
      tier->SetEvictionSink([gate = engine->sink_gate_, level](const BlockTier::Evicted& block,
                                                              std::span<const std::byte> payload) {
        std::shared_lock lock(gate->mu);
        if (gate->engine != nullptr) gate->engine->DemoteBelow(level, block, payload);
      });
    }
  }
  if (above != nullptr) {
    engine->above_ = std::make_unique<Above>();
    engine->above_->source.measured = std::make_unique<MeasuredTier>(*above);
    engine->above_->source.tier = engine->above_->source.measured.get();
    engine->above_io_ = std::make_unique<Mover>("engine.above_io", 1, 0, kMoverJobs);
  }
  engine->sink_gate_->engine = engine.get();
  return engine;
}

void Engine::RegisterNamespace(const NamespaceFingerprint& ns, const NamespaceLayout& layout) {
  std::lock_guard lock(namespaces_mu_);
  namespaces_[ns] = layout;
  kept_namespaces_.insert(ns);
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

std::optional<Engine::Located> Engine::FindBelow(const BlockKey& key, const NamespaceFingerprint& ns) const {
  for (size_t level = 0; level < below_.size(); ++level) {
    std::optional<BlockTier::BlockInfo> info = below_[level]->tier->Find(key);
    if (info && info->ns == ns) return Located{level, *info};
  }
  return std::nullopt;
}

std::optional<Engine::Located> Engine::FindOutside(const BlockKey& key, const NamespaceFingerprint& ns) const {
  if (above_ != nullptr) {
    std::optional<BlockTier::BlockInfo> info = above_->source.tier->Find(key);
    if (info && info->ns == ns) return Located{kAboveLevel, *info};
  }
  return FindBelow(key, ns);
}

Engine::Below& Engine::SourceAt(size_t level) {
  return level == kAboveLevel ? above_->source : *below_[level];
}

BlockTier& Engine::host_tier() { return *host_block_tier_; }

void Engine::WaitForIdle() {
  std::unique_lock lock(io_mu_);
  io_idle_.wait(lock, [this] { return io_in_flight_ == 0; });
}

LookupOutcome Engine::Lookup(const NamespaceFingerprint& ns, std::span<const BlockKey> keys) {
  LookupCursor cursor;
  LookupSome(ns, keys, cursor, keys.size());
  return std::move(cursor.out);
}

void Engine::LookupSome(const NamespaceFingerprint& ns, std::span<const BlockKey> keys, LookupCursor& cursor,
                        size_t max_keys) {
  if (cursor.done) return;
  LookupOutcome& out = cursor.out;
  if (cursor.next == 0) out.tiers.reserve(keys.size());
  // Where `key` is, from what the tiers know now (no I/O).
  auto place = [&](const BlockKey& key) -> std::optional<Tier> {
    if (above_ != nullptr) {
      std::optional<BlockTier::BlockInfo> info = above_->source.tier->Find(key);
      if (info && info->ns == ns) {
        Bump(above_->source.lookup_hits);
        return above_->source.tier->kind();
      }
    }
    EngineShard& shard = ShardFor(key);
    std::lock_guard lock(shard.mu);
    auto it = shard.index.find(key);
    if (it != shard.index.end() && it->second.cached() && it->second.ns == ns) {
      Bump(counters_.host_lookup_hits);
      return Tier::kHost;
    }
    std::optional<Located> below = FindBelow(key, ns);
    if (!below) {
      // Being demoted: in that tier as soon as its write ends.
      auto demoting = shard.demoting.find(key);
      if (demoting == shard.demoting.end() || demoting->second.ns != ns) return std::nullopt;
      below = Located{demoting->second.level, {}};
    }
    Bump(below_[below->level]->lookup_hits);
    return below_[below->level]->tier->kind();
  };
  max_keys = std::max<size_t>(max_keys, 1);
  const size_t end = keys.size() - cursor.next > max_keys ? cursor.next + max_keys : keys.size();
  bool missed = false;
  for (; cursor.next < end; ++cursor.next) {
    const size_t i = cursor.next;
    std::optional<Tier> tier = place(keys[i]);
    if (!tier && !cursor.probed && !below_.empty()) {
      // The rest of the chain is not known here: tiers that others write
      // too (the remote tier) learn about it now, with no lock held, in
      // one round trip for all of it.
      cursor.probed = true;
      for (const auto& b : below_) {
        if (Prober* prober = b->tier->prober()) prober->Probe(ns, keys.subspan(i));
      }
      tier = place(keys[i]);
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

std::vector<SlotGrant> Engine::Reserve(ConnectionId connection, const NamespaceFingerprint& ns,
                                       std::span<const BlockKey> keys,
                                       std::span<const uint64_t> sizes, const ReserveChain& links) {
  KVTIER_CHECK(keys.size() == sizes.size(), "Reserve: keys and sizes differ in length");
  if (links.chain) {
    lineage_.RecordLinks(keys, links.parent);
    Bump(counters_.chain_links, static_cast<int64_t>(keys.size()));
  }
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
        grant.status = AlreadyExists("block " + key.ToHex() + " is " +
                                     (it->second.cached() ? "cached" : it->second.promoting() ? "being read in"
                                                                                              : "being written"));
        continue;
      }
      it->second.ns = ns;
      it->second.size = sizes[i];
      it->second.writer = connection;
      shard.reserved[connection].insert(key);
    }
    Result<HostTier::Extent> extent = AllocateWithEviction(sizes[i]);
    std::lock_guard lock(shard.mu);
    auto it = shard.index.find(key);
    KVTIER_CHECK(it != shard.index.end() && it->second.writer == connection, "reservation vanished");
    if (!extent.ok()) {
      shard.index.erase(it);
      EndReservation(shard, connection, key);
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

namespace {

// How many layer checksums a Commit carries for a block of `layers` layers
// (none for a block of one layer: its checksum is the block's).
size_t SentLayers(uint32_t layers) { return layers > 1 ? layers : 0; }

}  // namespace

std::vector<Status> Engine::Commit(ConnectionId connection, const NamespaceFingerprint& ns,
                                   std::span<const BlockKey> keys, std::span<const uint64_t> sizes,
                                   std::span<const uint64_t> checksums, std::span<const uint64_t> layer_checksums) {
  KVTIER_CHECK(keys.size() == sizes.size(), "Commit: keys and sizes differ in length");
  KVTIER_CHECK(checksums.empty() || checksums.size() == keys.size(), "Commit: keys and checksums differ in length");
  // The layer split of each block, and whether the client sent every
  // layer checksum (anything else is ignored: the engine hashes them).
  std::vector<uint32_t> layer_counts(keys.size());
  size_t expected_layers = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    layer_counts[i] = LayoutOf(ns, sizes[i]).layer_count;
    expected_layers += SentLayers(layer_counts[i]);
  }
  const bool layers_sent = !layer_checksums.empty() && layer_checksums.size() == expected_layers;
  size_t next_sent = 0;  // index into layer_checksums of keys[i]'s first
  std::vector<Status> out(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    const BlockKey& key = keys[i];
    const uint32_t layers = layer_counts[i];
    const std::span<const uint64_t> sent_layers =
        layers_sent ? layer_checksums.subspan(next_sent, SentLayers(layers)) : std::span<const uint64_t>();
    next_sent += SentLayers(layers);
    EngineShard& shard = ShardFor(key);
    HostTier::Extent extent;
    uint64_t size = 0;
    {
      std::lock_guard lock(shard.mu);
      auto it = shard.index.find(key);
      if (it == shard.index.end() || it->second.state != BlockState::kReserved || it->second.writer != connection ||
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
        DropReservation(shard, host_, connection, key);
        Bump(counters_.commit_failures);
        continue;
      }
      extent = it->second.extent;
      size = it->second.size;
    }
    // Hash outside the lock: only this connection may touch its reservation.
    const std::span<const std::byte> bytes = host_.Bytes(extent).first(size);
    const bool hash = checksums.empty() || verify_commits_;
    // Layer checksums as sent (never hashed here unless verify_commits
    // checks them: a block without them costs nothing more).
    std::vector<uint64_t> layer_sums(sent_layers.begin(), sent_layers.end());
    uint64_t checksum = hash ? 0 : checksums[i];
    bool layers_differ = false;
    if (hash && verify_commits_ && !sent_layers.empty()) {
      std::vector<uint64_t> hashed(layers);
      checksum = ChecksumWithLayers(bytes, hashed);  // one pass for both
      layers_differ = hashed != layer_sums;
    } else if (hash) {
      checksum = BlockChecksum(bytes);
    }
    const bool whole_differs = hash && !checksums.empty() && checksum != checksums[i];
    const uint64_t now = clock_.NowUs();
    std::lock_guard lock(shard.mu);
    auto it = shard.index.find(key);
    KVTIER_CHECK(it != shard.index.end() && it->second.writer == connection, "reservation vanished");
    if (whole_differs || layers_differ) {
      out[i] = Corruption("block " + key.ToHex() + ": its bytes do not match the " +
                          (whole_differs ? "checksum" : "layer checksums") +
                          " the client sent; the reservation is dropped");
      DropReservation(shard, host_, connection, key);
      Bump(counters_.commit_failures);
      continue;
    }
    BlockEntry& entry = it->second;
    entry.checksum = checksum;
    entry.layer_checksums = std::move(layer_sums);
    entry.state = BlockState::kCommitted;
    entry.writer = 0;
    entry.handle = next_handle_.fetch_add(1, std::memory_order_relaxed);
    entry.last_use_us = now;
    shard.committed.emplace(entry.handle, key);
    shard.policy->OnInsertKeyed(entry.handle, key, now);
    shard.stored_bytes += entry.size;
    EndReservation(shard, connection, key);
    Publish(host_, key, entry);
    Bump(counters_.commits);
    Bump(counters_.host_committed_bytes, static_cast<int64_t>(entry.size));
    if (!checksums.empty()) Bump(counters_.commit_checksums_sent);
  }
  return out;
}

size_t Engine::Abort(ConnectionId connection, std::span<const BlockKey> keys) {
  size_t aborted = 0;
  for (const BlockKey& key : keys) {
    EngineShard& shard = ShardFor(key);
    std::lock_guard lock(shard.mu);
    if (DropReservation(shard, host_, connection, key)) ++aborted;
  }
  Bump(counters_.aborts, static_cast<int64_t>(aborted));
  return aborted;
}

PinGrant Engine::PinLocked(EngineShard& shard, ConnectionId connection, const BlockKey& key,
                           uint64_t now_us, bool with_layers) {
  BlockEntry& entry = shard.index.at(key);
  if (entry.pins++ == 0) {
    shard.policy->OnPin(entry.handle);
    entry.state = BlockState::kPinned;
  }
  entry.hits++;
  if (EndPrefetched(shard, entry)) {
    prefetch_budget_freed_.store(true, std::memory_order_relaxed);
    Bump(counters_.prefetches_on_time);
  }
  entry.last_use_us = now_us;
  const LeaseId lease = shard.leases.Grant(connection, key, entry.handle);
  Bump(counters_.pins);
  Bump(counters_.host_pinned_bytes, static_cast<int64_t>(entry.size));
  PinGrant grant{Status::Ok(), entry.extent.offset, entry.size, lease, entry.checksum, 0, 0, {}};
  if (with_layers) {
    const uint32_t layers = LayoutOf(entry.ns, entry.size).layer_count;
    grant.layer_checksums = LayerChecksumsOf(entry, layers, 0, layers);
  }
  return grant;
}

std::vector<uint64_t> Engine::LayerChecksumsOf(const BlockEntry& entry, uint32_t layer_count, uint32_t first,
                                               uint32_t last) {
  if (layer_count <= 1) return {entry.checksum};
  // Every committed block of several layers has them (Commit, promotion);
  // none here only for a layout registered after the block was committed.
  if (entry.layer_checksums.size() != layer_count || first >= last || last > layer_count) return {};
  return std::vector<uint64_t>(entry.layer_checksums.begin() + first, entry.layer_checksums.begin() + last);
}

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

void Engine::PinAsync(ConnectionId connection, const NamespaceFingerprint& ns, std::vector<BlockKey> keys, PinDone done,
                      LayerSpan layers) {
  auto batch = std::make_shared<PinBatch>();
  batch->connection = connection;
  batch->done = std::move(done);
  RunPins(batch, ns, keys, layers);
}

void Engine::RunPins(const std::shared_ptr<PinBatch>& batch, const NamespaceFingerprint& ns,
                     std::span<const BlockKey> keys, LayerSpan layers) {
  ProbeUnknown(ns, keys);
  PinClaims claims = ClaimPins(batch, ns, keys, layers);
  for (const auto& p : claims.promote) Promote(p.key, p.from);
  for (const auto& r : claims.read_layers) ReadLayers(batch, r.index, r.key, r.from, layers);
  if (batch->outstanding.fetch_sub(1, std::memory_order_acq_rel) == 1) batch->done(std::move(batch->grants));
  // A prefetched block was used: the budget it held may go to the next
  // queued requests.
  if (prefetch_budget_freed_.exchange(false, std::memory_order_relaxed)) SchedulePrefetch();
}

void Engine::ProbeUnknown(const NamespaceFingerprint& ns, std::span<const BlockKey> keys) {
  if (!probing_) return;
  std::vector<BlockKey> unknown;
  for (const BlockKey& key : keys) {
    EngineShard& shard = ShardFor(key);
    std::lock_guard lock(shard.mu);
    if (shard.index.count(key) != 0 || shard.demoting.count(key) != 0) continue;
    if (!FindOutside(key, ns)) unknown.push_back(key);
  }
  if (unknown.empty()) return;
  for (const auto& b : below_) {
    if (Prober* prober = b->tier->prober()) prober->Probe(ns, unknown);
  }
}

Engine::PinClaims Engine::ClaimPins(const std::shared_ptr<PinBatch>& batch, const NamespaceFingerprint& ns,
                                    std::span<const BlockKey> keys, LayerSpan layers) {
  const ConnectionId connection = batch->connection;
  batch->grants.resize(keys.size());
  // Only a load (on_resolve) reads which keys waited: a plain Pin does not
  // pay for the vector.
  if (batch->on_resolve) batch->waiting.assign(keys.size(), false);
  const uint64_t now = clock_.NowUs();
  PinClaims claims;
  auto wait_for = [&batch](size_t i) {
    batch->outstanding.fetch_add(1, std::memory_order_relaxed);
    if (!batch->waiting.empty()) batch->waiting[i] = true;
  };
  for (size_t i = 0; i < keys.size(); ++i) {
    const BlockKey& key = keys[i];
    EngineShard& shard = ShardFor(key);
    std::lock_guard lock(shard.mu);
    auto it = shard.index.find(key);
    if (it != shard.index.end() && it->second.cached() && it->second.ns == ns) {
      if (layers.whole()) {
        batch->grants[i] = PinLocked(shard, connection, key, now, batch->with_layers);
        continue;
      }
      const NamespaceLayout layout = LayoutOf(ns, it->second.size);
      if (Status s = CheckSpan(layers, layout.layer_count, key); !s.ok()) {
        batch->grants[i].status = s;
        continue;
      }
      const uint64_t layer_bytes = it->second.size / layout.layer_count;
      PinGrant grant = PinLocked(shard, connection, key, now);
      grant.offset += layers.first * layer_bytes;
      grant.length = (layers.last - layers.first) * layer_bytes;
      grant.block_offset = it->second.extent.offset;  // `checksum` stays the whole block's
      grant.block_length = it->second.size;
      grant.layer_checksums = LayerChecksumsOf(it->second, layout.layer_count, layers.first, layers.last);
      batch->grants[i] = grant;
      continue;
    }
    if (it == shard.index.end()) {
      auto demoting = shard.demoting.find(key);
      if (demoting != shard.demoting.end() && demoting->second.ns == ns) {
        // Evicted a moment ago and not yet readable on NVMe: try again
        // once its write ends (it does, with success or an error).
        wait_for(i);
        demoting->second.waiters.push_back([this, batch, i, key, ns, layers] { RetryPin(batch, i, key, ns, layers); });
        continue;
      }
    }
    if (!layers.whole()) {
      // Not in the host tier (or still being promoted): read just the
      // layers from below, which keeps its copy while a promotion runs.
      std::optional<Located> below = FindOutside(key, ns);
      if (!below) {
        batch->grants[i].status = NotFound("block " + key.ToHex() + " is not cached");
        Bump(counters_.pin_misses);
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
    if (it != shard.index.end() && it->second.state == BlockState::kPromoting && it->second.ns == ns) {
      // A prefetch still reading when its block is asked for came late;
      // the block is in use now, no longer held against the prefetch budget.
      if (EndPrefetched(shard, it->second)) {
        prefetch_budget_freed_.store(true, std::memory_order_relaxed);
        Bump(counters_.prefetches_late);
      }
      wait_for(i);
      shard.promotion_waiters[key].push_back(PromotionWaiter{batch, i});
      continue;
    }
    std::optional<Located> below;
    if (it == shard.index.end()) below = FindOutside(key, ns);
    if (!below) {
      batch->grants[i].status = NotFound("block " + key.ToHex() + " is not cached");
      Bump(counters_.pin_misses);
      continue;
    }
    // Claim the key: later pins wait for this promotion, writers see it taken.
    BlockEntry& entry = shard.index[key];
    entry.ns = ns;
    entry.size = below->info.payload_bytes;
    entry.state = BlockState::kPromoting;
    wait_for(i);
    shard.promotion_waiters[key].push_back(PromotionWaiter{batch, i});
    claims.promote.push_back(PinClaim{i, key, *below});
  }
  return claims;
}

std::vector<PinGrant> Engine::Pin(ConnectionId connection, const NamespaceFingerprint& ns,
                                  std::span<const BlockKey> keys, LayerSpan layers) {
  std::promise<std::vector<PinGrant>> promise;
  auto future = promise.get_future();
  PinAsync(connection, ns, std::vector<BlockKey>(keys.begin(), keys.end()),
           [&promise](std::vector<PinGrant> grants) { promise.set_value(std::move(grants)); }, layers);
  return future.get();
}

void Engine::RetryPin(const std::shared_ptr<PinBatch>& batch, size_t index, const BlockKey& key,
                      const NamespaceFingerprint& ns, LayerSpan layers) {
  auto retry = std::make_shared<PinBatch>();
  retry->connection = batch->connection;
  retry->with_layers = batch->with_layers;
  retry->done = [batch, index](std::vector<PinGrant> grants) { Resolve(batch, index, std::move(grants[0])); };
  RunPins(retry, ns, {&key, 1}, layers);
}

std::vector<Status> Engine::Release(ConnectionId connection, std::span<const LeaseId> leases) {
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
    EngineShard& shard = *shards_[shard_index];
    std::lock_guard lock(shard.mu);
    Result<LeaseRecord> record = shard.leases.Take(connection, lease);
    if (!record.ok()) {
      out[i] = record.status();
      Bump(counters_.release_failures);
      continue;
    }
    EndTransient(Unpin(shard, host_, *record, now));
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
    if (it == shard.index.end() || !it->second.cached() || it->second.ns != ns) continue;
    it->second.hits++;
    if (EndPrefetched(shard, it->second)) {
      prefetch_budget_freed_.store(true, std::memory_order_relaxed);
      Bump(counters_.prefetches_on_time);
    }
    it->second.last_use_us = now;
    shard.policy->OnAccess(it->second.handle, now);
    ++counted;
  }
  Bump(counters_.directory_uses, static_cast<int64_t>(counted));
  Bump(counters_.directory_stale_uses, static_cast<int64_t>(keys.size() - counted));
  if (prefetch_budget_freed_.exchange(false, std::memory_order_relaxed)) SchedulePrefetch();
  return counted;
}

void Engine::RecordLocalLookups(int64_t lookups, int64_t keys, int64_t hit_blocks) {
  Bump(counters_.lookups, lookups);
  Bump(counters_.local_lookups, lookups);
  Bump(counters_.lookup_keys, keys);
  Bump(counters_.lookup_hit_blocks, hit_blocks);
  Bump(counters_.host_lookup_hits, hit_blocks);  // the directory holds host blocks only
}

void Engine::RecordBadUsageReport() { Bump(counters_.bad_usage_reports); }

size_t Engine::Erase(const NamespaceFingerprint& ns, std::span<const BlockKey> keys) {
  EndHolds(ns, keys);  // an erased block is held no longer (engine_holds.cc)
  size_t erased = 0;
  for (const BlockKey& key : keys) {
    EngineShard& shard = ShardFor(key);
    std::lock_guard lock(shard.mu);
    auto it = shard.index.find(key);
    bool found = false;
    // A block on its way between tiers is erased in both: a promotion ends
    // as a miss, and a demotion's write in flight is cancelled by the
    // tier's Erase below.
    bool moving = false;
    if (it != shard.index.end() && it->second.ns == ns) {
      if (it->second.cached()) {
        RemoveCommitted(shard, host_, it);
        found = true;
      } else if (it->second.promoting()) {
        it->second.state = BlockState::kErasedWhilePromoting;
        moving = true;
      }
    }
    auto demoting = shard.demoting.find(key);
    if (demoting != shard.demoting.end() && demoting->second.ns == ns) {
      // A write not started yet never starts, one done is undone.
      demoting->second.state = BlockState::kErasedWhileDemoting;
      moving = true;
    }
    for (const auto& b : below_) {
      auto info = b->tier->Find(key);
      if ((moving || (info && info->ns == ns)) && b->tier->Erase(key).ok()) found = true;
    }
    if (above_ != nullptr && EraseAbove(ns, key, moving)) found = true;
    if (found || moving) ++erased;
  }
  Bump(counters_.erases, static_cast<int64_t>(erased));
  return erased;
}

void Engine::CloseConnection(ConnectionId connection) {
  DropQueuedRequests(connection);
  std::vector<uint64_t> open_loads;
  {
    std::lock_guard lock(loads_mu_);
    auto it = loads_.find(connection);
    if (it != loads_.end()) {
      for (const auto& [id, load] : it->second) open_loads.push_back(id);
    }
  }
  for (uint64_t id : open_loads) EndLoad(connection, id).IgnoreError();  // raced with its own EndLoad: gone either way
  const uint64_t now = clock_.NowUs();
  for (auto& shard_ptr : shards_) {
    EngineShard& shard = *shard_ptr;
    std::lock_guard lock(shard.mu);
    auto node = shard.reserved.extract(connection);
    if (!node.empty()) {
      for (const BlockKey& key : node.mapped()) {
        auto it = shard.index.find(key);
        if (it == shard.index.end() || it->second.state != BlockState::kReserved || it->second.writer != connection) {
          continue;
        }
        if (it->second.allocated) host_.Free(it->second.extent);
        shard.index.erase(it);
      }
    }
    for (const LeaseRecord& record : shard.leases.TakeAll(connection)) EndTransient(Unpin(shard, host_, record, now));
  }
  if (ReleaseNamespaces(connection)) ForgetUnusedNamespaces();
  Bump(counters_.connections_closed);
}


}  // namespace kvtier

#include "daemon/engine/engine.h"

#include <chrono>
#include <limits>
#include <optional>
#include <random>

#include "common/checksum.h"
#include "common/check.h"
#include "common/logging.h"
#include "daemon/engine/block_index.h"
#include "daemon/engine/host_block_tier.h"

namespace kvtier {
namespace {

// Jobs a mover, or the retry scheduler, may hold queued at once.
constexpr size_t kMoverJobs = 1 << 16;

}  // namespace

Engine::Engine(const EngineOptions& options, HostTier& host, const Clock& clock)
    : host_(host),
      clock_(clock),
      queue_(shards_, RequestQueue::Limits{kMaxQueuedRequests, options.max_queued_requests_per_connection,
                                           options.max_queued_keys_per_connection}),
      verify_commits_(options.verify_commits),
      retries_(std::make_unique<RetryScheduler>("engine.retries", clock, kMoverJobs)),
      promoter_(std::make_unique<Promoter>(
          shards_, host, clock, *retries_,
          static_cast<uint64_t>(options.layer_read_share * double(host.capacity_bytes())), counters_,
          PromoterHooks())),
      streamer_(std::make_unique<LayerStreamer>(host, clock, *retries_, *promoter_, counters_, StreamerHooks())),
      demoter_(std::make_unique<Demoter>(below_, options.demotion_buffer_bytes, counters_, DemoterHooks(), clock)),
      reader_(std::make_unique<Mover>("engine.reader", 1, 0, kMoverJobs)),
      host_block_tier_(std::make_unique<HostBlockTier>(*this)),
      host_io_(std::make_unique<Mover>("engine.host_io", 1, 0, kMoverJobs)) {
  // A random start below 2^55 (never 0, and 2^55 grants before the shift
  // overflows): lease numbers do not repeat across daemon starts.
  std::random_device entropy;
  const uint64_t first_lease = ((uint64_t{entropy()} << 32 | entropy()) & ((uint64_t{1} << 55) - 1)) | 1;
  for (uint32_t i = 0; i < options.shards; ++i) {
    shards_.push_back(
        std::make_unique<BlockIndex>(shards_.size(), first_lease, MakeEvictionPolicy(options.eviction), host_));
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
    WriterMutexLock lock(sink_gate_->mu);
    sink_gate_->engine = nullptr;
  }
  // Retries waiting for their time run now (a fake clock may never get
  // there); any they would schedule fails instead, and so do demotions
  // waiting for room. Then nothing waits.
  retries_->Stop();
  demoter_->Stop();
  WaitForIdle();
}

Result<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options, HostTier& host, const Clock& clock,
                                               BlockTier* below) {
  std::vector<LowerTier> stack;
  if (below != nullptr) stack.push_back(LowerTier{below, options.admission, options.dwpd, 0, Tier::kNvme});
  return Create(options, host, clock, std::move(stack));
}

Result<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options, HostTier& host,
                                               const Clock& clock, std::vector<LowerTier> below,
                                               BlockTier* above) {
  if (options.shards < 1 || options.shards > (1u << kLeaseShardBits)) {
    return InvalidArgument("engine.shards must be in [1, 256], got " + std::to_string(options.shards));
  }
  std::unique_ptr<Engine> engine(new Engine(options, host, clock));
  for (const LowerTier& lower : below) {
    if (lower.tier == nullptr) return InvalidArgument("a tier of the stack is missing");
    if (lower.reported != Tier::kNvme && lower.reported != Tier::kRemote) {
      return InvalidArgument(std::string(lower.tier->name()) + " is below the host: Lookup reports it as nvme or remote, not " +
                             std::string(TierName(lower.reported)));
    }
    auto made = TierAdmission::Create(lower.admission, lower.dwpd, lower.rate_bytes_per_second, *lower.tier, clock);
    if (!made.ok()) {
      return InvalidArgument(std::string(lower.tier->name()) + " admission: " + made.status().message());
    }
    auto level = std::make_unique<TierLevel>();
    level->measured = std::make_unique<MeasuredTier>(*lower.tier);
    level->tier = level->measured.get();
    level->admission = std::move(made).value();
    level->reported = lower.reported;
    if (level->tier->prober() != nullptr) engine->probing_ = true;
    engine->below_.push_back(std::move(level));
  }
  if (host.directory() != nullptr) host.directory()->SetLowerTiers(!below.empty() || above != nullptr);
  for (size_t level = 0; level < engine->below_.size(); ++level) {
    ReclaimHooks* tier = engine->below_[level]->tier->reclaim_hooks();
    if (tier == nullptr) continue;  // the tier does not reclaim on its own
    // The tier asks from under its own lock; QueuedKeys' lock is a leaf.
    tier->SetNeededHint([queue = &engine->queue_](const BlockKey& key) { return queue->Needs(key); });
    if (level + 1 < engine->below_.size()) {
      tier->SetEvictionSink([gate = engine->sink_gate_, level](const BlockTier::Evicted& block,
                                                              std::span<const std::byte> payload) {
        ReaderMutexLock lock(gate->mu);
        if (gate->engine != nullptr) gate->engine->demoter_->DemoteBelow(level, block, payload);
      });
    }
  }
  Evictor::Hooks evictor_hooks;
  evictor_hooks.release_expired_holds = [e = engine.get()] { e->ReleaseExpiredHolds(); };
  evictor_hooks.demote = [e = engine.get()](size_t level, const NamespaceFingerprint& ns, const BlockKey& key,
                                            HostTier::Extent extent, uint64_t size, uint64_t checksum) {
    e->Demote(level, ns, key, extent, size, checksum);
  };
  engine->evictor_ = std::make_unique<Evictor>(engine->shards_, host, engine->below_, engine->lineage_, clock,
                                               options.lookahead_us, engine->counters_, std::move(evictor_hooks));
  const Prefetcher::Options prefetch{engine->below_.empty() ? 0.0 : options.prefetch_share,
                                     options.prefetch_min_blocks, host.capacity_bytes()};
  engine->prefetcher_ =
      std::make_unique<Prefetcher>(prefetch, engine->queue_, engine->PrefetchStack(), clock, engine->counters_);
  if (above != nullptr) {
    engine->above_ = std::make_unique<AboveMover>(*above, *engine->host_block_tier_, clock, *engine->retries_,
                                                  kMoverJobs, engine->AboveHooks());
  }
  engine->report_ = std::make_unique<StackReport>(
      StackReport::Stack{engine->above_.get(), *engine->host_block_tier_, host, engine->below_}, engine->shards_,
      engine->counters_, engine->namespaces_, engine->ReportHooks());
  engine->corruption_ = std::make_unique<CorruptionCheck>(engine->shards_, host, clock, *engine->host_io_,
                                                          engine->counters_, engine->CorruptionHooks());
  {
    WriterMutexLock gate(engine->sink_gate_->mu);
    engine->sink_gate_->engine = engine.get();
  }
  return engine;
}

BlockIndex& Engine::ShardFor(const BlockKey& key) { return *shards_[ShardIndexOf(key, shards_.size())]; }

void Engine::IoStarted() {
  MutexLock lock(io_mu_);
  ++io_in_flight_;
}

void Engine::IoFinished() {
  MutexLock lock(io_mu_);
  if (--io_in_flight_ == 0) io_idle_.NotifyAll();
}

std::optional<Located> Engine::FindBelow(const BlockKey& key, const NamespaceFingerprint& ns) const {
  for (size_t level = 0; level < below_.size(); ++level) {
    std::optional<BlockTier::BlockInfo> info = below_[level]->tier->Find(key);
    if (info && info->ns == ns) return Located{level, *info};
  }
  return std::nullopt;
}

std::optional<Located> Engine::FindOutside(const BlockKey& key, const NamespaceFingerprint& ns) const {
  if (above_ != nullptr) {
    std::optional<BlockTier::BlockInfo> info = above_->source().tier->Find(key);
    if (info && info->ns == ns) return Located{kAboveLevel, *info};
  }
  return FindBelow(key, ns);
}

TierLevel& Engine::SourceAt(size_t level) {
  return level == kAboveLevel ? above_->source() : *below_[level];
}

BlockTier& Engine::host_tier() { return *host_block_tier_; }

void Engine::WaitForIdle() {
  MutexLock lock(io_mu_);
  while (io_in_flight_ != 0) io_idle_.Wait(io_mu_);
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
      TierLevel& above = above_->source();
      std::optional<BlockTier::BlockInfo> info = above.tier->Find(key);
      if (info && info->ns == ns) {
        Bump(above.lookup_hits);
        return above.reported;
      }
    }
    BlockIndex& shard = ShardFor(key);
    MutexLock lock(shard.mu);
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
    return below_[below->level]->reported;
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
    BlockIndex& shard = ShardFor(key);
    {
      // Claim the key first so that a concurrent writer sees it as taken.
      MutexLock lock(shard.mu);
      if (Status taken = shard.Reserve(key, ns, sizes[i], connection); !taken.ok()) {
        grant.status = std::move(taken);
        continue;
      }
    }
    Result<HostTier::Extent> extent = evictor_->Allocate(sizes[i]);
    MutexLock lock(shard.mu);
    auto it = shard.index.find(key);
    KVTIER_CHECK(it != shard.index.end() && it->second.writer == connection, "reservation vanished");
    if (!extent.ok()) {
      shard.DropReservation(connection, key);
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
    layer_counts[i] = namespaces_.LayoutOf(ns, sizes[i]).layer_count;
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
    BlockIndex& shard = ShardFor(key);
    HostTier::Extent extent;
    uint64_t size = 0;
    {
      MutexLock lock(shard.mu);
      auto it = shard.index.find(key);
      if (it == shard.index.end() || it->second.state() != BlockState::kReserved || it->second.writer != connection ||
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
        shard.DropReservation(connection, key);
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
    MutexLock lock(shard.mu);
    auto it = shard.index.find(key);
    KVTIER_CHECK(it != shard.index.end() && it->second.writer == connection, "reservation vanished");
    if (whole_differs || layers_differ) {
      out[i] = Corruption("block " + key.ToHex() + ": its bytes do not match the " +
                          (whole_differs ? "checksum" : "layer checksums") +
                          " the client sent; the reservation is dropped");
      shard.DropReservation(connection, key);
      Bump(counters_.commit_failures);
      continue;
    }
    shard.CommitReserved(it, connection, checksum, std::move(layer_sums),
                         next_handle_.fetch_add(1, std::memory_order_relaxed), now);
    const BlockEntry& entry = it->second;
    Bump(counters_.commits);
    Bump(counters_.host_committed_bytes, static_cast<int64_t>(entry.size));
    if (!checksums.empty()) Bump(counters_.commit_checksums_sent);
  }
  return out;
}

size_t Engine::Abort(ConnectionId connection, std::span<const BlockKey> keys) {
  size_t aborted = 0;
  for (const BlockKey& key : keys) {
    BlockIndex& shard = ShardFor(key);
    MutexLock lock(shard.mu);
    if (shard.DropReservation(connection, key)) ++aborted;
  }
  Bump(counters_.aborts, static_cast<int64_t>(aborted));
  return aborted;
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
    BlockIndex& shard = ShardFor(key);
    MutexLock lock(shard.mu);
    auto it = shard.index.find(key);
    bool found = false;
    // A block on its way between tiers is erased in both: a promotion ends
    // as a miss, and a demotion's write in flight is cancelled by the
    // tier's Erase below.
    bool moving = false;
    if (it != shard.index.end() && it->second.ns == ns) {
      if (it->second.cached()) {
        shard.RemoveCommitted(it);
        found = true;
      } else if (it->second.promoting()) {
        shard.EraseWhilePromoting(it);
        moving = true;
      }
    }
    auto demoting = shard.demoting.find(key);
    if (demoting != shard.demoting.end() && demoting->second.ns == ns) {
      // A write not started yet never starts, one done is undone.
      shard.EraseWhileDemoting(demoting);
      moving = true;
    }
    for (const auto& b : below_) {
      auto info = b->tier->Find(key);
      if ((moving || (info && info->ns == ns)) && b->tier->Erase(key).ok()) found = true;
    }
    if (above_ != nullptr && above_->Erase(ns, key, moving)) found = true;
    if (found || moving) ++erased;
  }
  Bump(counters_.erases, static_cast<int64_t>(erased));
  return erased;
}

void Engine::CloseConnection(ConnectionId connection) {
  queue_.DropConnection(connection);
  for (uint64_t id : loads_.Ids(connection)) EndLoad(connection, id).IgnoreError();  // raced with its own EndLoad: gone either way
  const uint64_t now = clock_.NowUs();
  for (auto& shard_ptr : shards_) {
    BlockIndex& shard = *shard_ptr;
    MutexLock lock(shard.mu);
    shard.DropReservations(connection);
    for (const LeaseRecord& record : shard.leases.TakeAll(connection)) promoter_->EndTransient(shard.Unpin(record, now));
  }
  if (namespaces_.Release(connection)) ForgetUnusedNamespaces();
  Bump(counters_.connections_closed);
}


}  // namespace kvtier

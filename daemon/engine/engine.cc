#include "daemon/engine/engine.h"

#include <optional>
#include <random>

#include "common/check.h"
#include "common/logging.h"
#include "daemon/engine/block_index.h"

namespace kvtier {
namespace {

// Jobs a mover, or the retry scheduler, may hold queued at once.
constexpr size_t kMoverJobs = 1 << 16;

}  // namespace

Engine::Engine(const EngineOptions& options, HostTier& host, const Clock& clock)
    : host_(host),
      clock_(clock),
      events_(options.events, &lineage_),
      queue_(shards_, RequestQueue::Limits{kMaxQueuedRequests, options.max_queued_requests_per_connection,
                                           options.max_queued_keys_per_connection}),
      locator_(std::make_unique<Locator>(shards_, below_, counters_, LocatorHooks())),
      writer_(
          std::make_unique<Writer>(shards_, host, lineage_, clock, options.verify_commits, counters_, WriterHooks())),
      retries_(std::make_unique<RetryScheduler>("engine.retries", clock, kMoverJobs)),
      promoter_(std::make_unique<Promoter>(
          shards_, host, clock, *retries_,
          static_cast<uint64_t>(options.layer_read_share * double(host.capacity_bytes())), counters_, PromoterHooks())),
      streamer_(std::make_unique<LayerStreamer>(host, clock, *retries_, *promoter_, counters_, StreamerHooks())),
      demoter_(std::make_unique<Demoter>(below_, options.demotion_buffer_bytes, counters_, DemoterHooks(), clock)),
      reader_(std::make_unique<Mover>("engine.reader", 1, 0, kMoverJobs)),
      host_io_(std::make_unique<Mover>("engine.host_io", 1, 0, kMoverJobs)) {
  // A random start below 2^55 (never 0, and 2^55 grants before the shift
  // overflows): lease numbers do not repeat across daemon starts.
  std::random_device entropy;
  const uint64_t first_lease = ((uint64_t{entropy()} << 32 | entropy()) & ((uint64_t{1} << 55) - 1)) | 1;
  for (uint32_t i = 0; i < options.shards; ++i) {
    shards_.push_back(std::make_unique<BlockIndex>(shards_.size(), first_lease, MakeEvictionPolicy(options.eviction),
                                                   host_, &events_, &host_quarantine_));
  }
}

Engine::~Engine() { Stop(); }

void Engine::Stop() {
  if (stopped_) return;
  stopped_ = true;
  if (adopter_ != nullptr) adopter_->Stop();  // its thread commits into the shards (null: Create failed)
  for (auto& below : below_) {
    if (ReclaimHooks* hooks = below->tier->reclaim_hooks()) {
      hooks->SetNeededHint(nullptr);
      hooks->SetEvictionSink(nullptr);
      hooks->SetDropListener(nullptr);
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

Result<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options, HostTier& host, const Clock& clock,
                                               std::vector<LowerTier> below, BlockTier* above) {
  if (options.shards < 1 || options.shards > (1u << kLeaseShardBits)) {
    return InvalidArgument("engine.shards must be in [1, 256], got " + std::to_string(options.shards));
  }
  std::unique_ptr<Engine> engine(new Engine(options, host, clock));
  for (const LowerTier& lower : below) {
    if (lower.tier == nullptr) return InvalidArgument("a tier of the stack is missing");
    if (lower.reported != Tier::kNvme && lower.reported != Tier::kRemote) {
      return InvalidArgument(std::string(lower.tier->name()) +
                             " is below the host: Lookup reports it as nvme or remote, not " +
                             std::string(TierName(lower.reported)));
    }
    auto made = TierAdmission::Create(lower.admission, lower.dwpd, lower.rate_bytes_per_second, *lower.tier, clock);
    if (!made.ok()) {
      return InvalidArgument(std::string(lower.tier->name()) + " admission: " + made.status().message());
    }
    auto level = std::make_unique<TierLevel>();
    level->measured = std::make_unique<MeasuredTier>(*lower.tier, &engine->events_, lower.reported);
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
    tier->SetDropListener(engine->events_.DropListener(engine->below_[level]->reported));
    // The tier asks from under its own lock; QueuedKeys' lock is a leaf.
    tier->SetNeededHint([queue = &engine->queue_](const BlockKey& key) { return queue->Needs(key); });
    if (level + 1 < engine->below_.size()) {
      tier->SetEvictionSink(
          [gate = engine->sink_gate_, level](const BlockTier::Evicted& block, std::span<const std::byte> payload) {
            ReaderMutexLock lock(gate->mu);
            if (gate->engine != nullptr) gate->engine->demoter_->DemoteBelow(level, block, payload);
          });
    }
  }
  Evictor::Hooks evictor_hooks;
  evictor_hooks.release_expired_holds = [e = engine.get()] { e->ReleaseExpiredHolds(); };
  // Made below, before anything allocates.
  evictor_hooks.give_back_waiting = [e = engine.get()](uint64_t bytes) { return e->adopter_->GiveBack(bytes); };
  evictor_hooks.demote = [e = engine.get()](size_t level, const NamespaceFingerprint& ns, const BlockKey& key,
                                            HostTier::Extent extent, uint64_t size,
                                            uint64_t checksum) { e->Demote(level, ns, key, extent, size, checksum); };
  engine->evictor_ = std::make_unique<Evictor>(engine->shards_, host, engine->below_, engine->lineage_, clock,
                                               options.lookahead_us, engine->counters_, std::move(evictor_hooks));
  const Prefetcher::Options prefetch{engine->below_.empty() ? 0.0 : options.prefetch_share, options.prefetch_min_blocks,
                                     host.capacity_bytes()};
  engine->prefetcher_ =
      std::make_unique<Prefetcher>(prefetch, engine->queue_, engine->PrefetchHooks(), clock, engine->counters_);
  engine->pinner_ =
      std::make_unique<Pinner>(engine->shards_, clock, *engine->promoter_, engine->counters_, engine->PinnerHooks());
  engine->host_block_tier_ = std::make_unique<HostBlockTier>(
      engine->shards_, host, clock, *engine->writer_, *engine->pinner_, *engine->host_io_, engine->HostTierHooks());
  engine->holder_ = std::make_unique<Holder>(clock, *engine->pinner_, *engine->promoter_, engine->counters_);
  if (above != nullptr) {
    engine->above_ = std::make_unique<AboveMover>(*above, *engine->host_block_tier_, clock, *engine->retries_,
                                                  kMoverJobs, engine->AboveHooks(), &engine->events_);
  }
  Eraser::Hooks erase;
  if (engine->above_ != nullptr) {
    erase.erase_above = [above = engine->above_.get()](const NamespaceFingerprint& ns, const BlockKey& key,
                                                       bool moving) { return above->Erase(ns, key, moving); };
  }
  engine->eraser_ = std::make_unique<Eraser>(engine->shards_, engine->below_, engine->counters_, std::move(erase));
  engine->loader_ = std::make_unique<Loader>(host, engine->counters_, engine->LoaderHooks());  // after above_
  engine->report_ = std::make_unique<StackReport>(
      StackReport::Stack{engine->above_.get(), *engine->host_block_tier_, host, engine->below_}, engine->shards_,
      engine->counters_, engine->namespaces_, engine->ReportHooks());
  engine->corruption_ = std::make_unique<CorruptionCheck>(engine->shards_, host, clock, *engine->host_io_,
                                                          engine->counters_, engine->CorruptionHooks());
  {
    WriterMutexLock gate(engine->sink_gate_->mu);
    engine->sink_gate_->engine = engine.get();
  }
  engine->adopter_ = std::make_unique<Adopter>(engine->shards_, host, clock, engine->AdopterHooks());
  return engine;
}

BlockIndex& Engine::ShardFor(const BlockKey& key) { return ShardOf(shards_, key); }

void Engine::IoStarted() {
  MutexLock lock(io_mu_);
  ++io_in_flight_;
}

void Engine::IoFinished() {
  MutexLock lock(io_mu_);
  if (--io_in_flight_ == 0) io_idle_.NotifyAll();
}

std::optional<Located> Engine::FindBelow(const BlockKey& key, const NamespaceFingerprint& ns) const {
  return ::kvtier::FindBelow(below_, key, ns);
}

std::optional<Located> Engine::FindOutside(const BlockKey& key, const NamespaceFingerprint& ns) const {
  if (above_ != nullptr) {
    std::optional<BlockTier::BlockInfo> info = above_->source().tier->Find(key);
    if (info && info->ns == ns) return Located{kAboveLevel, *info};
  }
  return FindBelow(key, ns);
}

TierLevel& Engine::SourceAt(size_t level) { return level == kAboveLevel ? above_->source() : *below_[level]; }

BlockTier& Engine::host_tier() { return *host_block_tier_; }

void Engine::WaitForIdle() {
  MutexLock lock(io_mu_);
  while (io_in_flight_ != 0) io_idle_.Wait(io_mu_);
}

LookupOutcome Engine::Lookup(const NamespaceFingerprint& ns, std::span<const BlockKey> keys) {
  return locator_->Lookup(ns, keys);
}

void Engine::LookupSome(const NamespaceFingerprint& ns, std::span<const BlockKey> keys, LookupCursor& cursor,
                        size_t max_keys) {
  locator_->LookupSome(ns, keys, cursor, max_keys);
}

std::vector<SlotGrant> Engine::Reserve(ConnectionId connection, const NamespaceFingerprint& ns,
                                       std::span<const BlockKey> keys, std::span<const uint64_t> sizes,
                                       const ReserveChain& links) {
  return writer_->Reserve(connection, ns, keys, sizes, links);
}

std::vector<Status> Engine::Commit(ConnectionId connection, const NamespaceFingerprint& ns,
                                   std::span<const BlockKey> keys, std::span<const uint64_t> sizes,
                                   std::span<const uint64_t> checksums, std::span<const uint64_t> layer_checksums) {
  std::vector<Status> out = writer_->Commit(connection, ns, keys, sizes, checksums, layer_checksums);
  if (!published_.has_handoffs()) return out;
  // Blocks a peer took while they were being written leave now (hand-offs); refused ones lose their marks.
  std::vector<BlockKey> committed, refused;
  for (size_t i = 0; i < keys.size() && i < out.size(); ++i) (out[i].ok() ? committed : refused).push_back(keys[i]);
  if (!refused.empty()) published_.Aborted(connection, refused);
  if (auto taken = published_.Committed(connection, ns, committed); !taken.empty()) EraseHandedOff(ns, taken);
  return out;
}

void Engine::CheckHealth(HealthFindings& out) const {
  report_->CheckHealth(out);
  constexpr size_t kListed = 8;
  std::string listed;
  size_t total = 0;
  const auto list = [&](std::string_view tier, const Quarantine& q) {
    if (q.size() == 0) return;
    total += q.size();
    listed += std::string(listed.empty() ? "" : "; ") + std::to_string(q.size()) + " in " + std::string(tier) + " (";
    const std::vector<BlockKey> keys = q.Newest(kListed);
    for (size_t i = 0; i < keys.size(); ++i) listed += (i ? ", " : "") + keys[i].ToHex();
    listed += q.size() > keys.size() ? ", ...)" : ")";
  };
  list("host", host_quarantine_);
  for (const auto& level : below_) list(TierName(level->reported), level->measured->quarantine());
  if (above_ != nullptr) list("hbm", above_->source().measured->quarantine());
  if (total > 0) {
    out.AddWarning(std::to_string(total) +
                   " block(s) failed verification and are quarantined, never served from that tier until written "
                   "again: " +
                   listed);
  }
}

size_t Engine::TakenByPeer(const NamespaceFingerprint& ns, std::span<const BlockKey> keys) {
  std::vector<BlockKey> now = published_.Taken(ns, keys);
  return now.empty() ? 0 : EraseHandedOff(ns, now);
}

size_t Engine::EraseHandedOff(const NamespaceFingerprint& ns, std::span<const BlockKey> keys) {
  holder_->EndHolds(ns, keys);
  // This node's copies only: the remote tier's pool is other nodes' too.
  const size_t freed = eraser_->Erase(ns, keys, Eraser::Reach::kThisNode);
  Bump(counters_.handoffs_freed, static_cast<int64_t>(freed));
  return freed;
}

size_t Engine::Abort(ConnectionId connection, std::span<const BlockKey> keys) {
  published_.Aborted(connection, keys);
  return writer_->Abort(connection, keys);
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
  holder_->EndHolds(ns, keys);                        // an erased block is held no longer (holder.h)
  const size_t waiting = adopter_->Forget(ns, keys);  // before the index: it must not commit them after
  return waiting + eraser_->Erase(ns, keys);
}

void Engine::StartAdoption() { adopter_->Start(); }

Result<Engine::LoadStart> Engine::BeginLoad(ConnectionId connection, const NamespaceFingerprint& ns,
                                            std::span<const BlockKey> keys, LoadFlags flags) {
  return loader_->Begin(connection, ns, keys, flags);
}

Status Engine::EndLoad(ConnectionId connection, uint64_t load) { return loader_->End(connection, load); }

void Engine::CloseConnection(ConnectionId connection) {
  queue_.DropConnection(connection);
  loader_->EndAll(connection);
  pinner_->EndConnection(connection);  // its reservations and leases, in one walk
  published_.EndConnection(connection);
  if (namespaces_.Release(connection)) ForgetUnusedNamespaces();
  Bump(counters_.connections_closed);
}

}  // namespace kvtier

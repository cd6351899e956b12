// Engine: the block index over the tier stack, plus the policies that
// decide what stays. It is the daemon's only stateful core; the wire
// adapters (server_connection.cc) translate requests into these calls.
//
// The stack: an optional tier above the host (the HBM tier), the host tier
// (the shared arena clients read and write in place), then an ordered list
// of BlockTiers (tiers/tier.h) below it, each with its own admission
// (tier_admission.h). Tiers are known only by their place; no engine code
// names one.
//
// A facade over named parts, each with its contract in its header: the
// index shards (block_index.h, where a block changes state), the locator
// (locator.h: lookups), the writer (writer.h: a put's reservations and
// commits), the evictor (evictor.h, where a demotion is decided), the
// demoter (demoter.h: down the stack), the pinner (pinner.h: pins,
// releases, reported uses), the promoter and layer streamer (promoter.h,
// layer_streamer.h: up into the arena, whole or layer by layer), the above
// mover (above_mover.h: the tier above the host), queue hints and prefetch
// (request_queue.h, prefetcher.h, its view of the stack prefetch_stack.h),
// the loader (loader.h: layer-wise loads and their boards), operator holds
// (holder.h), the eraser (eraser.h: every tier), preload plans
// (preload_rates.h), its reports on the stack (stack_report.h: counters,
// health, namespace use), the check of corruption reports
// (corruption_check.h) and the host tier's BlockTier face
// (host_block_tier.h). The parts reach the engine only through the hooks
// it gives them (engine_hooks.cc).
//
// A block's life in the host tier is block_entry.h's diagram; each change of
// what a tier holds is a block event (block_events.h). Blocks below are
// inclusive copies; Erase reaches every tier, writes in flight included.
//
// Thread-safe. The index is split into shards by key hash, each with its
// own mutex and eviction policy instance. No shard lock is held while
// another shard is locked, and none across I/O. The lock order is
// docs/ARCHITECTURE.md's ("One lock order"); members carry GUARDED_BY,
// checked by `make thread-safety`.
#pragma once

#include <atomic>
#include <functional>
#include <limits>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/counters.h"
#include "common/health_findings.h"
#include "common/mutex.h"
#include "common/retry_scheduler.h"
#include "daemon/engine/above_mover.h"
#include "daemon/engine/quarantine.h"
#include "daemon/engine/adopter.h"
#include "daemon/engine/corruption_check.h"
#include "daemon/engine/holder.h"
#include "daemon/engine/host_block_tier.h"
#include "daemon/engine/layer_streamer.h"
#include "daemon/engine/lineage.h"
#include "daemon/engine/loader.h"
#include "daemon/engine/locator.h"
#include "daemon/engine/measured_tier.h"
#include "daemon/engine/mover.h"
#include "daemon/engine/namespace_registry.h"
#include "daemon/engine/pinner.h"
#include "daemon/engine/prefetcher.h"
#include "daemon/engine/preload_rates.h"
#include "daemon/engine/promoter.h"
#include "daemon/engine/published_layers.h"
#include "daemon/engine/ready_estimator.h"
#include "daemon/engine/request_queue.h"
#include "daemon/engine/stack_report.h"
#include "daemon/engine/engine_counters.h"
#include "daemon/engine/engine_levels.h"
#include "daemon/engine/demoter.h"
#include "daemon/engine/engine_types.h"
#include "daemon/engine/eraser.h"
#include "daemon/engine/evictor.h"
#include "daemon/engine/tier_admission.h"
#include "daemon/engine/writer.h"
#include "kvtier/block_key.h"
#include "kvtier/client.h"
#include "kvtier/preload.h"
#include "kvtier/result.h"
#include "policy/dwpd_budget.h"
#include "policy/prefetch_planner.h"
#include "tiers/host/host_tier.h"
#include "tiers/tier.h"

namespace kvtier {

class BlockIndex;
struct PinBatch;

class Engine {
 public:
  // `host`, `clock`, every tier of `below` (highest first) and `above` (the
  // tier stacked above the host, if any) are borrowed and must outlive the
  // Engine. InvalidArgument for a bad shard count, an admission whose budget
  // does not validate, or a level below reported as other than nvme/remote.
  static Result<std::unique_ptr<Engine>> Create(const EngineOptions& options, HostTier& host, const Clock& clock,
                                                std::vector<LowerTier> below, BlockTier* above = nullptr);
  // Create with at most one tier below the host (null: none), admitting
  // with options.admission and options.dwpd.
  static Result<std::unique_ptr<Engine>> Create(const EngineOptions& options, HostTier& host, const Clock& clock,
                                                BlockTier* below = nullptr);
  // Stop(), then frees everything.
  ~Engine();
  // Stops the engine for good: the adopter's thread ends, the tiers below
  // no longer call into it, retries still waiting run at once
  // (RetryScheduler::Stop, so it returns on a stopped clock), demotions
  // waiting for room fail, and it waits for every promotion and demotion
  // in flight. Afterwards no thread of the engine touches the arena or a
  // tier, also when it is destroyed (so its tiers and host tier may go
  // first), and it must not be called again, except for its counters
  // while its tiers are there (they read them). A takeover stops its
  // engines and frees them only after the hand-over, or never (daemon/
  // main.cc): freeing their index takes seconds at millions of blocks.
  // Its clock and event journal may go first too. Idempotent; main thread
  // (with no request in flight).
  void Stop();

  // Namespaces: registered, used by connections and forgotten as
  // NamespaceRegistry (namespace_registry.h) says. The layer split of a
  // namespace's blocks keeps a demoted block's layers addressable (a block
  // of another size is stored as one layer). RegisterNamespace keeps `ns`
  // until the engine ends; UseNamespaces (a client's Hello) marks them
  // used by `connection` until CloseConnection.
  void RegisterNamespace(const NamespaceFingerprint& ns, const NamespaceLayout& layout);
  void RegisterNamespace(const NamespaceFingerprint& ns, const NamespaceDescriptor& descriptor);
  void UseNamespaces(ConnectionId connection, std::span<const NamespaceFingerprint> namespaces,
                     std::span<const NamespaceDescriptor> descriptors);
  // Forgets every namespace that no connection uses, that has no block in
  // any tier (the NVMe index included: a namespace with blocks stays) and
  // that RegisterNamespace did not keep. O(blocks of the host and above
  // tiers + namespaces of NVMe). Returns how many were forgotten. Also run
  // by CloseConnection once enough unused namespaces have built up.
  size_t ForgetUnusedNamespaces();
  // Registered namespaces (kept, used, or unused with blocks): the gauge.
  size_t RegisteredNamespaces() const;

  // Every namespace with a block in some tier, plus those registered since
  // start, and where (StackReport's reports: stack_report.h).
  using TierUse = EngineTierUse;
  using NamespaceUse = EngineNamespaceUse;
  std::vector<NamespaceUse> NamespaceUses() const { return report_->NamespaceUses(); }
  // Registered namespaces of `model_id` (and `model_revision` unless empty).
  std::vector<NamespaceFingerprint> NamespacesOfModel(std::string_view model_id, std::string_view model_revision) const;
  // Erases every block of `ns` from every tier (Erase's semantics: the
  // NVMe index included, blocks moving between tiers too). Per tier, top
  // first: the blocks it held.
  std::vector<TierUse> DropNamespace(const NamespaceFingerprint& ns);
  std::vector<std::string> TierNames() const { return report_->TierNames(); }  // top first: "hbm", "host", ...
  // Every block of every tier (stack_report.h); a namespace's descriptor, if registered since start.
  void ForEachHeldBlock(const StackReport::HeldBlockVisitor& v) const { report_->ForEachHeldBlock(v); }
  std::optional<NamespaceDescriptor> DescriptorOf(const NamespaceFingerprint& ns) const;
  // namespace.bytes gauges (in VisitCounters): kMaxNamespaceSeries namespaces at most, the rest ns="other".
  static constexpr size_t kMaxNamespaceSeries = StackReport::kMaxNamespaceSeries;
  void VisitNamespaceUse(CounterVisitor& v) const { report_->VisitNamespaceUse(v); }

  // Lookups (locator.h, whose contracts these are): the longest prefix
  // of `keys` committed under `ns`, with tiers, at once or in steps of at
  // most `max_keys` keys through `cursor`. Not a use for eviction.
  LookupOutcome Lookup(const NamespaceFingerprint& ns, std::span<const BlockKey> keys);
  void LookupSome(const NamespaceFingerprint& ns, std::span<const BlockKey> keys, LookupCursor& cursor,
                  size_t max_keys);

  // The write path (writer.h, whose contracts these are): Reserve claims
  // arena space for each key (with `links.chain`, its lineage), Commit
  // publishes reserved blocks with their checksums (verified with
  // EngineOptions::verify_commits), Abort drops this connection's
  // reservations of `keys` and returns how many were.
  std::vector<SlotGrant> Reserve(ConnectionId connection, const NamespaceFingerprint& ns,
                                 std::span<const BlockKey> keys, std::span<const uint64_t> sizes,
                                 const ReserveChain& links = {});
  std::vector<Status> Commit(ConnectionId connection, const NamespaceFingerprint& ns, std::span<const BlockKey> keys,
                             std::span<const uint64_t> sizes, std::span<const uint64_t> checksums = {},
                             std::span<const uint64_t> layer_checksums = {});
  size_t Abort(ConnectionId connection, std::span<const BlockKey> keys);

  // Pins, releases and reported uses: the Pinner's (pinner.h, where their
  // contracts are), forwarded.
  using PinDone = Pinner::PinDone;
  void PinAsync(ConnectionId connection, const NamespaceFingerprint& ns, std::vector<BlockKey> keys, PinDone done,
                LayerSpan layers = {});
  std::vector<PinGrant> Pin(ConnectionId connection, const NamespaceFingerprint& ns, std::span<const BlockKey> keys,
                            LayerSpan layers = {});
  std::vector<Status> Release(ConnectionId connection, std::span<const LeaseId> leases);
  size_t RecordUses(const NamespaceFingerprint& ns, std::span<const BlockKey> keys);
  // Lookups clients answered from the block directory: counted, also in engine.local_lookups.
  void RecordLocalLookups(int64_t lookups, int64_t keys, int64_t hit_blocks);
  void RecordBadUsageReport();  // a usage report with an unknown namespace or bad keys

  // Removes committed blocks from every tier (eraser.h), their operator
  // holds ended, and kept blocks still waiting for adoption; returns how
  // many there were.
  size_t Erase(const NamespaceFingerprint& ns, std::span<const BlockKey> keys);

  // After a restart that kept the host arena (host_tier.h HostKeep): starts
  // checking its blocks and making them visible (adopter.h). kvtierd calls
  // it once the engine is built; until then they wait.
  void StartAdoption();

  // A client's verified read of `keys` of `ns` did not match their
  // checksums: each such host block is checked again off the request
  // thread and dropped only if it disagrees with its commit's checksums;
  // `done` gets the number dropped (CorruptionCheck, corruption_check.h).
  static constexpr size_t kMaxReportedKeys = CorruptionCheck::kMaxReportedKeys;
  void CheckReportedCorrupt(const NamespaceFingerprint& ns, std::span<const BlockKey> keys,
                            std::function<void(Result<size_t>)> done) {
    corruption_->Check(ns, keys, std::move(done));
  }

  // Preload planning (policy/preload_planner.h) with `source`'s measured
  // read bandwidth, as PreloadRates (preload_rates.h) says: a tier
  // below's read meter plus kBelowLayerOverheadUs a layer, the host
  // tier's memcpy rate (measured once, on first use), a 10% margin.
  // InvalidArgument for no layers, no bytes or a negative or non-finite
  // time; NotFound when the daemon has no such tier.
  static constexpr double kBelowLayerOverheadUs = PreloadRates::kBelowLayerOverheadUs;
  Result<PreloadPlan> PlanPreload(Tier source, uint64_t bytes_per_layer, double compute_us_per_layer, uint32_t layers,
                                  double recompute_us_per_layer) {
    return preload_.Plan(source, bytes_per_layer, compute_us_per_layer, layers, recompute_us_per_layer);
  }

  PublishedLayers& published_layers() { return published_; }  // reservations' layers shown to peers
  // A peer reader took `keys` of `ns` whole: those their writer handed off
  // (PublishedLayers) leave every tier of this node, now when committed,
  // else at their commit; counted in engine.handoffs_freed. Returns how
  // many went now.
  size_t TakenByPeer(const NamespaceFingerprint& ns, std::span<const BlockKey> keys);
  // Where `key` is now (as Lookup places it, no probe: locator.h); a block's layers (its namespace's layout).
  std::optional<Locator::Placed> Where(const NamespaceFingerprint& ns, const BlockKey& key) const {
    return locator_->Where(ns, key);
  }
  uint32_t LayersOf(const NamespaceFingerprint& ns, uint64_t size) const {
    return namespaces_.LayoutOf(ns, size).layer_count;
  }
  // When the longest cached prefix of `keys` can be in host and GPU memory (ready_estimator.h: model, errors).
  Result<ReadyEstimate> EstimateReady(const NamespaceFingerprint& ns, std::span<const BlockKey> keys) {
    return estimator_.Estimate(ns, keys);
  }

  // Layer-wise loads: the Loader's Begin and End (loader.h says what they
  // promise); CloseConnection ends a connection's loads.
  using LoadStart = EngineLoadStart;
  static constexpr size_t kMaxLoadsPerConnection = Loader::kMaxLoadsPerConnection;
  static constexpr size_t kMaxLoadBlocks = Loader::kMaxLoadBlocks;
  Result<LoadStart> BeginLoad(ConnectionId connection, const NamespaceFingerprint& ns, std::span<const BlockKey> keys,
                              LoadFlags flags = {});
  Status EndLoad(ConnectionId connection, uint64_t load);

  // Blocks until no promotion or demotion is in flight (shutdown), a retry
  // waiting for its time included (on a FakeClock the test moves to it).
  void WaitForIdle();

  // Frees `connection`'s reservations and leases, drops its queued requests.
  void CloseConnection(ConnectionId connection);

  // Operator holds (`kvtier pin` / `unpin`): the Holder's (holder.h, where
  // their contracts are), forwarded. Blocks kept in the host tier, one pin
  // each under kHoldConnection, until Unhold, their TTL, DropNamespace or
  // Erase. In memory only: a restart forgets them.
  using HoldResult = EngineHoldResult;
  static constexpr uint64_t kMaxHoldTtlUs = Holder::kMaxHoldTtlUs;
  std::vector<HoldResult> Hold(const NamespaceFingerprint& ns, std::span<const BlockKey> keys, uint64_t ttl_us) {
    return holder_->Hold(ns, keys, ttl_us);
  }
  std::vector<Status> Unhold(const NamespaceFingerprint& ns, std::span<const BlockKey> keys) {
    return holder_->Unhold(ns, keys);
  }
  size_t ReleaseExpiredHolds() { return holder_->ReleaseExpired(); }

  // Queue hints (engine_queue.cc) from an inference engine's scheduler on
  // connection `connection`; request ids are the connection's own. Enqueue:
  // `request` will need `chain` (root first) of `ns`, expected to start
  // `start_in_us` from now, for conversation `conversation` (0: none);
  // again with the same id replaces it. Busy beyond kMaxQueuedRequests
  // queued at once, or beyond this connection's share
  // (EngineOptions::max_queued_*_per_connection). `start_in_us` is clamped
  // to kMaxStartInUs. Only the queue_aware policy acts on them; the others
  // accept and ignore them.
  static constexpr size_t kMaxQueuedRequests = 1 << 16;
  static constexpr uint64_t kMaxStartInUs = 3'600'000'000;  // an hour
  Status Enqueue(ConnectionId connection, const NamespaceFingerprint& ns, uint64_t request,
                 std::span<const BlockKey> chain, uint64_t start_in_us, uint64_t conversation);
  // The request started or finished (or was dropped): its blocks stop
  // waiting for it, and prefetch plans again. NotFound if it is not queued.
  Status Dequeue(ConnectionId connection, uint64_t request);
  // Conversation `conversation` opened or closed (its blocks go first among
  // those no queued request needs while it is closed).
  void ConversationHint(uint64_t conversation, bool open);
  // Plans and starts prefetch reads for the queued requests (engine_queue.cc,
  // policy/prefetch_planner.h) within engine.prefetch_percent of the host
  // tier, less what earlier plans read in that nobody used yet. Enqueue,
  // Dequeue, the last read of a plan landing and a use of a prefetched
  // block (Pin, a directory use report) call it. Returns the reads
  // started.
  size_t Prefetch();

  // The host tier's BlockTier face (host_block_tier.h): for the tier above
  // it, tools and the tier contract tests.
  BlockTier& host_tier();

  // The stack's counters and what is wrong with it (stack_report.h).
  // The stack's (StackReport), then the gauges engine.published_blocks
  // (reservations with layers published to peers) and engine.handoff_marks
  // (hand-off blocks awaiting a peer's Taken or their commit).
  void VisitCounters(CounterVisitor& v) const {
    report_->VisitCounters(v);
    adopter_->VisitCounters(v);
    host_quarantine_.VisitCounters(v, "{tier=\"host\"}");
    v.VisitGauge("engine.published_blocks", static_cast<int64_t>(published_.size()));
    v.VisitGauge("engine.handoff_marks", static_cast<int64_t>(published_.handoffs()));
  }
  // The stack's findings (StackReport), and a warning naming the keys in
  // quarantine (quarantine.h), per tier.
  void CheckHealth(HealthFindings& out) const;

 private:
  // Erases handed-off blocks taken by a peer from this node's tiers
  // (Eraser::Reach::kThisNode), counted in engine.handoffs_freed.
  size_t EraseHandedOff(const NamespaceFingerprint& ns, std::span<const BlockKey> keys);
  Engine(const EngineOptions& options, HostTier& host, const Clock& clock);

  static constexpr size_t kAboveLevel = std::numeric_limits<size_t>::max();  // Located::level above the host
  // The highest tier below the host holding `key` under `ns`. Takes only
  // the tiers' leaf locks (callable under a shard lock).
  std::optional<Located> FindBelow(const BlockKey& key, const NamespaceFingerprint& ns) const;
  // Where a pin of `key` missing from the host tier reads it from: the
  // tier above (the fastest) if it holds it, else FindBelow.
  std::optional<Located> FindOutside(const BlockKey& key, const NamespaceFingerprint& ns) const;
  TierLevel& SourceAt(size_t level);  // the record of the tier a Located names
  BlockIndex& ShardFor(const BlockKey& key);
  // The tiers of the stack, top first (StackReport::StackTop).
  std::vector<const BlockTier*> StackTop() const { return report_->StackTop(); }

  // Demotions (engine_tiers.cc). Demote writes an evicted host block to
  // tier `level` (demoter.h), its bytes copied before it returns.
  // FinishDemotion runs the pins that waited for `key` (`written`: ok,
  // failed or refused) and erases from its tier a block erased meanwhile
  // and written anyway; DemotionErased says whether that happened.
  void Demote(size_t level, const NamespaceFingerprint& ns, const BlockKey& key, HostTier::Extent extent, uint64_t size,
              uint64_t checksum);
  void FinishDemotion(const BlockKey& key, const Status& written);
  bool DemotionErased(const BlockKey& key);
  void IoStarted();
  void IoFinished();

  // Runs Prefetch on the reader soon (one plan pending at most): request
  // threads call this, never Prefetch (a plan scans the queue).
  void SchedulePrefetch();
  // The parts' hooks into the engine and the stack (engine_hooks.cc).
  Prefetcher::Stack PrefetchHooks();
  Demoter::Hooks DemoterHooks();
  AboveMover::Hooks AboveHooks();
  Promoter::Hooks PromoterHooks();
  LayerStreamer::Hooks StreamerHooks();
  Pinner::Hooks PinnerHooks();
  Locator::Hooks LocatorHooks();
  Writer::Hooks WriterHooks();
  Adopter::Hooks AdopterHooks();
  Loader::Hooks LoaderHooks();
  StackReport::Hooks ReportHooks();
  CorruptionCheck::Hooks CorruptionHooks();
  HostBlockTier::Hooks HostTierHooks();

  HostTier& host_;
  const Clock& clock_;
  std::vector<std::unique_ptr<TierLevel>> below_;  // the tiers below the host, highest first
  bool probing_ = false;          // some tier of below_ has a prober (BlockTier::prober), set at Create
  bool stopped_ = false;          // Stop ran
  PreloadRates preload_{below_};  // preload plans with the stack's measured rates (preload_rates.h)
  // Parents and conversations from queue hints, for admission.
  static constexpr size_t kLineageKeys = size_t{1} << 20;
  Lineage lineage_{kLineageKeys};
  const EventTap events_;         // block events, parents from lineage_ (block_events.h)
  NamespaceRegistry namespaces_;  // layouts and users of namespaces (namespace_registry.h)
  Mutex io_mu_;
  CondVar io_idle_;
  int64_t io_in_flight_ GUARDED_BY(io_mu_) = 0;  // promotions, demotions, waiting retries
  std::vector<std::unique_ptr<BlockIndex>> shards_;
  RequestQueue queue_;                      // queue hints, handed to the shards' policies (request_queue.h)
  std::unique_ptr<Prefetcher> prefetcher_;  // made by Create (prefetcher.h)
  std::unique_ptr<Evictor> evictor_;        // room in the arena, where victims go; made by Create (evictor.h)
  // What the lower tiers' eviction sinks call: cleared (under the unique
  // lock) before the Engine goes away, so a sink running on a tier thread
  // never reaches a destroyed Engine.
  struct SinkGate {
    SharedMutex mu;
    Engine* engine GUARDED_BY(mu) = nullptr;
  };
  std::shared_ptr<SinkGate> sink_gate_ = std::make_shared<SinkGate>();
  std::atomic<uint64_t> next_handle_{1};
  // Keys whose host copy failed verification (dropped), until a good copy
  // is visible again (BlockIndex::Publish: a put, a promotion, an
  // adoption); each tier below keeps its own (its MeasuredTier, quarantine.h).
  Quarantine host_quarantine_;
  mutable EngineCounters counters_;  // monotonic event counters (engine_counters.h)
  // Lookups (locator.h) and the write path: reservations and commits
  // into the arena (writer.h).
  std::unique_ptr<Locator> locator_;
  std::unique_ptr<Writer> writer_;
  PublishedLayers published_{*writer_, namespaces_};  // layers of reservations published to peers
  ReadyEstimator estimator_{*locator_, below_, [this] { return preload_.HostCopyBytesPerS(); }};  // ready_estimator.h
  // What the engine reports about its stack (stack_report.h); made by
  // Create once the stack is complete. No thread of its own.
  std::unique_ptr<StackReport> report_;
  // Corruption reports checked (corruption_check.h), on host_io_, which
  // is destroyed first; made by Create.
  std::unique_ptr<CorruptionCheck> corruption_;

  // Retries of what a busy tier refused (promotions, layer-wise loads'
  // reads, copies up), each at its time on clock_ (retry_scheduler.h).
  // Each waiting retry counts as I/O in flight; ~Engine stops it (running
  // those still waiting at once) before it waits for idle.
  std::unique_ptr<RetryScheduler> retries_;
  // Reads up into the arena, whole or layer by layer (promoter.h,
  // layer_streamer.h); no threads of their own.
  std::unique_ptr<Promoter> promoter_;
  std::unique_ptr<LayerStreamer> streamer_;
  // Pins, releases and reported uses (pinner.h); made by Create.
  std::unique_ptr<Pinner> pinner_;
  std::unique_ptr<Holder> holder_;    // operator holds (holder.h); made by Create
  std::unique_ptr<Loader> loader_;    // layer-wise loads (loader.h); made by Create
  std::unique_ptr<Eraser> eraser_;    // erases from every tier (eraser.h); made by Create
  std::unique_ptr<Adopter> adopter_;  // a kept arena's blocks (adopter.h); made last by Create, stopped first
  // The movers (mover.h), declared last: destroyed first, after ~Engine
  // waited for their jobs (each counts as I/O in flight): the demoter's
  // (demoter.h), the reader (prefetch plans), the host tier face's
  // completions (host_block_tier.h; joined before the face goes) and the
  // tier above's (above_mover.h; null without one, first to go). Request
  // threads only queue work for them.
  std::unique_ptr<Demoter> demoter_;
  std::unique_ptr<Mover> reader_;
  std::unique_ptr<HostBlockTier> host_block_tier_;
  std::unique_ptr<Mover> host_io_;
  std::unique_ptr<AboveMover> above_;
};

}  // namespace kvtier

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
// index shards (block_index.h, where a block changes state), the evictor
// (evictor.h, where a demotion is decided), the demoter (demoter.h: down
// the stack), the promoter and layer streamer (promoter.h,
// layer_streamer.h: up into the arena, whole or layer by layer), the
// above mover (above_mover.h: the tier above the host), queue hints and
// prefetch (request_queue.h, prefetcher.h), loads and holds (load_table.h,
// hold_table.h), its reports on the stack (stack_report.h: counters,
// health, namespace use) and the check of corruption reports
// (corruption_check.h). The parts reach the engine only through the
// hooks it gives them (engine_hooks.cc).
//
// Block life cycle in the host tier:
//   Reserve -> [reserved, invisible] -> Commit -> [committed, visible]
//   committed + Pin -> [pinned: never evicted] -> Release -> committed
//   Erase of a pinned block -> [zombie: invisible] -> last Release -> freed
// A connection's uncommitted reservations and leases die with
// CloseConnection. Blocks below are inclusive copies: a promotion leaves
// the copy below; Erase reaches every tier, writes in flight included.
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
#include <mutex>
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
#include "daemon/engine/corruption_check.h"
#include "daemon/engine/hold_table.h"
#include "daemon/engine/layer_streamer.h"
#include "daemon/engine/lineage.h"
#include "daemon/engine/load_table.h"
#include "daemon/engine/measured_tier.h"
#include "daemon/engine/mover.h"
#include "daemon/engine/namespace_registry.h"
#include "daemon/engine/prefetcher.h"
#include "daemon/engine/promoter.h"
#include "daemon/engine/request_queue.h"
#include "daemon/engine/stack_report.h"
#include "daemon/engine/engine_counters.h"
#include "daemon/engine/engine_levels.h"
#include "daemon/engine/demoter.h"
#include "daemon/engine/engine_types.h"
#include "daemon/engine/evictor.h"
#include "daemon/engine/tier_admission.h"
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
struct LoadRecord;
struct PinBatch;
struct BlockEntry;
class HostBlockTier;

class Engine {
 public:
  // `host`, `clock`, every tier of `below` (highest first) and `above` (the
  // tier stacked above the host, if any) are borrowed and must outlive the
  // Engine. InvalidArgument for a bad shard count, an admission whose budget
  // does not validate, or a level below reported as other than nvme/remote.
  static Result<std::unique_ptr<Engine>> Create(const EngineOptions& options, HostTier& host,
                                                const Clock& clock, std::vector<LowerTier> below,
                                                BlockTier* above = nullptr);
  // Create with at most one tier below the host (null: none), admitting
  // with options.admission and options.dwpd.
  static Result<std::unique_ptr<Engine>> Create(const EngineOptions& options, HostTier& host,
                                                const Clock& clock, BlockTier* below = nullptr);
  // Waits for promotions and demotions in flight; retries still waiting
  // run at once (RetryScheduler::Stop), so it returns on a stopped clock.
  ~Engine();

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

  // Every namespace with a block in some tier, plus those registered
  // since start, and where. The reports on the stack below are
  // StackReport's (stack_report.h, with their contracts).
  using TierUse = EngineTierUse;
  using NamespaceUse = EngineNamespaceUse;
  std::vector<NamespaceUse> NamespaceUses() const { return report_->NamespaceUses(); }
  // Registered namespaces of `model_id` (and `model_revision` unless empty).
  std::vector<NamespaceFingerprint> NamespacesOfModel(std::string_view model_id,
                                                      std::string_view model_revision) const;
  // Erases every block of `ns` from every tier (Erase's semantics: the
  // NVMe index included, blocks moving between tiers too). Per tier, top
  // first: the blocks it held.
  std::vector<TierUse> DropNamespace(const NamespaceFingerprint& ns);
  std::vector<std::string> TierNames() const { return report_->TierNames(); }  // top first: "hbm", "host", ...
  // namespace.bytes gauges (part of VisitCounters), at most
  // kMaxNamespaceSeries namespaces, the rest under ns="other".
  static constexpr size_t kMaxNamespaceSeries = StackReport::kMaxNamespaceSeries;
  void VisitNamespaceUse(CounterVisitor& v) const { report_->VisitNamespaceUse(v); }

  // Longest prefix of `keys` committed under namespace `ns`, with tiers.
  // Does not count as a use for eviction.
  LookupOutcome Lookup(const NamespaceFingerprint& ns, std::span<const BlockKey> keys);
  // The same Lookup in steps: places at most `max_keys` more of `keys`
  // from `cursor.next` and sets `cursor.done` when a key misses or none is
  // left (then it counts as one lookup, and `cursor.out` is Lookup's
  // answer). Each key is placed under its own shard lock, in steps as in
  // one call, so a caller may do other work between steps; the tiers below
  // are probed once, for every key from the first unknown one on.
  // Precondition: `keys` is the same span on every step of a cursor.
  void LookupSome(const NamespaceFingerprint& ns, std::span<const BlockKey> keys, LookupCursor& cursor,
                  size_t max_keys);

  // Reserves arena space for each key (sizes[i] bytes). Per key: ok with the
  // slot, AlreadyExists (committed or being written), NoSpace (nothing left
  // to evict), InvalidArgument (size 0 or larger than the arena).
  // With `links.chain` the keys' parents are recorded as lineage
  // (ReserveChain), so admission's prefix closure holds without queue hints.
  // Precondition: keys.size() == sizes.size().
  std::vector<SlotGrant> Reserve(ConnectionId connection, const NamespaceFingerprint& ns,
                                 std::span<const BlockKey> keys, std::span<const uint64_t> sizes,
                                 const ReserveChain& links = {});

  // Publishes reserved blocks after checking that sizes[i] equals the
  // reserved size, recording each block's xxh3-64: checksums[i] as the
  // client computed it, or the engine's own hash of the bytes when
  // `checksums` is empty. With EngineOptions::verify_commits the engine
  // hashes every block and compares.
  // A block of its namespace's block size with layer_count > 1 also
  // records the checksum of each layer (common/checksum.h) when the writer
  // sent them in `layer_checksums` (every such block's layers in key
  // order; ignored unless it holds exactly that many), as sent, or checked
  // against the bytes with verify_commits (in the same pass as the block).
  // The engine never hashes layers otherwise: a block committed without
  // them has none (readers that verify check such a block whole). Per key:
  // ok, FailedPrecondition (no reservation by this connection),
  // InvalidArgument (size mismatch), Corruption (verify_commits and the
  // bytes do not match a checksum sent); on the last two the reservation
  // is dropped and its space returns.
  // Precondition: keys.size() == sizes.size(), and checksums is empty or
  // as long.
  std::vector<Status> Commit(ConnectionId connection, const NamespaceFingerprint& ns,
                             std::span<const BlockKey> keys, std::span<const uint64_t> sizes,
                             std::span<const uint64_t> checksums = {},
                             std::span<const uint64_t> layer_checksums = {});

  // Drops this connection's reservations of `keys`; returns how many were.
  size_t Abort(ConnectionId connection, std::span<const BlockKey> keys);

  using PinDone = std::function<void(std::vector<PinGrant>)>;
  // Pins committed blocks and hands out one lease per block, promoting
  // blocks found only below the host tier into it first. Per key: ok,
  // NotFound (a miss, also when a promotion read fails or does not
  // verify), NoSpace (no arena room for a promotion). A pin is a use
  // (recency, hits). `done` runs exactly once: inline when no key needed
  // I/O, else on a thread of the tier that completed the last read.
  //
  // With a layer span (not whole), each grant covers only those layers: a
  // host block's bytes in place; for a block found only below, only those
  // layers are read, into transient arena space owned by the lease (freed at
  // Release; the block is not promoted). Such grants carry the checksums of
  // their layers (PinGrant::layer_checksums) when they are known (a block
  // read from below: always; a host block: when its writer sent them or it
  // was promoted), and for a host block the whole block's checksum and
  // place. Also InvalidArgument per key when the span is not within the
  // block's layers.
  void PinAsync(ConnectionId connection, const NamespaceFingerprint& ns, std::vector<BlockKey> keys, PinDone done,
                LayerSpan layers = {});
  // PinAsync, waiting for the outcome.
  std::vector<PinGrant> Pin(ConnectionId connection, const NamespaceFingerprint& ns,
                            std::span<const BlockKey> keys, LayerSpan layers = {});

  // Per lease: ok, NotFound (unknown or already released), PermissionDenied
  // (held by another connection).
  std::vector<Status> Release(ConnectionId connection, std::span<const LeaseId> leases);

  // Uses clients made of host blocks through the block directory (copying
  // gets that needed no Pin), reported after the fact: each block of `keys`
  // still committed under `ns` counts a use (recency, hits), the others
  // (evicted or erased since) are skipped. Returns how many counted.
  size_t RecordUses(const NamespaceFingerprint& ns, std::span<const BlockKey> keys);
  // Lookups clients answered from the block directory: counted, also in engine.local_lookups.
  void RecordLocalLookups(int64_t lookups, int64_t keys, int64_t hit_blocks);
  void RecordBadUsageReport();  // a usage report with an unknown namespace or bad keys

  // Removes committed blocks from every tier; returns how many there were.
  size_t Erase(const NamespaceFingerprint& ns, std::span<const BlockKey> keys);

  // A client's verified read of `keys` of `ns` did not match their
  // checksums: each such host block is checked again off the request
  // thread and dropped only if it disagrees with its commit's checksums;
  // `done` gets the number dropped (CorruptionCheck, corruption_check.h).
  static constexpr size_t kMaxReportedKeys = CorruptionCheck::kMaxReportedKeys;
  void CheckReportedCorrupt(const NamespaceFingerprint& ns, std::span<const BlockKey> keys,
                            std::function<void(Result<size_t>)> done) {
    corruption_->Check(ns, keys, std::move(done));
  }

  // Preload planning (policy/preload_planner.h) with `source`'s read
  // bandwidth: for a tier below, the 10th percentile of the rates its
  // read meter sampled (ReadMeter, read_meter.h: bytes over busy time of
  // promotions, layer reads and loads; its initial estimate before any)
  // plus kBelowLayerOverheadUs
  // a layer (one read's submission and completion); for the host tier,
  // memcpy's rate, measured once on first use. A 10% margin on top.
  // InvalidArgument for no layers, no bytes or a negative or non-finite
  // time; NotFound when the daemon has no such tier. Engine_preload.cc.
  static constexpr double kBelowLayerOverheadUs = 20;
  Result<PreloadPlan> PlanPreload(Tier source, uint64_t bytes_per_layer, double compute_us_per_layer,
                                  uint32_t layers, double recompute_us_per_layer);

  // Layer-wise load (engine_load.cc): pins every key of `keys` for the load
  // and streams the blocks found only below the host tier into the arena
  // in layer order across the blocks (layer 0 of every block first), so the
  // client can compute on early layers while later ones arrive. Progress is
  // on the load board (common/load_board.h) in the arena, which the client
  // reads without asking. A streamed block is a promotion: once its last
  // layer lands it is committed in the host tier (and later pins wait for
  // it meanwhile). Blocks are whole blocks of the namespace's registered
  // layout.
  using LoadStart = EngineLoadStart;
  static constexpr size_t kMaxLoadsPerConnection = 64;
  static constexpr size_t kMaxLoadBlocks = size_t{1} << 16;
  //
  // With `in_place` (the client maps the memory of the tier above the
  // host) a block held there with the namespace's layout is not copied:
  // the board says kInDevice with its offset in that memory, held until
  // the load ends; the others load as above and, once loaded, are offered
  // to the tier above (copied up off the request path).
  // InvalidArgument (no keys, too many, a namespace without a layout),
  // Busy (the connection holds kMaxLoadsPerConnection loads), NoSpace (no
  // room for the board).
  //
  // With `verify` (the client checks every layer it reads) the board has
  // the layer checksum table (common/load_board.h, LoadBoardBytes with
  // layers): the layer checksums of each block that lands later are
  // written there before any of its layers counts as in place (a block
  // read from below always has them; one that lands without fails with
  // Unimplemented), and LoadStart::layer_checksums has those of the
  // blocks settled at once.
  Result<LoadStart> BeginLoad(ConnectionId connection, const NamespaceFingerprint& ns, std::span<const BlockKey> keys,
                              bool in_place = false, bool verify = false);
  // Ends a load: its pins go, and its board once no read of it is in
  // flight (the client must not read the board afterwards). NotFound for a
  // load this connection does not hold. CloseConnection ends them all.
  Status EndLoad(ConnectionId connection, uint64_t load);

  // Blocks until no promotion or demotion is in flight (shutdown), a retry
  // waiting for its time included (on a FakeClock the test moves to it).
  void WaitForIdle();

  // Frees `connection`'s reservations and leases, drops its queued requests.
  void CloseConnection(ConnectionId connection);

  // Operator holds (engine_holds.cc, hold_table.h; `kvtier pin` / `unpin`):
  // blocks kept in the host tier, one pin each under kHoldConnection, until
  // Unhold, their TTL, DropNamespace or Erase. Expired holds are released at
  // every Hold and Unhold and before an allocation evicts anything, so one
  // never keeps a block from eviction (until then it stays pinned but is no
  // longer in engine.holds). In memory only: a restart forgets them.
  using HoldResult = EngineHoldResult;
  static constexpr uint64_t kMaxHoldTtlUs = 30ull * 24 * 3600 * 1'000'000;  // 30 days
  // Holds `keys` of `ns` for `ttl_us` from now (1..kMaxHoldTtlUs, else
  // InvalidArgument for every key). A key this namespace holds already
  // gets the new expiry, now + ttl_us, and stays one pin. A hold is a use
  // (recency, hits), as a pin is. Never waits for I/O.
  std::vector<HoldResult> Hold(const NamespaceFingerprint& ns, std::span<const BlockKey> keys, uint64_t ttl_us);
  // Ends the holds of `keys` of `ns`: per key ok, or NotFound (not held:
  // never, expired, or still pending).
  std::vector<Status> Unhold(const NamespaceFingerprint& ns, std::span<const BlockKey> keys);
  // Releases every hold whose expiry has come (the clock's now >= expiry);
  // returns how many. Cheap when none has (one atomic load).
  size_t ReleaseExpiredHolds();

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
  void VisitCounters(CounterVisitor& v) const { report_->VisitCounters(v); }
  void CheckHealth(HealthFindings& out) const { report_->CheckHealth(out); }

 private:
  friend class HostBlockTier;  // the host tier's BlockTier face works on the index

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

  // Pins (engine_pin.cc). PinLocked pins the committed entry of `key` for
  // `connection`, with every layer's checksum when `with_layers`; the
  // caller holds the shard lock (checked at run time: engine.h sees
  // BlockIndex only declared). ProbeUnknown lets the tiers that probe
  // (Prober::Probe) learn of the keys no tier knows, before a pin or load
  // claims them (no lock held). ClaimPins settles every key it can inline
  // (host hits, misses, bad spans) and counts those that wait for a
  // promotion, a demotion or a layer read; one shard lock at a time.
  // RunPins is PinAsync once its batch is made; RetryPin pins one key
  // again once its demotion ended.
  PinGrant PinLocked(BlockIndex& shard, ConnectionId connection, const BlockKey& key, uint64_t now_us,
                     bool with_layers = false);
  void ProbeUnknown(const NamespaceFingerprint& ns, std::span<const BlockKey> keys);
  PinClaims ClaimPins(const std::shared_ptr<PinBatch>& batch, const NamespaceFingerprint& ns,
                      std::span<const BlockKey> keys, LayerSpan layers);
  void RunPins(const std::shared_ptr<PinBatch>& batch, const NamespaceFingerprint& ns, std::span<const BlockKey> keys,
               LayerSpan layers);
  void RetryPin(const std::shared_ptr<PinBatch>& batch, size_t index, const BlockKey& key,
                const NamespaceFingerprint& ns, LayerSpan layers);
  // The checksums of layers [first, last) of `entry`, a block of
  // `layer_count` layers (for one layer: its whole checksum).
  static std::vector<uint64_t> LayerChecksumsOf(const BlockEntry& entry, uint32_t layer_count, uint32_t first,
                                                uint32_t last);

  // Layer-wise loads (engine_load.cc). A block of `load` resolved (pinned
  // for it, or failed): the board says so, and a pin that came after
  // EndLoad is released; `at_once`: settled in BeginLoad itself (its
  // checksums go in the answer). EndLoadRecord frees a load's board once
  // it ended and no read of it is in flight.
  void LoadBlockResolved(const std::shared_ptr<LoadRecord>& load, size_t index, const PinGrant& grant,
                         bool at_once = false);
  void EndLoadRecord(const std::shared_ptr<LoadRecord>& load);

  // Demotions (engine_tiers.cc). Demote writes an evicted host block to
  // tier `level` (demoter.h), its bytes copied before it returns.
  // FinishDemotion runs the pins that waited for `key` (`written`: ok,
  // failed or refused) and erases from its tier a block erased meanwhile
  // and written anyway; DemotionErased says whether that happened.
  void Demote(size_t level, const NamespaceFingerprint& ns, const BlockKey& key, HostTier::Extent extent,
              uint64_t size, uint64_t checksum);
  void FinishDemotion(const BlockKey& key, const Status& written);
  bool DemotionErased(const BlockKey& key);
  void IoStarted();
  void IoFinished();

  // Holds (engine_holds.cc). HoldLanded records the pin `grant` of `key`
  // as a hold until `expires_us`, unless the key is held already (the
  // later expiry stays, the extra pin goes) or `ns` was dropped since the
  // hold began (drop epoch `epoch`: the pin goes, NotFound). EndHolds ends
  // the holds of `keys` of `ns`; EndNamespaceHolds every hold of `ns`,
  // failing the holds of it still pending. Call with no lock held.
  Status HoldLanded(const NamespaceFingerprint& ns, const BlockKey& key, const PinGrant& grant, uint64_t expires_us,
                    uint64_t epoch);
  size_t EndHolds(const NamespaceFingerprint& ns, std::span<const BlockKey> keys);
  void EndNamespaceHolds(const NamespaceFingerprint& ns);

  // Runs Prefetch on the reader soon (one plan pending at most): request
  // threads call this, never Prefetch (a plan scans the queue).
  void SchedulePrefetch();
  // The prefetcher's hooks into the stack (engine_queue.cc), and the
  // other parts' into the engine (engine_hooks.cc).
  Prefetcher::Stack PrefetchStack();
  Demoter::Hooks DemoterHooks();
  AboveMover::Hooks AboveHooks();
  Promoter::Hooks PromoterHooks();
  LayerStreamer::Hooks StreamerHooks();
  StackReport::Hooks ReportHooks();
  CorruptionCheck::Hooks CorruptionHooks();

  HostTier& host_;
  const Clock& clock_;
  std::vector<std::unique_ptr<TierLevel>> below_;  // the tiers below the host, highest first
  bool probing_ = false;  // some tier of below_ has a prober (BlockTier::prober), set at Create
  std::once_flag host_copy_measured_;
  double host_copy_bytes_per_s_ = 0;  // set once, under host_copy_measured_
  // Parents and conversations from queue hints, for admission.
  static constexpr size_t kLineageKeys = size_t{1} << 20;
  Lineage lineage_{kLineageKeys};
  NamespaceRegistry namespaces_;  // layouts and users of namespaces (namespace_registry.h)
  Mutex io_mu_;
  CondVar io_idle_;
  int64_t io_in_flight_ GUARDED_BY(io_mu_) = 0;  // promotions, demotions, waiting retries
  std::vector<std::unique_ptr<BlockIndex>> shards_;
  RequestQueue queue_;  // queue hints, handed to the shards' policies (request_queue.h)
  std::unique_ptr<Prefetcher> prefetcher_;  // made by Create (prefetcher.h)
  std::unique_ptr<Evictor> evictor_;  // room in the arena, where victims go; made by Create (evictor.h)
  const bool verify_commits_;  // EngineOptions::verify_commits
  // What the lower tiers' eviction sinks call: cleared (under the unique
  // lock) before the Engine goes away, so a sink running on a tier thread
  // never reaches a destroyed Engine.
  struct SinkGate {
    SharedMutex mu;
    Engine* engine GUARDED_BY(mu) = nullptr;
  };
  std::shared_ptr<SinkGate> sink_gate_ = std::make_shared<SinkGate>();
  std::atomic<uint64_t> next_handle_{1};
  LoadTable loads_{kMaxLoadsPerConnection};  // each connection's open loads (load_table.h)
  HoldTable holds_;  // operator holds (hold_table.h)
  mutable EngineCounters counters_;  // monotonic event counters (engine_counters.h)
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

// Engine: the block index over the tier stack, plus the policies that
// decide what stays. It is the daemon's only stateful core; the wire
// adapters (server_connection.cc) translate requests into these calls.
//
// The stack: the host tier (the shared arena clients read and write in
// place) on top, then an ordered list of BlockTiers (tiers/tier.h) below
// it, each with its own admission (tier_admission.h). No engine code names
// a tier below the host: placement is generic over adjacent tiers.
//
// Thread-safe. The index is split into shards by key hash; each shard has its
// own mutex and its own eviction policy instance. No shard lock is held while
// another shard is locked, and none across I/O. Lock order: shard -> host
// tier (the tier's own mutex is a leaf).
//
// Block life cycle in the host tier:
//   Reserve -> [reserved, invisible] -> Commit -> [committed, visible]
//   committed + Pin -> [pinned: never evicted] -> Release -> committed
//   Erase of a pinned block -> [zombie: invisible] -> last Release -> freed
// A connection's uncommitted reservations and leases die with CloseConnection.
//
// A tier above the host (the HBM tier, engine_above.cc), when there is
// one: blocks that layer-wise loads into GPU memory read (a hit: reuse
// evidence) are copied up on the `engine.above_io` mover, and such loads
// get them in place (BlockTier::HoldInPlace: the client copies device to
// device). It is an LRU of its own; a victim no other tier holds is
// demoted into the host tier first (the HBM tier's evictions demote to
// host). Lookup reports it first; a pin of a block held only there reads
// it back into the host tier like a promotion from below.
//
// Placement with tiers below the host:
// - Demotion: an evicted host block goes to the first tier below whose
//   admission takes it (copied into the tier's staging, then written;
//   visible there once written), else it is dropped. A block a tier below
//   already holds costs no write. A block a lower tier evicts is offered
//   (BlockTier::SetEvictionSink) to the tiers under it the same way.
// - Promotion: a Pin of a block found only below reads it from the
//   highest tier holding it into new arena space (verified), then commits
//   and pins it like any host block; the copy below stays (inclusive).
//   Concurrent pins of a block being promoted wait for the one read.
// - Erase reaches every tier, writes in flight included.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <limits>
#include <list>
#include <map>
#include <unordered_map>
#include <unordered_set>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/counters.h"
#include "daemon/engine/lineage.h"
#include "daemon/engine/measured_tier.h"
#include "daemon/engine/mover.h"
#include "daemon/engine/queued_keys.h"
#include "daemon/engine/tier_admission.h"
#include "kvtier/block_key.h"
#include "kvtier/client.h"
#include "kvtier/preload.h"
#include "kvtier/result.h"
#include "policy/dwpd_budget.h"
#include "policy/option_defaults.h"
#include "policy/prefetch_planner.h"
#include "tiers/host/host_tier.h"
#include "tiers/tier.h"

namespace kvtier {

using ConnectionId = uint64_t;  // also in daemon/engine/block_entry.h
using LeaseId = uint64_t;
// The connection the host tier's BlockTier face (HostBlockTier) reserves
// and pins under; the server numbers its connections from 1 upwards.
constexpr ConnectionId kHostTierConnection = ~ConnectionId{0};
// The connection operator holds (Engine::Hold, `kvtier pin`) pin under; no
// client connection ever gets it.
constexpr ConnectionId kHoldConnection = ~ConnectionId{0} - 1;

struct EngineOptions {
  uint32_t shards = defaults::kEngineShards;  // 1..256
  std::string eviction = "lru"; // "lru" | "fifo" | "lru2" | "s3fifo" | "arc" | "queue_aware"
  // For Create with one tier below the host: which evicted blocks it gets,
  // "all" | "second_hit" | "dwpd" (then `dwpd` must validate).
  std::string admission = "all";
  DwpdOptions dwpd;
  // queue_aware: a victim some queued request needs within this window is
  // demoted to the first tier below whatever its class, as long as that
  // tier's write budget (if any) can pay for it; past the budget it goes
  // through admission like any other block.
  uint64_t lookahead_us = defaults::kLookaheadMs * 1000;
  // Prefetch (queue hints + a tier below): lower-tier prefix blocks of
  // queued requests are read into the host tier before their start, at
  // most this share of the host capacity per plan, skipping hits shorter
  // than prefetch_min_blocks. 0 turns prefetch off.
  double prefetch_share = defaults::kPrefetchPercent / 100.0;
  uint32_t prefetch_min_blocks = defaults::kPrefetchMinBlocks;
  // Queue hints one connection may hold at once: requests, and chain keys
  // over all of them. Past either, that connection's Enqueue is Busy;
  // other connections are unaffected.
  // Layer-range reads of blocks below the host tier land in transient arena
  // space held by their lease: at most this share of the host capacity at
  // once (more: Busy for that key), so layer reads never push the host
  // tier's blocks out beyond it.
  double layer_read_share = 0.125;
  // Demotions a busy tier below cannot take at once wait, copied out of
  // the arena, in the demoter (a mover thread) for room there: at most
  // this many bytes. Past it, such a victim is dropped (counted).
  uint64_t demotion_buffer_bytes = defaults::kDemotionBufferBytes;
  size_t max_queued_requests_per_connection = 8192;
  size_t max_queued_keys_per_connection = size_t{1} << 20;
  // Commit hashes every block even when the client sent its checksum, and
  // fails a block whose bytes do not match (host.verify_commits). Off: a
  // client's checksum is recorded as sent (one pass less over the bytes);
  // demotion and verifying readers still check the bytes against it.
  bool verify_commits = defaults::kVerifyCommits;
};

// What a Reserve says of its keys' chain: with `chain` they are consecutive
// blocks of one prefix chain, root first (keys[i - 1] is keys[i]'s parent),
// and `parent`, if any, is keys[0]'s parent.
struct ReserveChain {
  bool chain = false;
  std::optional<BlockKey> parent;
};

struct SlotGrant {
  Status status;  // ok, AlreadyExists, NoSpace, InvalidArgument
  uint64_t offset = 0;
  uint64_t length = 0;
};

struct PinGrant {
  Status status;  // ok or NotFound
  uint64_t offset = 0;
  uint64_t length = 0;
  LeaseId lease = 0;
  // The block's xxh3-64; for a layer range of a host block the whole
  // block's, which lies at [block_offset, block_offset + block_length) in
  // the arena (so a reader can verify the range within it); 0 for a layer
  // range read from below (only its layers are in the arena).
  uint64_t checksum = 0;
  uint64_t block_offset = 0;
  uint64_t block_length = 0;
  // The xxh3-64 of each layer granted: for a layer range, its layers (as
  // committed, or as the tier below verified them); for a whole block,
  // every layer's, only when the pin asked for them (a verifying load),
  // else empty. A block of one layer has its whole checksum as layer 0's.
  std::vector<uint64_t> layer_checksums;
};

struct LookupOutcome {
  size_t prefix_blocks = 0;
  std::vector<Tier> tiers;
};

// A Lookup made a few keys at a time (Engine::LookupSome): what it found so
// far, where it goes on, and whether the tiers below were probed.
struct LookupCursor {
  LookupOutcome out;  // prefix_blocks is set once done
  size_t next = 0;    // the index of the next key to place
  bool probed = false;
  bool done = false;  // a key missed, or every key was placed
};

// How a namespace's blocks split into layers (from its descriptor).
struct NamespaceLayout {
  uint32_t layer_count = 1;
  uint64_t block_bytes = 0;  // bytes of a whole block
};

// Layers [first, last) of a block; {0, 0} means the whole block. A block is
// layer-major with its namespace's layer_count equal layers when it has the
// namespace's block size, else it is one layer.
struct LayerSpan {
  uint32_t first = 0;
  uint32_t last = 0;
  bool whole() const { return first == 0 && last == 0; }
};

// One tier under the host tier, as the engine's stack is built.
struct LowerTier {
  BlockTier* tier = nullptr;  // borrowed; outlives the Engine
  // Which blocks evicted from the tier above it takes: "all" |
  // "second_hit" | "dwpd" (then `dwpd` must validate) | "rate" (then
  // `rate_bytes_per_second` must be positive).
  std::string admission = "all";
  DwpdOptions dwpd;
  uint64_t rate_bytes_per_second = 0;
};

struct EngineShard;
struct PinBatch;
struct BlockEntry;
class HostBlockTier;

class Engine {
 public:
  // `host`, `clock` and every tier of `below` (highest first) are borrowed
  // and must outlive the Engine. InvalidArgument for a bad shard count or
  // policy name.
  // `above`, if not null, is the tier stacked above the host (borrowed
  // likewise).
  static Result<std::unique_ptr<Engine>> Create(const EngineOptions& options, HostTier& host,
                                                const Clock& clock, std::vector<LowerTier> below,
                                                BlockTier* above = nullptr);
  // Create with at most one tier below the host (null: none), admitting
  // with options.admission and options.dwpd.
  static Result<std::unique_ptr<Engine>> Create(const EngineOptions& options, HostTier& host,
                                                const Clock& clock, BlockTier* below = nullptr);
  ~Engine();  // waits for promotions and demotions in flight

  // Records the layer split of `ns`'s blocks so a demoted block keeps its
  // layers addressable (a block of another size is stored as one layer).
  void RegisterNamespace(const NamespaceFingerprint& ns, const NamespaceLayout& layout);
  // The same, remembering what `ns` is (for `kvtier ls` and dropping a
  // model revision). Kept until the engine ends.
  void RegisterNamespace(const NamespaceFingerprint& ns, const NamespaceDescriptor& descriptor);
  // What a client's Hello calls: registers `namespaces[i]` as
  // `descriptors[i]` and marks them used by `connection` until
  // CloseConnection. A namespace no connection uses and no tier holds a
  // block of is forgotten (its layout and descriptor dropped) by
  // ForgetUnusedNamespaces; one registered by RegisterNamespace never is.
  void UseNamespaces(ConnectionId connection, std::span<const NamespaceFingerprint> namespaces,
                     std::span<const NamespaceDescriptor> descriptors);
  // Forgets every namespace that no connection uses, that has no block in
  // any tier (the NVMe index included: a namespace with blocks stays) and
  // that RegisterNamespace did not keep. O(blocks of the host and above
  // tiers + namespaces of NVMe). Returns how many were forgotten. Also run
  // by CloseConnection once enough unused namespaces have built up.
  size_t ForgetUnusedNamespaces();
  // Registered namespaces (kept, or used by a connection, or unused with
  // blocks), for tests and the namespace gauge.
  size_t RegisteredNamespaces() const;

  // Namespaces and where their blocks are (engine_namespaces.cc): every
  // namespace with a block in some tier, plus those registered since
  // start. O(blocks of every tier).
  struct TierUse {
    std::string tier;  // "hbm", "host", "nvme", ...: the stack, top first
    uint64_t blocks = 0;
    uint64_t bytes = 0;  // payload bytes
  };
  struct NamespaceUse {
    NamespaceFingerprint ns;
    // Known when a client registered the namespace since this daemon
    // started (a namespace found only in a persistent tier is not).
    std::optional<NamespaceDescriptor> descriptor;
    std::vector<TierUse> tiers;  // one per tier of the stack, top first
  };
  std::vector<NamespaceUse> NamespaceUses() const;
  // Registered namespaces of `model_id` (and of `model_revision`, unless
  // it is empty).
  std::vector<NamespaceFingerprint> NamespacesOfModel(std::string_view model_id,
                                                      std::string_view model_revision) const;
  // Erases every block of `ns` from every tier (Erase's semantics: the
  // NVMe index included, blocks moving between tiers too). Per tier, top
  // first: the blocks it held.
  std::vector<TierUse> DropNamespace(const NamespaceFingerprint& ns);
  // The names of the stack's tiers, top first ("hbm", "host", "nvme").
  std::vector<std::string> TierNames() const;
  // Use per namespace as gauges (part of VisitCounters): payload bytes per
  // tier, `namespace.bytes{ns="<16 hex>",model=...,revision=...,
  // adapter=...,tier="host"}` (model, revision, adapter when registered
  // since start). At most kMaxNamespaceSeries namespaces, the largest; the
  // rest summed under ns="other". O(namespaces) for tiers that keep
  // per-namespace sums (NVMe), O(blocks) for the others.
  static constexpr size_t kMaxNamespaceSeries = 256;
  void VisitNamespaceUse(CounterVisitor& v) const;

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

  // Drops this connection's reservations of `keys`; returns how many existed.
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
  // Lookups clients answered from the block directory: added to the lookup
  // counters (and to engine.local_lookups).
  void RecordLocalLookups(int64_t lookups, int64_t keys, int64_t hit_blocks);
  // A usage report named an unregistered namespace or carried bad keys.
  void RecordBadUsageReport();

  // Removes committed blocks from every tier; returns how many there were.
  size_t Erase(const NamespaceFingerprint& ns, std::span<const BlockKey> keys);

  // A client's verified read of `keys` (namespace `ns`, at most
  // kMaxReportedKeys) did not match their checksums (engine_reports.cc).
  // Each such block the host tier holds is pinned at once, hashed again
  // off the request thread (on the host_io mover) against the checksums
  // recorded when it was committed, and removed from the host tier only
  // if they disagree: a report cannot evict a sound block, and copies in
  // the tiers below stay (each verifies its own on read). `done` runs
  // exactly once with the number of blocks dropped: inline when no
  // reported block is in the host tier, else on the mover's thread.
  // Busy (nothing checked) when the mover's queue is full; InvalidArgument
  // for too many keys. Counters engine.corrupt_reports (keys checked),
  // engine.corrupt_drops, engine.corrupt_reports_refuted (found intact).
  static constexpr size_t kMaxReportedKeys = 64;
  void CheckReportedCorrupt(const NamespaceFingerprint& ns, std::span<const BlockKey> keys,
                            std::function<void(Result<size_t>)> done);

  // Preload planning (policy/preload_planner.h) with `source`'s read
  // bandwidth: for a tier below, the 10th percentile of the rates its
  // read meter sampled (ReadStarted/ReadEnded: bytes over busy time of
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
  struct LoadStart {
    uint64_t load = 0;  // for EndLoad
    uint64_t board_offset = 0;
    uint64_t board_bytes = 0;
    uint32_t layers = 1;
    uint64_t layer_bytes = 0;
    // Per key: Ok (loading or loaded: see the board), or why it will not
    // load (NotFound, InvalidArgument: not a whole block, NoSpace...).
    std::vector<Status> blocks;
    // The slowest tier a block is read from (kHost: every block was a host
    // hit), and the bytes a layer reads from the tiers below.
    Tier source = Tier::kHost;
    uint64_t below_bytes_per_layer = 0;
    // With `verify`: per key settled at once (a host hit), its checksum and
    // its layers' (empty when its writer sent none: the reader checks it
    // whole); empty for the others (on the board when they land).
    struct BlockChecksums {
      bool settled = false;  // the block was settled at once; else nothing here
      uint64_t block = 0;
      std::vector<uint64_t> layers;
    };
    std::vector<BlockChecksums> layer_checksums;
  };
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

  // Blocks until no promotion or demotion is in flight (shutdown: after the
  // server stopped, before its executors go away).
  void WaitForIdle();

  // Frees every reservation and lease of `connection`, and drops its queued
  // requests. Idempotent.
  void CloseConnection(ConnectionId connection);

  // Operator holds (engine_holds.cc; `kvtier pin` / `unpin`): blocks of a
  // namespace kept in the host tier, never evicted, until Unhold, until
  // their TTL passes, until their namespace is dropped (DropNamespace) or
  // until they are erased (Erase). A hold is one pin under kHoldConnection.
  // Expiry is lazy: expired holds are released at every Hold and Unhold
  // call and whenever an allocation in the host tier finds no room (before
  // it evicts anything), so an expired hold never keeps a block from
  // eviction; until then it stays pinned (engine.pinned_blocks) but no
  // longer counts in engine.holds. Holds live in memory: a restart forgets
  // them.
  struct HoldResult {
    // ok (held, or pending), NotFound (cached in no tier, or its namespace
    // was dropped meanwhile), NoSpace (no host room to read it into),
    // Busy (the tier below stayed busy), InvalidArgument (bad TTL).
    Status status;
    // ok but not yet held: the block is on its way into the host tier
    // (read from a tier below, or its demotion ends first); it is held from
    // when it lands, unless that read fails (engine.hold_failures).
    bool pending = false;
  };
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

  // The host tier through the BlockTier interface (daemon/engine/host_block_tier.h):
  // for a tier stacked above it, tools and the tier contract tests.
  BlockTier& host_tier();

  void VisitCounters(CounterVisitor& v) const;

 private:
  void VisitTierFamilies(CounterVisitor& v) const;
  friend class HostBlockTier;  // the host tier's BlockTier face works on the index

  Engine(const EngineOptions& options, HostTier& host, const Clock& clock);

  // A block found outside the host tier: the tier holding it.
  static constexpr size_t kAboveLevel = std::numeric_limits<size_t>::max();
  struct Located {
    size_t level = 0;  // index into below_, or kAboveLevel
    BlockTier::BlockInfo info;
  };
  // The highest tier below the host holding `key` under `ns`. Takes only
  // the tiers' leaf locks (callable under a shard lock).
  std::optional<Located> FindBelow(const BlockKey& key, const NamespaceFingerprint& ns) const;
  // Where a pin of `key` missing from the host tier reads it from: the
  // tier above (the fastest) if it holds it, else FindBelow.
  std::optional<Located> FindOutside(const BlockKey& key, const NamespaceFingerprint& ns) const;
  struct Below;
  // The record of the tier a Located names.
  Below& SourceAt(size_t level);

  EngineShard& ShardFor(const BlockKey& key);
  size_t ShardIndex(const BlockKey& key) const;
  // Pins the committed `entry` of `key` for `connection`, with every
  // layer's checksum when `with_layers`. Caller holds the shard lock.
  PinGrant PinLocked(EngineShard& shard, ConnectionId connection, const BlockKey& key, uint64_t now_us,
                     bool with_layers = false);
  // Reads `key` from the tier it was found in into new arena space, then
  // pins it for its waiters. Runs without locks. A tier out of read
  // staging (Busy) is tried again on the reader until `deadline`, then the
  // waiters get Busy; the first overload allows kPromotionBusyWait.
  void Promote(const BlockKey& key, const Located& from);
  void Promote(const BlockKey& key, const Located& from, std::chrono::steady_clock::time_point deadline);
  // `layer_checksums`: of the layers the tier verified (BlockTier::
  // ReadWithLayerChecksums), recorded when they fit the namespace's
  // layout, else hashed from the landed bytes.
  void FinishPromotion(const BlockKey& key, Status status, HostTier::Extent extent, uint64_t checksum,
                       std::vector<uint64_t> layer_checksums = {});
  // Reads `layers` of `key` from the tier it was found in into transient
  // arena space and resolves slot `index` of `batch` with a lease on it.
  // Runs without locks.
  void ReadLayers(const std::shared_ptr<PinBatch>& batch, size_t index, const BlockKey& key, const Located& from,
                  LayerSpan layers);
  // What ClaimPins left to start: blocks it claimed for promotion (a
  // kPromoting entry with `batch`'s slot among its waiters) and blocks
  // whose layer range is to be read from below.
  struct PinClaim {
    size_t index = 0;
    BlockKey key;
    Located from;
  };
  struct PinClaims {
    std::vector<PinClaim> promote, read_layers;
  };
  // PinAsync's first half: settles every key it can inline (host hits,
  // misses, bad spans) in batch->grants; the keys that wait for a
  // promotion, a demotion or a layer read are counted in
  // batch->outstanding and, when the batch has on_resolve, marked in
  // batch->waiting. Takes one shard lock at a time.
  // Lets the tiers that probe (BlockTier::Probe) learn about those of
  // `keys` no tier knows of, before a pin or load claims them. No lock
  // held; nothing when no tier of the stack probes.
  void ProbeUnknown(const NamespaceFingerprint& ns, std::span<const BlockKey> keys);
  PinClaims ClaimPins(const std::shared_ptr<PinBatch>& batch, const NamespaceFingerprint& ns,
                      std::span<const BlockKey> keys, LayerSpan layers);
  // Layer-wise loads (engine_load.cc): a load's record and board, and the
  // stream of layer reads of the blocks it promotes.
  struct LoadRecord;
  struct LayerStream;
  // A block of `load` resolved (pinned for it, or failed): the board
  // says so, and a pin that came after EndLoad is released.
  // `at_once`: settled in BeginLoad itself (its checksums go in the answer).
  void LoadBlockResolved(const std::shared_ptr<LoadRecord>& load, size_t index, const PinGrant& grant,
                         bool at_once = false);
  // Streams `claims` (claimed promotions of whole blocks) for `load`.
  void StartStream(const std::shared_ptr<LoadRecord>& load, std::span<const PinClaim> claims);
  // Submits the stream's next layer reads in order until the tier is busy.
  void PumpStream(const std::shared_ptr<LayerStream>& stream);
  void StreamReadDone(const std::shared_ptr<LayerStream>& stream, size_t block, uint32_t layer,
                      Result<BlockTier::LayerRead> read);
  // Frees a load's board once it ended and no read of it is in flight.
  void EndLoadRecord(const std::shared_ptr<LoadRecord>& load);
  // PinAsync once its batch is made (RetryPin reuses it for one key).
  void RunPins(const std::shared_ptr<PinBatch>& batch, const NamespaceFingerprint& ns, std::span<const BlockKey> keys,
               LayerSpan layers);
  // The checksums of layers [first, last) of `entry`, a block of
  // `layer_count` layers (for one layer: its whole checksum).
  static std::vector<uint64_t> LayerChecksumsOf(const BlockEntry& entry, uint32_t layer_count, uint32_t first,
                                                uint32_t last);
  // Pins `key` again for slot `index` of `batch` (its demotion ended).
  void RetryPin(const std::shared_ptr<PinBatch>& batch, size_t index, const BlockKey& key,
                const NamespaceFingerprint& ns, LayerSpan layers);
  // The demotion of `key` ended (`written`: ok, failed or refused): runs
  // the pins that waited for it. One erased meanwhile and written anyway
  // (the Erase came before the write started) is erased from its tier.
  void FinishDemotion(const BlockKey& key, const Status& written);
  // Whether `key`'s demotion in flight was erased (false for none).
  bool DemotionErased(const BlockKey& key);
  // The layer split of a block of `size` bytes in namespace `ns`.
  NamespaceLayout LayoutOf(const NamespaceFingerprint& ns, uint64_t size);
  // Writes an evicted host block to tier `level`; its bytes are copied
  // before this returns, so the caller may free the extent right after.
  void Demote(size_t level, const NamespaceFingerprint& ns, const BlockKey& key, HostTier::Extent extent,
              uint64_t size, uint64_t checksum);
  // Writes `payload` of `key` to tier `level` without waiting: at once when
  // the tier takes it, else (Busy) a copy waits in the demoter for room, or
  // is dropped when the demoter is full too (engine.demotion_busy_drops).
  // `done` runs exactly once with the outcome; the caller may reuse
  // `payload` as soon as this returns.
  void WriteToTier(size_t level, const NamespaceFingerprint& ns, const BlockKey& key, uint32_t layers,
                   std::span<const std::byte> payload, uint64_t checksum, BlockTier::WriteDone done);
  // Counts a demotion write that did not succeed by its cause.
  void CountFailedWrite(const Status& outcome);
  // A block tier `from` evicts (its eviction sink): written to the first
  // tier under it that admits it, unless one already holds it. Runs on a
  // thread of tier `from`; never waits (WriteToTier).
  void DemoteBelow(size_t from, const BlockTier::Evicted& block, std::span<const std::byte> payload);
  // Admission's facts on `key` (lineage, parent held). Takes shard locks:
  // call with none held.
  TierAdmission::Facts GatherFacts(const BlockKey& key, uint64_t uses);
  void IoStarted();
  void IoFinished();
  // The read meter of a tier below: its bandwidth is what it delivers
  // while busy (bytes over time with a read in flight), sampled when it
  // goes idle or every kBandwidthSampleBytes, not each read's own rate
  // (reads in flight together each take longer than the tier's rate
  // says). Every read started calls ReadEnded once (0 bytes: failed).
  static constexpr uint64_t kBandwidthSampleBytes = 64ull << 20;
  void ReadStarted(Below& below);
  void ReadEnded(Below& below, uint64_t bytes);
  // Allocates `bytes`, evicting least-valuable unpinned blocks as needed,
  // but never more than kEvictionBytesFactor times the allocation's size
  // class (and at least kMinVictimsPerAllocation blocks): past that, NoSpace
  // (a fragmented arena), so one allocation never flushes the host tier.
  static constexpr uint64_t kEvictionBytesFactor = 4;
  static constexpr int kMinVictimsPerAllocation = 8;
  Result<HostTier::Extent> AllocateWithEviction(uint64_t bytes);
  // Evicts the globally oldest victim among the shards' policies; false when
  // nothing is evictable. *evicted_bytes: the victim's size (0 when it
  // raced with a use and nothing was evicted).
  bool EvictOne(uint64_t* evicted_bytes = nullptr);
  // Layer-read pool: takes `bytes` (false: the pool is full), gives back.
  bool TakeTransient(uint64_t bytes);
  void EndTransient(uint64_t bytes);
  // The tier above the host (engine_above.cc). AboveHold holds `key` in
  // place there for a load (use: LRU), if it is stored under `ns`.
  std::optional<BlockTier::InPlace> AboveHold(const NamespaceFingerprint& ns, const BlockKey& key);
  // Queues a copy of host block `key` up (once; skipped when the queue is
  // full). CopyUp and EvictAboveOne run on above_io_ only; CopyUp says
  // whether it started a write (whose completion then ends the offer).
  void OfferAbove(const NamespaceFingerprint& ns, const BlockKey& key);
  bool CopyUp(const NamespaceFingerprint& ns, const BlockKey& key);
  // Makes room above: the least recently used block goes, demoted into the
  // host tier first unless another tier holds it. False: nothing to evict.
  bool EvictAboveOne();
  // Forgets `key` above (Erase), cancelling a copy up of it; true when a
  // stored block went. Takes only leaf locks.
  bool EraseAbove(const NamespaceFingerprint& ns, const BlockKey& key, bool moving);
  // Marks `key` recently used above, if it is there.
  void TouchAbove(const BlockKey& key);

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
  // Sets `key`'s expiry (holds_mu_ held).
  void SetHoldExpiry(const BlockKey& key, uint64_t expires_us);
  // Removes `key`'s hold record, if any, and returns its lease (0: none)
  // (holds_mu_ held).
  LeaseId TakeHold(const BlockKey& key);

  // Whether `key` is in DRAM (or being written or demoted) or in a tier below.
  // Takes its shard's lock: call with none held.
  bool HeldAnywhere(const BlockKey& key);

  // Runs Prefetch on the reader soon (one plan pending at most: a plan
  // already waiting sees this change too). Request threads call this,
  // never Prefetch: a plan scans the queue.
  void SchedulePrefetch();
  // Drops every queued request of `connection` (its connection closed).
  void DropQueuedRequests(ConnectionId connection);
  // Enqueue's bookkeeping: the request under (connection, request), its chain
  // handed to the shards' policies. Busy past kMaxQueuedRequests.
  Status RegisterQueued(ConnectionId connection, const NamespaceFingerprint& ns, uint64_t request,
                        std::span<const BlockKey> chain, uint64_t start_us, uint64_t conversation);

  HostTier& host_;
  const Clock& clock_;
  // The tiers below the host, highest first.
  struct Below {
    // The tier as the engine calls it: through its MeasuredTier (latency,
    // bytes), which forwards to the tier it was given.
    BlockTier* tier = nullptr;
    std::unique_ptr<MeasuredTier> measured;
    std::unique_ptr<TierAdmission> admission;
    BandwidthEstimate read_bandwidth{1e9};  // guarded by bandwidth_mu_; 1 GB/s until measured
    // The read meter (ReadStarted/ReadEnded), guarded by bandwidth_mu_.
    int64_t reads_in_flight = 0;
    uint64_t busy_since_us = 0;  // the current busy period's start (or last sample)
    uint64_t busy_bytes = 0;     // read since then
    std::atomic<int64_t> lookup_hits{0};
    std::atomic<int64_t> demotions_in{0};   // blocks a tier above evicted, written here
    std::atomic<int64_t> demotion_drops{0};  // blocks evicted from above that no tier took
  };
  std::vector<std::unique_ptr<Below>> below_;
  bool probing_ = false;  // some tier of below_ probes (BlockTier::probes), set at Create
  // The tier above the host: its source record (read meter, lookup hits)
  // and its LRU. Null without one.
  struct Above {
    Below source;
    std::mutex mu;  // a leaf
    std::list<BlockKey> lru;  // guarded by mu: most recently used first
    struct Resident {
      NamespaceFingerprint ns;
      std::list<BlockKey>::iterator at;
    };
    std::unordered_map<BlockKey, Resident> resident;  // guarded by mu
    std::unordered_set<BlockKey> offered;    // guarded by mu: copies up queued, running or being written
    std::unordered_set<BlockKey> cancelled;  // guarded by mu: offered keys erased meanwhile
    std::vector<std::byte> up_buffer, down_buffer;    // above_io_'s own
    std::atomic<int64_t> copies_up{0}, copy_up_skips{0}, copy_up_failures{0}, offers_dropped{0};
    std::atomic<int64_t> evictions{0}, demotions_to_host{0}, demotion_failures{0}, in_place_blocks{0};
  };
  std::unique_ptr<Above> above_;
  std::once_flag host_copy_measured_;
  double host_copy_bytes_per_s_ = 0;  // set once, under host_copy_measured_
  const uint64_t lookahead_us_;
  // Parents and conversations from queue hints, for admission.
  static constexpr size_t kLineageKeys = size_t{1} << 20;
  Lineage lineage_{kLineageKeys};
  // The keys queued chains name (for lower tiers' queue_aware reclaim).
  QueuedKeys queued_keys_;
  std::atomic<int64_t> prefetch_reads_{0};  // prefetch reads in flight
  std::atomic<bool> prefetch_budget_freed_{false};  // a prefetched block was used since the last plan
  mutable std::mutex namespaces_mu_;
  std::unordered_map<NamespaceFingerprint, NamespaceLayout> namespaces_;  // guarded by namespaces_mu_
  std::unordered_map<NamespaceFingerprint, NamespaceDescriptor> descriptors_;  // guarded by namespaces_mu_
  // Reference tracking (engine_namespaces.cc), guarded by namespaces_mu_:
  // the namespaces each connection's Hello registered, how many
  // connections use each, those RegisterNamespace keeps for good, and
  // those no connection uses any more (forgotten once they hold no block).
  // After a sweep, unused_namespaces_ holds only namespaces with blocks;
  // the next sweep runs when it doubles (plus kUnusedNamespacesSweep).
  static constexpr size_t kUnusedNamespacesSweep = 64;
  std::unordered_map<ConnectionId, std::vector<NamespaceFingerprint>> connection_namespaces_;
  std::unordered_map<NamespaceFingerprint, uint32_t> namespace_users_;
  std::unordered_set<NamespaceFingerprint> kept_namespaces_;
  std::unordered_set<NamespaceFingerprint> unused_namespaces_;
  size_t unused_after_sweep_ = 0;
  // Ends `connection`'s use of its namespaces (CloseConnection); true when
  // enough unused ones built up that a sweep is due.
  bool ReleaseNamespaces(ConnectionId connection);
  // The tiers of the stack, top first, for enumeration (above, host, below).
  std::vector<const BlockTier*> StackTop() const;
  std::mutex io_mu_;
  std::condition_variable io_idle_;
  int64_t io_in_flight_ = 0;  // guarded by io_mu_: promotions and demotions
  std::condition_variable demotion_finished_;
  uint64_t demotions_finished_ = 0;  // guarded by io_mu_
  std::vector<std::unique_ptr<EngineShard>> shards_;
  // Queued requests by (connection, request id): the shards holding a
  // part of their chain, under the engine-wide id the policies know.
  struct QueuedRequest {
    uint64_t id = 0;
    std::vector<size_t> shards;
    NamespaceFingerprint ns;
    std::vector<BlockKey> chain;
    uint64_t start_us = 0;
  };
  std::mutex queue_mu_;
  std::map<std::pair<ConnectionId, uint64_t>, QueuedRequest> queued_;  // guarded by queue_mu_
  // What each connection holds in queued_: requests and chain keys.
  struct ConnectionQueue {
    size_t requests = 0;
    size_t keys = 0;
  };
  std::unordered_map<ConnectionId, ConnectionQueue> queued_per_connection_;  // guarded by queue_mu_
  const uint64_t layer_read_pool_bytes_;
  std::atomic<uint64_t> transient_bytes_{0};  // layer reads' arena bytes held now
  const size_t max_queued_requests_per_connection_;
  const size_t max_queued_keys_per_connection_;
  uint64_t next_queue_id_ = 1;                                      // guarded by queue_mu_
  // Promotion reads' measured throughput (prefetch plans with it).
  const double prefetch_share_;
  const uint32_t prefetch_min_blocks_;
  const bool verify_commits_;  // EngineOptions::verify_commits
  mutable std::mutex bandwidth_mu_;
  // What the lower tiers' eviction sinks call: cleared (under the unique
  // lock) before the Engine goes away, so a sink running on a tier thread
  // never reaches a destroyed Engine.
  struct SinkGate {
    std::shared_mutex mu;
    Engine* engine = nullptr;  // guarded by mu
  };
  std::shared_ptr<SinkGate> sink_gate_ = std::make_shared<SinkGate>();
  std::atomic<uint64_t> next_handle_{1};
  mutable std::mutex loads_mu_;
  // Each connection's open loads by id.
  std::unordered_map<ConnectionId, std::unordered_map<uint64_t, std::shared_ptr<LoadRecord>>> loads_;  // guarded by loads_mu_
  uint64_t next_load_ = 1;  // guarded by loads_mu_
  std::atomic<bool> prefetch_scheduled_{false};  // a plan waits on the reader
  // Operator holds by key (engine_holds.cc), their expiries in order, and
  // how often each namespace was dropped (a hold landing after a drop of
  // its namespace that began after the hold is undone).
  struct HoldRecord {
    NamespaceFingerprint ns;
    LeaseId lease = 0;
    uint64_t bytes = 0;
    uint64_t expires_us = 0;
  };
  mutable std::mutex holds_mu_;  // a leaf: nothing else is taken under it
  std::unordered_map<BlockKey, HoldRecord> holds_;                    // guarded by holds_mu_
  std::set<std::pair<uint64_t, BlockKey>> hold_expiries_;             // guarded by holds_mu_
  std::unordered_map<NamespaceFingerprint, uint64_t> hold_drops_;     // guarded by holds_mu_
  // The earliest expiry in hold_expiries_ (max: none), read without the lock.
  std::atomic<uint64_t> next_hold_expiry_us_{std::numeric_limits<uint64_t>::max()};

  // Monotonic event counters (gauges are computed from the shards).
  struct Counters {
    std::atomic<int64_t> lookups{0}, lookup_keys{0}, lookup_hit_blocks{0};
    // Per-tier views: lookups that ended before their last key (the key
    // missed in every tier), keys the host tier answered, bytes committed
    // into and pinned from the host tier.
    std::atomic<int64_t> lookup_misses{0}, host_lookup_hits{0}, host_committed_bytes{0}, host_pinned_bytes{0};
    // Prefetched blocks first used after their read ended (on time), while
    // it was still running (late), or evicted never used (unused).
    std::atomic<int64_t> prefetches_on_time{0}, prefetches_late{0}, prefetches_unused{0};
    std::atomic<int64_t> reserves{0}, reserve_failures{0};
    std::atomic<int64_t> commits{0}, commit_failures{0}, aborts{0};
    std::atomic<int64_t> pins{0}, pin_misses{0}, releases{0}, release_failures{0};
    std::atomic<int64_t> erases{0}, evictions{0}, eviction_failures{0};
    std::atomic<int64_t> connections_closed{0};
    std::atomic<int64_t> promotions{0}, promotion_failures{0}, demotions{0}, demotion_rejections{0};
    std::atomic<int64_t> demotion_failures{0}, admission_drops{0};
    std::atomic<int64_t> enqueues{0}, dequeues{0}, needed_evictions{0}, forced_demotions{0};
    std::atomic<int64_t> prefetch_plans{0}, prefetches{0}, prefetch_bytes{0}, prefetch_skipped_short{0};
    std::atomic<int64_t> layer_reads{0}, layer_reads_busy{0}, eviction_bound_hits{0};
    std::atomic<int64_t> demotion_waits{0};   // demoter waits for a busy tier below
    std::atomic<int64_t> demotions_queued{0};  // demotions a busy tier left to the demoter
    std::atomic<int64_t> demotion_busy_drops{0};  // dropped: tier busy, demoter full or wait over
    std::atomic<int64_t> promotion_retries{0}, prefetch_plans_busy{0};
    std::atomic<int64_t> demotion_corrupt{0};  // bytes changed after commit: not demoted
    // Blocks clients reported as not matching their checksums: checked,
    // confirmed and dropped, found intact (kept).
    std::atomic<int64_t> corrupt_reports{0}, corrupt_drops{0}, corrupt_reports_refuted{0};
    std::atomic<int64_t> directory_uses{0}, directory_stale_uses{0}, local_lookups{0}, bad_usage_reports{0};
    std::atomic<int64_t> chain_links{0};            // keys reserved with their chain links (lineage)
    std::atomic<int64_t> commit_checksums_sent{0};  // committed blocks whose checksum the client sent
    std::atomic<int64_t> loads{0}, load_blocks{0}, load_streamed_blocks{0}, load_layer_reads{0};
    std::atomic<int64_t> load_failed_blocks{0}, load_busy_retries{0};
    // Holds released at their expiry, ended (Unhold, drop, erase), and
    // pending ones that never landed (read failed, namespace dropped).
    std::atomic<int64_t> holds_expired{0}, holds_ended{0}, hold_failures{0};
  };
  mutable Counters counters_;

  // The movers (mover.h), declared last: destroyed first, after ~Engine
  // waited for their jobs (each counts as I/O in flight). The demoter
  // writes the demotions a busy tier could not take at once; the reader
  // retries busy promotions and runs prefetch plans. Request threads only
  // queue work for them.
  std::unique_ptr<Mover> demoter_;
  std::unique_ptr<Mover> reader_;
  // The host tier's BlockTier face (host_block_tier.h) and the mover its
  // completions run on (destroyed, so joined, before the face).
  std::unique_ptr<HostBlockTier> host_block_tier_;
  std::unique_ptr<Mover> host_io_;
  // Copies up and evictions of the tier above (when there is one); first
  // to go (joined before the rest is destroyed).
  std::unique_ptr<Mover> above_io_;
};

}  // namespace kvtier

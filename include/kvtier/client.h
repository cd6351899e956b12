// libkvtier_client: the API an inference engine links against.
// Standard library only; the wire format and internals stay private.
//
//   auto client = kvtier::Client::Connect(options);        // Hello + arena map
//   auto keys = hasher.Keys(tokens);                         // ChainHasher
//   auto hit = (*client)->Lookup(0, keys);                   // longest prefix
//   (*client)->Get(0, keys[0], dst);                         // arena -> dst
//
// Thread safety: a Client is thread-safe; any number of threads may call it
// at once and their requests are pipelined on one connection. BlockView and
// Reservation are thread-compatible (one owner at a time).
//
// Deadlines: Connect gives up after ClientOptions::connect_timeout, and every
// synchronous call after ClientOptions::call_timeout, with TimedOut. A call
// that timed out leaves the connection failed: calls still waiting get
// TimedOut as well, later calls fail at once with Unavailable (connect a new
// Client). BlockViews keep their pins and bytes even then (see BlockView).
//
// Reconnect (ClientOptions::reconnect): when kvtierd closes the connection
// (it exited, was killed or restarted), calls waiting on it get
// Unavailable, and so does every later call at once, while the Client
// reconnects on its own: the next call after a backoff (exponential with
// jitter, reconnect_min_backoff to reconnect_max_backoff) makes one attempt
// on its thread, at most connect_timeout long; other calls meanwhile do not
// wait for it. A successful attempt redoes the Hello, registers the same
// namespaces (NamespaceIds stay valid) and maps the new daemon's arena and
// directory; that call and later ones then work as before (reconnects()
// counts them). Nothing cached by the old daemon is assumed to survive.
// BlockViews, Reservations, LayerSaves and LayerLoads from before stay on
// the old connection: their bytes stay mapped (readable and writable, no
// longer the daemon's) until they are gone, and their operations return
// Unavailable (or FailedPrecondition) without reaching the new daemon.
// arena() is the new daemon's after a reconnect. A connection failed by a
// time-out is not replaced (the daemon still holds it).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/preload.h"
#include "kvtier/ready_estimate.h"
#include "kvtier/result.h"
#include "kvtier/status.h"

namespace kvtier {

// Where a copy of a block lives. Values are stable (wire and C ABI).
enum class Tier : uint8_t { kNone = 0, kHbm = 1, kHost = 2, kNvme = 3, kRemote = 4 };
std::string_view TierName(Tier tier);

// Index into ClientOptions::namespaces, in registration order.
using NamespaceId = uint32_t;

struct ClientOptions {
  std::string socket_path = "/run/kvtier/kvtierd.sock";
  std::string client_name = "kvtier-client";
  // Registered at connect; NamespaceId i refers to namespaces[i].
  std::vector<NamespaceDescriptor> namespaces;
  // Largest frame the client sends or accepts; must not exceed the daemon's.
  uint32_t max_frame_bytes = 1u << 20;
  // The uids this client accepts as its kvtierd. Connect reads the
  // listening peer's credentials (SO_PEERCRED) before it sends anything and
  // refuses any other uid with PermissionDenied, so a listener someone
  // swapped in at socket_path never sees a namespace or a byte. Empty: the
  // list in the environment variable KVTIER_TRUSTED_DAEMON_UIDS (uids or
  // user names, comma-separated) when it is set, else root, this process's
  // own uid and the user "kvtier" (the packaged service's) when it exists.
  std::vector<uint32_t> trusted_daemon_uids;
  // Longest Connect waits for the socket and the daemon's Hello answer
  // together; then it fails with TimedOut. 0 = no deadline.
  std::chrono::milliseconds connect_timeout{5000};
  // Longest a synchronous call (every call not named *Async, and
  // BlockView::Release, Reservation::Commit/Abort) waits for its answer, and
  // any request waits to be written; then it returns TimedOut and the
  // connection is failed (see "Deadlines" above). Covers the daemon's own
  // work: a Pin that promotes from NVMe, a Put that evicts. The futures of
  // *Async calls have no deadline of their own: they complete when the
  // answer comes or the connection fails. 0 = no deadline.
  std::chrono::milliseconds call_timeout{30000};
  // Check every byte a read hands out against the checksums kvtierd
  // recorded when the block was committed (xxh3-64, common/checksum.h):
  // the copies of Get/GetBatch (the whole block), the views of Pin
  // (checked in place before the view is handed out), the copies of
  // GetLayers (each layer against its own checksum, so a range verifies
  // alone) and every layer of a LayerLoad (at WaitLayer, before it is
  // handed out). A mismatch is Corruption, never the bytes: the lease is
  // released and the block reported to kvtierd (an Erase, so it leaves
  // every tier and later reads miss). Costs one hash of the bytes read
  // (about a copy's time again); off, reads cost nothing extra. Bytes that
  // change after the check (a zero-copy view is shared memory) are not
  // caught: the check is of the bytes as they were when handed out.
  bool verify_checksums = false;
  // How long a thread waiting for a response polls the socket (yielding the
  // core between polls) before it sleeps. Trades client CPU for latency: a
  // sleep and wake-up costs tens of microseconds on a VM. 0 = always sleep.
  uint32_t spin_wait_us = 50;
  // Serve Lookup and copying Get/GetBatch of host-resident blocks from the
  // daemon's block directory (read-only shared memory: no round trip) when
  // kvtierd offers one. Those reads are reported to the daemon afterwards
  // (within ~10 ms) so its eviction order and counters stay true. Zero-copy
  // Pin always goes through the daemon. false: every call uses the socket.
  bool use_directory = true;
  // Fault the arena mapping in at connect (the part kvtierd has allocated:
  // all of it unless host.allocate_at_start_bytes left some for later), so
  // no get or put pays a page fault on its hot path; it costs the connect
  // about 0.3 s per GiB of arena. false: pages fault in at first use (an
  // admin tool that never touches the arena).
  bool prefault_arena = true;
  // Reconnect on its own after kvtierd closed the connection (see
  // "Reconnect" above). false: the Client stays failed (Unavailable) and
  // the application connects a new one.
  bool reconnect = true;
  // Wait before the next reconnect attempt after a failed one: starts at
  // reconnect_min_backoff (at least 1 ms), doubles per failed attempt up to
  // reconnect_max_backoff; each wait is drawn from [wait/2, wait] (jitter,
  // so many clients of one daemon do not come back in step). The first
  // attempt after the connection broke is made at once.
  std::chrono::milliseconds reconnect_min_backoff{50};
  std::chrono::milliseconds reconnect_max_backoff{2000};
};

struct LookupResult {
  size_t prefix_blocks = 0;  // consecutive hits starting at keys[0]
  std::vector<Tier> tiers;   // tiers[i] for every i < prefix_blocks
};

struct Counter {
  std::string name;  // e.g. "engine.lookups", "host.used_bytes"
  int64_t value = 0;
};

// A namespace as the daemon holds it (Client::ListNamespaces).
struct NamespaceTierUse {
  std::string tier;  // "hbm", "host", "nvme", ...: the stack, top first
  uint64_t blocks = 0;
  uint64_t bytes = 0;  // payload bytes
};
struct NamespaceInfo {
  NamespaceFingerprint fingerprint;
  // Known when a client registered the namespace since the daemon started
  // (a namespace found only on a persistent tier after a restart is not).
  std::optional<NamespaceDescriptor> descriptor;
  std::vector<NamespaceTierUse> tiers;
  std::string tenant;  // whose it is, when kvtierd has tenants configured
};

// A block a tier holds (Client::ListBlocks, `kvtier ls --blocks`).
struct HeldBlockInfo {
  Tier tier = Tier::kNone;
  NamespaceFingerprint ns;
  BlockKey key;
  std::string tenant;  // whose it is, when kvtierd has tenants configured
};
// Where a page of Client::ListBlocksPage ended: pass it back for the next.
struct BlockListCursor {
  uint32_t view = 0;  // the tenant's index in the listing
  Tier tier = Tier::kNone;
  NamespaceFingerprint ns;
  BlockKey key;
};
struct HeldBlockPage {
  std::vector<HeldBlockInfo> blocks;    // in the listing's order (tenant, tier top first, namespace, key)
  std::optional<BlockListCursor> next;  // set: more may follow
};

// Client::Hold: one key's outcome.
struct HoldOutcome {
  Status status;
  bool pending = false;  // ok, but held only once the block lands in the host tier
};

// Client::Health: healthy unless `problems` says why not.
struct HealthReport {
  bool healthy = false;
  std::vector<std::string> problems;  // one line each
  std::vector<std::string> warnings;  // healthy, but worth a look
  std::string version;                // of kvtierd
  uint64_t uptime_s = 0;
  std::vector<std::string> tiers;  // the stack, top first
};

// Client::events_endpoints: ZeroMQ endpoints ("ipc:///run/kvtier/kvtierd-events.sock").
struct EventsEndpoints {
  std::string publish;  // the PUB socket: topic, 8-byte sequence, msgpack batch
  std::string replay;   // the ROUTER socket: replay, snapshot, estimate
};

namespace internal {
class Connection;
class DeviceLoadCopier;
class DevicePoolMapping;
class Reconnector;
}  // namespace internal

// A block pinned in the daemon's arena, readable in place without a copy.
// Move-only. Released explicitly by Release() (waits for the daemon) or on
// destruction (does not wait: the release goes out with the connection's
// next request, or within about 1 ms).
//
// data() stays valid and shows exactly the pinned block's bytes until the
// view is released or destroyed, also when it outlives its Client: a view
// shares the Client's connection and keeps it open (the Client's destructor
// does not close it), so the daemon keeps the pin, and Release() still
// reaches the daemon. The connection closes when its last view and
// Reservation are gone. If the connection fails meanwhile, Release()
// reports Unavailable; after a call timed out the daemon still holds the pin
// until the socket closes, so the bytes stay unchanged, but once the daemon
// itself has closed the connection (it exited, or cut this client off) the
// pin is gone: the bytes stay mapped, yet may change.
class BlockView {
 public:
  BlockView() = default;
  BlockView(BlockView&& other) noexcept;
  BlockView& operator=(BlockView&& other) noexcept;
  BlockView(const BlockView&) = delete;
  BlockView& operator=(const BlockView&) = delete;
  ~BlockView();

  bool valid() const { return conn_ != nullptr; }
  std::span<const std::byte> data() const { return data_; }
  const BlockKey& key() const { return key_; }
  uint64_t lease() const { return lease_; }
  uint64_t checksum() const { return checksum_; }

  // Unpins the block and waits for the daemon (at most call_timeout). Ok;
  // Unavailable if the connection failed before (the pin ends when the
  // socket closes); TimedOut. The view is empty afterwards either way.
  Status Release();

 private:
  friend class Client;
  std::shared_ptr<internal::Connection> conn_;
  std::span<const std::byte> data_;
  BlockKey key_;
  uint64_t lease_ = 0;
  uint64_t checksum_ = 0;
};

// What a put says of its keys' place in a prefix chain. The daemon keeps
// these links for its SSD admission: a block whose prefix is cached
// nowhere can never be hit, so it is not written to NVMe (queue hints give
// the same links). With `chain`, the keys are consecutive blocks of one
// chain, root first (keys[i-1] is keys[i]'s parent); `parent` is the block
// before keys[0] (e.g. the last block of the cached prefix a prefill
// extended), if any.
struct ChainLinks {
  bool chain = false;
  std::optional<BlockKey> parent;
};

// One writable arena span handed out by Client::Reserve.
struct WritableBlock {
  BlockKey key;
  // Ok: write exactly data.size() bytes, then Commit. AlreadyExists: the block
  // is cached or being written by someone else; skip it. NoSpace/other: failed.
  Status status;
  std::span<std::byte> data;
  // Optional: the xxh3-64 (seed 0) of the bytes written, the value
  // BlockView::checksum() reports. Set on every ok block of a Reservation,
  // Commit sends them and the daemon records them instead of reading every
  // block once more to hash it; set on none (or not on all), the daemon
  // hashes. A wrong value fails that block's Commit with Corruption when the
  // daemon verifies commits (host.verify_commits); otherwise the block is
  // kept with it, and readers that verify checksums, and NVMe demotion,
  // treat the block as corrupt (a miss).
  std::optional<uint64_t> checksum;
  // Optional: the xxh3-64 of each layer of a whole block of the namespace
  // (layer_count > 1: layer l is data[l * layer_bytes, (l + 1) *
  // layer_bytes)), recorded as sent so that verifying layer reads check
  // each layer alone. Sent when every ok block of several layers has them
  // (layer_count each), else none; a wrong value makes verifying layer
  // reads of that layer fail (Corruption). Copying puts and layer-wise
  // saves of a client with verify_checksums fill them.
  std::vector<uint64_t> layer_checksums;
};

// Arena spans reserved for a batch of blocks. Nothing is visible to readers
// until Commit; destroying an uncommitted Reservation aborts it (the space
// returns). Move-only. Like a BlockView it keeps its connection open, so it
// can still be written and committed after its Client is destroyed.
class Reservation {
 public:
  Reservation() = default;
  Reservation(Reservation&&) noexcept;
  Reservation& operator=(Reservation&&) noexcept;
  Reservation(const Reservation&) = delete;
  Reservation& operator=(const Reservation&) = delete;
  ~Reservation();

  std::vector<WritableBlock>& blocks() { return blocks_; }
  const std::vector<WritableBlock>& blocks() const { return blocks_; }

  // Makes every block with an ok status visible atomically per block; the
  // daemon checks sizes and records checksums. Returns one Status per block
  // (AlreadyExists/NoSpace from Reserve are passed through unchanged).
  // Unavailable if the connection is gone. Precondition: not yet committed.
  std::vector<Status> Commit();
  // Returns the reserved space without publishing anything.
  Status Abort();

 private:
  friend class Client;
  friend class LayerSave;
  std::shared_ptr<internal::Connection> conn_;
  NamespaceId ns_ = 0;
  std::vector<WritableBlock> blocks_;
  bool done_ = false;
};

// A prefix saved layer by layer while the engine computes its later
// layers (Client::BeginSave). Every block is a whole block of its
// namespace, laid out layer-major: layer l of block i is LayerSpan(i, l),
// layer_bytes() long, in the arena. A layer is written either by SaveLayer
// (one copy per block) or in place through LayerSpan and then declared
// with LayerWritten. FinishSave commits every block in one request once
// every layer is in. Until then nothing of the prefix is visible; a save
// destroyed or aborted before FinishSave, or whose connection ends first
// (an engine crash), leaves nothing behind and its space is returned.
// Not thread-safe.
class LayerSave {
 public:
  LayerSave() = default;
  LayerSave(LayerSave&&) noexcept = default;
  LayerSave& operator=(LayerSave&&) noexcept = default;

  size_t size() const { return blocks_; }
  uint32_t layer_count() const { return layers_; }
  uint64_t layer_bytes() const { return layer_bytes_; }
  // Block i's reservation: Ok (to be written), AlreadyExists (cached, or
  // being written by someone else: skipped), or why it failed (NoSpace).
  Status status(size_t block) const;
  // Layer `layer` of block `block` in the arena, writable until FinishSave
  // or Abort; empty for a block that is not Ok or an index out of range.
  std::span<std::byte> LayerSpan(size_t block, uint32_t layer);
  // Copies src[i] into layer `layer` of every Ok block i (src has size()
  // spans of layer_bytes(); those of blocks not Ok are not read). With
  // verify_checksums the copy also takes each layer's checksum, and
  // LayerWritten hashes the layer in place; FinishSave sends them (so
  // verifying layer reads check each layer alone).
  // InvalidArgument for a layer out of range or a span of another size;
  // FailedPrecondition once finished or aborted.
  Status SaveLayer(uint32_t layer, std::span<const std::span<const std::byte>> src);
  // Layer `layer` was written in place (LayerSpan) in every Ok block.
  Status LayerWritten(uint32_t layer);
  // Layers saved or declared written so far.
  uint32_t layers_saved() const;
  // Publishes the saved layers to this node's peers as they are saved,
  // before FinishSave commits the blocks: each time layers [0, n) of the
  // save are complete (SaveLayer or LayerWritten), their checksums go to
  // kvtierd in one message the call does not wait for, and a node
  // reading this prefix through its peer tier (docs/OPERATIONS.md, "Peer
  // tier") may read those layers, each verified, while later ones are
  // still computed: a prefill node hands its KV to a decode node layer by
  // layer. Layers saved before the call are published at once. Nothing
  // becomes visible on this node before FinishSave. Costs a hash of each
  // layer. `free_when_taken`: the save is a hand-off (a prefill node's, for
  // one decode node): once a peer has read a block whole, every layer
  // verified, the block leaves this node's tiers (at its commit at the
  // latest; not the shared remote pool); the first call decides it, a
  // later call asking otherwise is InvalidArgument. FailedPrecondition once
  // finished or aborted.
  Status PublishToPeers(bool free_when_taken = false);
  // Commits every Ok block in one request (the daemon checksums each);
  // one Status per block as Reservation::Commit. FailedPrecondition, with
  // nothing committed and the save still open, while a layer is missing;
  // FailedPrecondition once finished or aborted.
  Result<std::vector<Status>> FinishSave();
  // Returns the space without publishing anything.
  Status Abort();

 private:
  friend class Client;
  Reservation reservation_;
  size_t blocks_ = 0;
  uint32_t layers_ = 0;
  uint64_t layer_bytes_ = 0;
  std::vector<bool> saved_;
  bool ended_ = false;
  // ClientOptions::verify_checksums or PublishToPeers: each layer's
  // checksum is taken as it is saved (WritableBlock::layer_checksums).
  bool layer_sums_ = false;
  bool publish_ = false;          // PublishToPeers
  bool free_when_taken_ = false;  // PublishToPeers(true): a hand-off
  uint32_t published_ = 0;        // layers [0, published_) were published
  // Sends what is newly complete of layers [0, n) (PublishToPeers).
  void PublishSaved();
};

// How a layer-wise load hands its layers over (Client::BeginLoad).
struct LoadOptions {
  // Empty: zero-copy; read each layer in the arena through
  // LayerLoad::LayerSpan. Otherwise one host buffer per key, each at least
  // a whole block: WaitLayer(l) copies layer l of every block that has
  // not failed into dst[i] at l * layer_bytes().
  std::vector<std::span<std::byte>> dst;
  // GPU destinations (libkvtier_client built with CUDA; else BeginLoad is
  // Unimplemented): one device pointer per key on device
  // `device_ordinal`, each with room for a whole block. WaitLayer(l)
  // waits until layer l is in the arena, enqueues its host-to-device
  // copies (DMA: the client registers the arena with CUDA once per
  // connection) on the load's own copy stream, records that layer's
  // event and makes `cuda_stream` (a cudaStream_t; null: the legacy
  // default stream) wait for it on the GPU; it returns without waiting
  // for the copy. Not with `dst`. End() waits for the copies in flight
  // (the arena's bytes may be reused once the pins go).
  // When the daemon runs an HBM tier whose device pool is on this GPU
  // (the same PCI bus id as `device_ordinal`), the client maps the pool
  // once per connection (CUDA IPC) and the blocks held there are copied
  // device to device from it instead of through the arena; they are
  // whole at once (status Ok, counted as loaded) but have no arena bytes
  // (TryLayerSpan: FailedPrecondition). If the pool cannot be mapped the
  // load goes through the arena as above.
  std::vector<void*> device_dst;
  void* cuda_stream = nullptr;
  int device_ordinal = 0;
  // The new tokens' compute time per layer, in microseconds. > 0: the
  // daemon plans the buffer depth for this load (LayerLoad::plan()) from
  // the load's source tier's measured bandwidth (kvtier/preload.h).
  double compute_us_per_layer = 0;
  // BeginLoad returns only once the plan's layers_to_preload layers are in
  // place (needs compute_us_per_layer > 0), so the engine starts computing
  // exactly when it will not stall (beyond the plan's expected stall).
  bool wait_for_depth = false;
  // Recomputing the whole prefix, per layer, in microseconds (as
  // PlanPreload's); 0: unknown. Sets the default deadline.
  double recompute_us_per_layer = 0;
  // How long after BeginLoad the load may take. kvtierd fails at once
  // (TimedOut in BeginLoad's answer, never read) each block below the host
  // tier that its estimate says cannot be in host memory by then: its
  // tier's median recent read rate, behind the reads queued there and the
  // load's earlier blocks from that tier. Once the deadline passes, a
  // WaitLayer that would wait fails every block not yet whole with TimedOut
  // (the engine recomputes those; the others are served as usual) and
  // returns, and no later WaitLayer waits. 0: layer_count() x
  // recompute_us_per_layer when that is > 0 (past it, recomputing would
  // have been faster), else none (each wait is bounded by call_timeout
  // only).
  std::chrono::microseconds deadline{0};
};

// A prefix loading layer by layer (Client::BeginLoad): the daemon pins
// every block for the load and reads the blocks held below the host tier
// in layer order across the blocks (layer 0 of every block first), so the
// engine computes layer 0 while later layers arrive. Readiness is read
// from shared memory (a load board the daemon updates): waiting for a
// layer that is in place costs a memory read, and a wait sleeps on a futex
// the daemon wakes, never a round trip.
//
// A block that fails (a miss, a read error, a checksum mismatch) fails
// alone; the others keep loading. With ClientOptions::verify_checksums,
// WaitLayer(l) also checks layer l of every block against its checksum
// (in the destination buffer in copy mode, in the arena otherwise, before
// a device copy reads it): a block that does not match fails with
// Corruption (reported to kvtierd, later reads miss), and LayerSpan hands
// out only layers so checked. Blocks the daemon hands over in its device
// memory (LoadOptions::device_dst from the HBM tier) are not checked. The engine recomputes the failed ones;
// the prefix is usable as cached KV up to its first failed block
// (usable_prefix()). Bytes of a failed block must not be used, including
// layers it had before it failed.
//
// End() (or the destructor) lets the pins go: spans from LayerSpan are
// valid until then. Move-only, not thread-safe (one engine thread drives
// it). Like a BlockView it keeps its connection open.
class LayerLoad {
 public:
  LayerLoad() = default;
  LayerLoad(LayerLoad&& other) noexcept;
  LayerLoad& operator=(LayerLoad&& other) noexcept;
  LayerLoad(const LayerLoad&) = delete;
  LayerLoad& operator=(const LayerLoad&) = delete;
  ~LayerLoad();  // ends the load without waiting for the daemon

  size_t size() const { return initial_.size(); }
  uint32_t layer_count() const { return layers_; }
  uint64_t layer_bytes() const { return layer_bytes_; }
  // The slowest tier a block is read from (kHost: all were host hits).
  Tier source() const { return source_; }
  // The buffer depth plan, when LoadOptions::compute_us_per_layer > 0.
  const std::optional<PreloadPlan>& plan() const { return plan_; }

  // Layers in place in every block that has not failed (a memory read).
  uint32_t layers_ready() const;
  // Block i: Ok while it loads and once loaded; else why it failed
  // (NotFound, IoError, Corruption, NoSpace, InvalidArgument: not a whole
  // block of the namespace; with verify_checksums also Corruption once a
  // layer did not match, Unimplemented when kvtierd had no layer checksums
  // for it). A block the daemon hands over in its device
  // memory (LoadOptions::device_dst) is Ok: whole at once. ProtocolError
  // when the board contradicts the load (the block is not used).
  // InvalidArgument for an index out of range.
  Status status(size_t block) const;
  // Whether every block is loaded or failed.
  bool done() const;
  // Blocks from keys[0] on before the first failed one. Final once
  // WaitAll returned (a block may still fail until its last layer is in).
  size_t usable_prefix() const;

  // Returns once layer `layer` is in place in every block that has not
  // failed (copied into LoadOptions::dst in copy mode, with any earlier
  // layer not copied yet), or once the load's deadline passed
  // (LoadOptions::deadline: the blocks not whole then fail with TimedOut).
  // Ok; InvalidArgument (no such layer);
  // TimedOut after ClientOptions::call_timeout (no request is in flight,
  // so unlike a call's time-out this fails nothing: the load goes on and
  // may be waited for again); Unavailable when the connection failed or
  // the daemon hung up; FailedPrecondition after End.
  Status WaitLayer(uint32_t layer);
  // WaitLayer of the last layer: every block loaded or failed.
  Status WaitAll();
  // Zero-copy: layer `layer` of block `block` in the arena. Valid after
  // WaitLayer(layer) returned Ok, while status(block) is Ok, until End.
  // Empty for a failed block, a layer not ready, indices out of range, or
  // a block in the daemon's device memory (TryLayerSpan says which).
  std::span<const std::byte> LayerSpan(size_t block, uint32_t layer) const;
  // LayerSpan with the reason when there is no span: InvalidArgument
  // (indices out of range), NotFound (the block failed, or the layer is
  // not in place yet, or with verify_checksums not yet checked by a
  // WaitLayer), FailedPrecondition (after End; or the block is in
  // the daemon's device memory, a load with device_dst from the HBM tier:
  // its bytes reach the device buffers only), ProtocolError (the board
  // names memory outside the arena).
  Result<std::span<const std::byte>> TryLayerSpan(size_t block, uint32_t layer) const;

  // Ends the load: the daemon drops its pins and its board. Waits for the
  // answer (at most call_timeout). Ok; Unavailable if the connection
  // failed (the pins ended with it). Idempotent.
  Status End();

 private:
  friend class Client;
  // Enqueues the device copies of the layers up to `layer` not yet
  // enqueued, then makes the caller's stream wait for `layer`.
  Status EnqueueDeviceCopies(uint32_t layer);
  // verify_: checks layers up to `layer` not yet checked in every block
  // that has not failed (in dst_ in copy mode, else in the arena).
  void VerifyLayers(uint32_t layer);
  // TryLayerSpan without the verification state (what WaitLayer copies
  // and checks).
  Result<std::span<const std::byte>> ArenaLayer(size_t block, uint32_t layer) const;
  std::shared_ptr<internal::Connection> conn_;
  uint64_t id_ = 0;
  std::byte* board_ = nullptr;  // the load board in the arena mapping
  uint32_t layers_ = 0;
  uint64_t layer_bytes_ = 0;
  std::vector<Status> initial_;  // the daemon's answer per key
  std::vector<std::span<std::byte>> dst_;
  std::vector<void*> device_dst_;
  void* cuda_stream_ = nullptr;
  std::shared_ptr<internal::DeviceLoadCopier> device_copier_;  // with device_dst_
  // The connection's mapping of the daemon's device pool (owned by conn_,
  // which outlives the copies) when this load asked for kInDevice blocks.
  const internal::DevicePoolMapping* device_pool_ = nullptr;
  std::vector<bool> copied_;  // copy modes: layers copied (or enqueued) into dst_ / device_dst_
  Tier source_ = Tier::kNone;
  std::optional<PreloadPlan> plan_;
  bool ended_ = false;
  // LoadOptions::deadline from BeginLoad (max: none); once it passed,
  // late_ is set and the blocks then loading have failed (initial_).
  std::chrono::steady_clock::time_point deadline_ = std::chrono::steady_clock::time_point::max();
  bool late_ = false;
  // Fails every block still loading with TimedOut (the deadline passed).
  void FailLateBlocks();
  // ClientOptions::verify_checksums: every layer is checked before it is
  // handed out (WaitLayer), against the checksums of the answer (blocks
  // settled at once) or of the board's table (the others).
  bool verify_ = false;
  NamespaceId ns_ = 0;
  std::vector<BlockKey> keys_;                          // with verify_: to report a bad block
  std::vector<std::vector<uint64_t>> layer_checksums_;  // per block from the answer; empty: the board's
  // Per block settled at once without layer checksums: its checksum, and
  // whether the whole block was checked (at the first WaitLayer).
  std::vector<std::optional<uint64_t>> block_checksums_;
  std::vector<bool> block_checked_;
  std::vector<Status> verdicts_;  // per block: Corruption once a layer did not match
  std::vector<bool> verified_;    // per layer: checked in every block
};

class Client {
 public:
  // Connects, checks the protocol version, registers options.namespaces and
  // maps the daemon's arena. Unavailable if no daemon listens at the path,
  // TimedOut if the daemon does not answer Hello within connect_timeout,
  // ProtocolError for a malformed answer (e.g. a frame over
  // max_frame_bytes), VersionMismatch, InvalidArgument for a bad
  // descriptor, IoError.
  static Result<std::unique_ptr<Client>> Connect(const ClientOptions& options);

  // Lets go of the connection. It is closed (pending *Async calls fail with
  // Unavailable, the daemon drops this client's queued requests) at once if
  // no BlockView or Reservation of this Client is alive, else when the last
  // of them is released; until then their pins and reservations stay held
  // and pending *Async calls complete normally. Must not race with calls on
  // this Client.
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // The namespace fingerprints, as computed by the daemon, by NamespaceId.
  const std::vector<NamespaceFingerprint>& namespaces() const;

  // Where the daemon publishes this caller's KV events (its tenant's, with
  // tenants): BlockStored/BlockRemoved/AllBlocksCleared per tier over
  // ZeroMQ, docs/OPERATIONS.md "KV events". Both empty when events are off.
  EventsEndpoints events_endpoints() const;

  // The whole arena mapping, for one cudaHostRegister at start-up. After a
  // reconnect it is the new daemon's arena (the old one stays mapped only
  // while handles from before use it): register it again when
  // reconnects() changed.
  std::span<std::byte> arena() const;

  // How many times this Client reconnected after kvtierd closed the
  // connection (ClientOptions::reconnect); 0 until the first time.
  uint64_t reconnects() const;

  // Longest cached prefix of `keys` and the tier of each hit block: the
  // fastest tier holding it, except that a lookup answered from the block
  // directory (ClientOptions::use_directory) reports kHost for a block in
  // both the host and the HBM tier (the directory knows host blocks only;
  // a load into GPU memory still gets such a block from HBM).
  Result<LookupResult> Lookup(NamespaceId ns, std::span<const BlockKey> keys);
  std::future<Result<LookupResult>> LookupAsync(NamespaceId ns, std::vector<BlockKey> keys);

  // Copies `data` into the arena and publishes it. Ok also when the block was
  // already cached (puts are idempotent). NoSpace when nothing can be evicted.
  // The copy computes the block's checksum as it goes (the daemon records
  // it; see WritableBlock::checksum). Corruption only when the arena bytes
  // changed under the copy (the daemon verifies commits and they differ).
  Status Put(NamespaceId ns, const BlockKey& key, std::span<const std::byte> data);
  // One Status per key, same semantics as Put. `data[i]` belongs to keys[i].
  // `links`: see ChainLinks (an engine storing a prefix after prefill says so).
  std::vector<Status> PutBatch(NamespaceId ns, std::span<const BlockKey> keys,
                               std::span<const std::span<const std::byte>> data, const ChainLinks& links = {});
  // `data` spans are borrowed until the future is ready.
  std::future<std::vector<Status>> PutBatchAsync(NamespaceId ns, std::vector<BlockKey> keys,
                                                 std::vector<std::span<const std::byte>> data, ChainLinks links = {});

  // Zero-copy put: reserves arena space the caller writes in place.
  Result<Reservation> Reserve(NamespaceId ns, std::span<const BlockKey> keys, std::span<const uint64_t> sizes,
                              const ChainLinks& links = {});
  // Preload planning for layer-wise loading from `source` (host, nvme,
  // remote): how many layers of a prefix with `bytes_per_layer` per layer
  // (all its blocks) to hold before computing the new tokens, whose
  // compute takes `compute_us_per_layer` a layer (kvtier/preload.h). The
  // daemon plans with the tier's measured read bandwidth (a low
  // percentile). `recompute_us_per_layer` (0: unknown), recomputing the
  // prefix a layer, gives the recompute-instead verdict. InvalidArgument
  // for no layers or bytes or a bad time; NotFound without such a tier.
  Result<PreloadPlan> PlanPreload(Tier source, uint64_t bytes_per_layer, double compute_us_per_layer, uint32_t layers,
                                  double recompute_us_per_layer = 0);
  // When the longest cached prefix of `keys` (root first) can be in host
  // and in GPU memory, with each block's tier and each tier's share (the
  // model: kvtier/ready_estimate.h): R for a router's max(Q, R) + C. One
  // round trip; the daemon does no I/O for it. InvalidArgument for an
  // unknown `ns` or more keys than a layer-wise load takes (65,536).
  Result<ReadyEstimate> EstimateReady(NamespaceId ns, std::span<const BlockKey> keys);
  // Layer-wise save (LayerSave): reserves a whole block of the namespace
  // for each key, root first. Errors as Reserve; per-block outcomes in the
  // LayerSave.
  Result<LayerSave> BeginSave(NamespaceId ns, std::span<const BlockKey> keys, const ChainLinks& links = {});

  // Layer-wise load of the prefix `keys` (root first; whole blocks of the
  // namespace): see LayerLoad. One round trip; blocks held below the host
  // tier are promoted into it as they load. Per-block outcomes are in the
  // LayerLoad. InvalidArgument (no keys, dst of the wrong count or too
  // small, wait_for_depth without a compute time), Busy (64 loads open on
  // this connection), and the connection's errors.
  Result<LayerLoad> BeginLoad(NamespaceId ns, std::span<const BlockKey> keys, LoadOptions options = {});

  // Copies the block into `dst` and returns its length: from the block
  // directory when the block is in the host tier (no round trip), else one
  // round trip (the pin is released like a destroyed BlockView's, and an
  // NVMe-resident block is promoted to the host tier). NotFound on a miss;
  // InvalidArgument if `dst` is smaller than the block; Corruption if
  // verify_checksums is on and the bytes do not match (`dst` then holds
  // bytes that must not be used; the block is reported, later reads miss).
  // Without verify_checksums the bytes are copied as they are.
  Result<size_t> Get(NamespaceId ns, const BlockKey& key, std::span<std::byte> dst);
  std::vector<Result<size_t>> GetBatch(NamespaceId ns, std::span<const BlockKey> keys,
                                       std::span<const std::span<std::byte>> dst);
  // `dst` spans are borrowed until the future is ready.
  std::future<std::vector<Result<size_t>>> GetBatchAsync(NamespaceId ns, std::vector<BlockKey> keys,
                                                         std::vector<std::span<std::byte>> dst);

  // Copies layers [first_layer, last_layer) of each block into dst[i]
  // (layer-wise loading). A block of the namespace's block size is
  // layer-major with the namespace's layer_count equal layers; a block of
  // any other size is one layer. Only those bytes move: from the arena for
  // host blocks, and only those layers are read from NVMe (the block is not
  // promoted). Per key: the bytes copied; NotFound; InvalidArgument (empty
  // range, layers outside the block, `dst[i]` too small). With
  // verify_checksums each layer copied is checked against its own
  // checksum (recorded at commit, or by the NVMe tier for a block read
  // from it): Corruption when one does not match (reported, later reads
  // miss), Unimplemented when kvtierd sent no layer checksums (an older
  // one). A verified read of part of a block goes to the daemon even when
  // the block directory holds it (the directory has whole-block checksums
  // only).
  std::vector<Result<size_t>> GetLayers(NamespaceId ns, std::span<const BlockKey> keys, uint32_t first_layer,
                                        uint32_t last_layer, std::span<const std::span<std::byte>> dst);

  // Zero-copy get: one view per key, or the per-key error (NotFound...).
  // With verify_checksums a view's bytes are checked against its checksum
  // before it is handed out: Corruption for a block that does not match
  // (its pin is released and it is reported: later reads miss).
  std::vector<Result<BlockView>> Pin(NamespaceId ns, std::span<const BlockKey> keys);
  // Low-level unpin of a lease from Pin. NotFound if unknown or already
  // released; PermissionDenied if another connection holds it. Goes to the
  // current connection: a lease taken before a reconnect (reconnects()
  // changed since) names nothing there (kvtierd starts its lease numbers
  // at a random point each start) and is NotFound; BlockView::Release
  // ends it with its own connection.
  Status Release(uint64_t lease);

  // Removes blocks; returns how many were cached. Pinned blocks disappear
  // from lookups at once and are freed when their last lease is released.
  Result<size_t> Erase(NamespaceId ns, std::span<const BlockKey> keys);

  // Every counter of the daemon (the same registry the admin tools read).
  Result<std::vector<Counter>> Stats();

  // Operations (the `kvtier` admin commands; client_lib/admin.cc).
  // Every namespace with a block in some tier or registered since the
  // daemon started, with its blocks and bytes per tier.
  Result<std::vector<NamespaceInfo>> ListNamespaces();
  // Every block every tier holds (the caller's tenant's, or every tenant's
  // for an operator), in the order (tenant, tier top first, namespace,
  // key). ListBlocksPage asks one page: at most `limit` blocks after
  // `after` (none: from the start; limit 0: the daemon's default, 4096, also
  // its most). ListBlocks asks page after page of `page_limit`. Pages are
  // not one atomic snapshot: a block stored or removed meanwhile may be
  // missed or listed, none twice.
  Result<HeldBlockPage> ListBlocksPage(const std::optional<BlockListCursor>& after, uint32_t limit = 0);
  Result<std::vector<HeldBlockInfo>> ListBlocks(uint32_t page_limit = 0);
  // Removes namespaces from every tier (the NVMe index included): those in
  // `fingerprints`, plus every registered namespace of `model_id` (of
  // `model_revision`, or of all its revisions when that is empty). Returns
  // what each held per tier. InvalidArgument when nothing is named.
  Result<std::vector<NamespaceInfo>> DropNamespaces(std::span<const NamespaceFingerprint> fingerprints,
                                                    std::string_view model_id = {},
                                                    std::string_view model_revision = {});
  // Operator holds (`kvtier pin` / `unpin`): keeps `keys` of namespace
  // `fingerprint` in the daemon's host tier, never evicted, for `ttl` from
  // now (1 ms to 30 days), reading blocks held only below it into it
  // first. Holding a held key again gives it the new expiry. Per key, in
  // order: ok (held, or `pending`: on its way into the host tier and held
  // once it lands), NotFound (cached in no tier), NoSpace, Busy. The call
  // fails with InvalidArgument for no keys or a TTL out of range.
  // Unhold ends holds: per key ok, or NotFound (not held, or expired).
  Result<std::vector<HoldOutcome>> Hold(const NamespaceFingerprint& fingerprint, std::span<const BlockKey> keys,
                                        std::chrono::milliseconds ttl);
  Result<std::vector<Status>> Unhold(const NamespaceFingerprint& fingerprint, std::span<const BlockKey> keys);
  // The daemon's running configuration as TOML (every option).
  Result<std::string> RunningConfig();
  // Whether the daemon serves normally, and why not.
  Result<HealthReport> Health();

  // Queue hints from the inference engine's scheduler, so the daemon keeps
  // what queued requests need (eviction `queue_aware`) and knows which
  // conversations ended. Each is one round trip. Request ids are this
  // client's own; its queued requests go when it disconnects.
  //
  // `request` will need the chain `keys` (root first) of `ns`, expected to
  // start at `expected_start` (a time in the past means "now"), in
  // conversation `session` (0: none). Again with the same id replaces it.
  // InvalidArgument (no keys, bad namespace), Busy (the daemon holds
  // 65536 queued requests, or this client 8192 requests or 2^20 keys: let
  // some leave the queue first). An expected start more than an hour away
  // counts as an hour.
  Status Enqueue(uint64_t request, NamespaceId ns, std::span<const BlockKey> keys,
                 std::chrono::steady_clock::time_point expected_start, uint64_t session = 0);
  // The same, expected to start `start_in` after the daemon receives the
  // hint (negative: now): what a caller sends whose times are not this
  // machine's steady clock (a replay on a trace's clock).
  Status Enqueue(uint64_t request, NamespaceId ns, std::span<const BlockKey> keys, std::chrono::microseconds start_in,
                 uint64_t session = 0);
  // The request left the queue: it started running, or finished (or was
  // dropped) without starting. NotFound if it is not queued.
  Status Started(uint64_t request);
  Status Finished(uint64_t request);
  // A conversation opened (again) or closed: while closed, its blocks are
  // the first to go among those no queued request needs. Session 0 is
  // InvalidArgument.
  Status OpenSession(uint64_t session);
  Status CloseSession(uint64_t session);

 private:
  explicit Client(std::unique_ptr<internal::Reconnector> link);
  // The connection for a call now (may reconnect first; see "Reconnect").
  std::shared_ptr<internal::Connection> Current();
  std::unique_ptr<internal::Reconnector> link_;
};

}  // namespace kvtier

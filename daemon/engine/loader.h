// Loader: the layer-wise loads (Engine::BeginLoad, EndLoad) as the engine
// runs them: each load's record and board (load_table.h,
// common/load_board.h), the blocks it holds in place in the tier above,
// its pins, and the board's words for each block as it resolves.
//
// Begin pins every key for the load and answers at once with a board in
// the arena, which the client reads without asking. Blocks found only
// below the host tier are streamed into the arena in layer order across
// the blocks (layer 0 of every block first: the LayerStreamer,
// layer_streamer.h), so the client computes on early layers while later
// ones arrive. A streamed block is a promotion: once its last layer lands
// it is committed in the host tier (later pins wait for it meanwhile).
// Blocks are whole blocks of the namespace's registered layout.
//
// - The pins go through Hooks::claim as a Pin's do (host hits pinned at
//   once, blocks being promoted or demoted waited for, blocks found only
//   below claimed for promotion); blocks claimed of the load's layout are
//   streamed (Hooks::stream), the others promoted whole (Hooks::promote)
//   and fail with InvalidArgument once pinned, as a block of another size
//   settled at once does. A block failed for any reason fails alone
//   (engine.load_failed_blocks); the others go on.
// - In place (`in_place`, and the engine has a tier above: Hooks::
//   hold_above set): a block held there with the namespace's layout is not
//   copied; the board says kInDevice with its offset in that memory, held
//   until the load ends. The others load as above and, once loaded, are
//   offered to the tier above (Hooks::offer_above).
// - Verify (`verify`, the client checks every layer it reads): the board
//   has the layer checksum table (LoadBoardBytes with layers); the layer
//   checksums of each block that lands later are written there before any
//   of its layers counts as in place (a block read from below always has
//   them; one that lands without fails with Unimplemented), and
//   LoadStart::layer_checksums has those of the blocks settled at once.
//
// - A deadline (`deadline_us`, Hooks::late set): the blocks found below
//   that the ready estimate says cannot be in host memory by then fail at
//   once with TimedOut and are not read, so the engine recomputes them
//   without waiting (engine.load_late_blocks, among the failed ones).
//
// Counters engine.loads, engine.load_blocks, engine.load_failed_blocks, engine.load_late_blocks;
// OpenCount is the engine.loads_open gauge.
//
// Thread-safe, no thread of its own: Begin and End run on request
// threads, a block's resolution on whichever thread ended its pin (a
// tier's completion thread, the retry scheduler's), with no shard lock
// held. Its locks are LoadTable's and each LoadRecord's, leaves: no hook
// runs under either (the claim and release hooks take shard locks, one
// at a time; the LayerStreamer takes a record's lock alone).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "daemon/engine/engine_counters.h"
#include "daemon/engine/engine_levels.h"
#include "daemon/engine/engine_types.h"
#include "daemon/engine/load_table.h"
#include "kvtier/block_key.h"
#include "kvtier/result.h"
#include "tiers/host/host_tier.h"
#include "tiers/tier.h"

namespace kvtier {

struct PinBatch;

class Loader {
 public:
  struct Hooks {
    // `bytes` of arena space for a board, evicting to make room
    // (Evictor::Allocate); NoSpace when there is none.
    std::function<Result<HostTier::Extent>(uint64_t bytes)> allocate;
    // The layout registered for `ns`, if any (NamespaceRegistry::Layout).
    std::function<std::optional<NamespaceLayout>(const NamespaceFingerprint& ns)> layout;
    // Pins every key of `keys` for `batch` (whole blocks; `batch->
    // with_layers` for a load that verifies), as a Pin claims them
    // (Engine::ProbeUnknown, then ClaimPins): settles what it can in
    // batch->grants, marks the others in batch->waiting (adding each to
    // batch->outstanding; they resolve later through batch->on_resolve,
    // on any thread), and returns the blocks it claimed for promotion,
    // which the Loader starts. Called with no lock held.
    std::function<PinClaims(const std::shared_ptr<PinBatch>& batch, const NamespaceFingerprint& ns,
                            std::span<const BlockKey> keys)>
        claim;
    // How clients name the tier at `level` of a Located (TierLevel::reported).
    std::function<Tier(size_t level)> reported;
    // Starts the whole-block promotion of claimed `key` (Promoter::Promote).
    std::function<void(const BlockKey& key, const Located& from)> promote;
    // Streams claimed blocks of the load's layout (LayerStreamer::Start).
    std::function<void(const std::shared_ptr<LoadRecord>& load, std::span<const PinClaim> claims)> stream;
    // Ends leases of `connection` (Engine::Release).
    std::function<void(ConnectionId connection, std::span<const LeaseId> leases)> release;
    // Runs at the end of each Begin, after every claim started: a pin may
    // have used a prefetched block (Prefetcher::TakeUse). May be empty.
    std::function<void()> pinned;
    // The tier above the host (AboveMover::Hold, ReleaseHold, Offer); all
    // empty when the engine has none (then no load is in place).
    std::function<std::optional<BlockTier::InPlace>(const NamespaceFingerprint& ns, const BlockKey& key,
                                                    uint32_t layer_count, uint64_t payload_bytes)>
        hold_above;
    std::function<void(const BlockKey& key, uint64_t offset)> release_above;
    std::function<void(const NamespaceFingerprint& ns, const BlockKey& key)> offer_above;
    // Per key of `keys` of `ns`: whether it cannot be in host memory
    // within `budget_us` from now (ReadyEstimator::Late). May be empty
    // (then no block is late).
    std::function<std::vector<bool>(const NamespaceFingerprint& ns, std::span<const BlockKey> keys, double budget_us)>
        late;
  };
  using LoadStart = EngineLoadStart;
  static constexpr size_t kMaxLoadsPerConnection = 64;
  static constexpr size_t kMaxLoadBlocks = size_t{1} << 16;

  // `host` (the arena the boards are in) and `counters` are borrowed and
  // outlive the Loader.
  Loader(HostTier& host, EngineCounters& counters, Hooks hooks);
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // Begins a load of `keys` of `ns` for `connection` (see above).
  // InvalidArgument (no keys, more than kMaxLoadBlocks, a namespace
  // without a layout), Busy (the connection holds kMaxLoadsPerConnection
  // loads), NoSpace (no room for the board). Otherwise per key Ok (loaded,
  // in place or loading: see the board) or why it will not load (TimedOut:
  // it cannot arrive by flags.deadline_us).
  Result<LoadStart> Begin(ConnectionId connection, const NamespaceFingerprint& ns, std::span<const BlockKey> keys,
                          LoadFlags flags);
  // Ends a load: its pins and holds above go at once, its board once no
  // read of it is in flight (the client must not read the board
  // afterwards); a pin that lands later is released as it lands. NotFound
  // for a load this connection does not hold.
  Status End(ConnectionId connection, uint64_t load);
  // Ends every load of `connection` (CloseConnection).
  void EndAll(ConnectionId connection);
  // Loads open (or opening) on every connection.
  int64_t OpenCount() const { return loads_.OpenCount(); }

 private:
  // Block `index` of `load` resolved (pinned for it, or failed): the board
  // says so, and a pin that came after End is released; `at_once`:
  // settled in Begin itself (its checksums go in the answer). No lock held.
  void Resolved(const std::shared_ptr<LoadRecord>& load, size_t index, const PinGrant& grant, bool at_once);
  // Frees `load`'s board once it ended and no block is unresolved.
  void FreeBoardIfDone(const std::shared_ptr<LoadRecord>& load);
  // Opens `load`'s record and board for `n` blocks (a slot in loads_);
  // returns the board's extent. Busy or NoSpace as Begin says.
  Result<HostTier::Extent> Open(const std::shared_ptr<LoadRecord>& load, size_t n);

  HostTier& host_;
  EngineCounters& counters_;
  const Hooks hooks_;
  LoadTable loads_{kMaxLoadsPerConnection};  // each connection's open loads
};

}  // namespace kvtier

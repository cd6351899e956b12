// LayerStreamer: reads the blocks a layer-wise load promotes (Engine::
// BeginLoad) from the tiers below layer by layer, so that a load's early
// layers are in place in every block before its later ones.
//
// Start allocates every claimed block's arena extent up front (its offset
// goes on the load's board) and submits one layer-range read per (layer,
// block) in the order layer 0 of every block, layer 1 of every block, ...
// as many at once as the tiers take; a block's later layers go once its
// first one landed (the tier then knows the block, and a block that fails
// at once costs one read). Each layer that lands, but a block's last, is
// counted on the load record (LoadRecord::Count, Advance: the board's
// `layers_ready`); a block whose last layer lands ends its promotion
// through the Promoter (FinishPromotion commits it and pins it for its
// waiters, the load among them, whose on_resolve counts that layer). A
// failed read fails its block alone: its promotion ends with the failure
// once none of its reads is in flight; the other blocks go on.
//
// A read the tier answers NotFound (its reclaim handed the block to the
// tier under it between the claim's find and the read, or between two of
// the block's layers) is followed down: when a lower tier holds the block
// now, that layer and the block's later ones are read from there
// (engine.load_reads_followed_down each); the layers already landed stay.
//
// A tier out of read staging (Busy) with none of the stream's reads in
// flight is tried again kStreamRetryPauseUs later on the retry scheduler,
// on the injected clock (engine.load_busy_retries each), until
// kStreamBusyWaitUs passed since Start or the last read that ended
// (landed or failed); then, or when the retry queue is full, every block
// left fails with Busy.
//
// Each streamed block counts as I/O in flight from Start until its
// promotion ends (Hooks::io_started here, the Promoter's io_finished), and
// each waiting retry too. Counters engine.load_streamed_blocks,
// load_layer_reads, load_busy_retries.
//
// Thread-safe, no thread of its own. Each stream's lock (`LayerStream`'s)
// is a leaf, like the load record's, and neither is held across a read's
// start or the Promoter; one thread submits a stream's reads at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>

#include "common/clock.h"
#include "common/retry_scheduler.h"
#include "daemon/engine/engine_counters.h"
#include "daemon/engine/engine_levels.h"
#include "daemon/engine/promoter.h"
#include "kvtier/result.h"
#include "tiers/host/host_tier.h"
#include "tiers/tier.h"

namespace kvtier {

struct LoadRecord;

class LayerStreamer {
 public:
  struct Hooks {
    // I/O in flight: one io_started per streamed block (its promotion's,
    // which the Promoter ends) and per waiting retry; one io_finished
    // after each retry.
    std::function<void()> io_started, io_finished;
    // `bytes` of arena space, evicting to make room (Evictor::Allocate);
    // NoSpace when there is none.
    std::function<Result<HostTier::Extent>(uint64_t bytes)> allocate;
    // The record of the level a Located names; it outlives the streamer.
    std::function<TierLevel&(size_t level)> source;
    // The highest level below the host holding `key` under `ns` now.
    std::function<std::optional<Located>(const BlockKey& key, const NamespaceFingerprint& ns)> find_below;
  };
  static constexpr uint64_t kStreamBusyWaitUs = 2'000'000;
  static constexpr uint64_t kStreamRetryPauseUs = 1'000;

  // Every reference is borrowed and outlives the streamer (the retry
  // scheduler is stopped, and its jobs run, before it goes).
  LayerStreamer(HostTier& host, const Clock& clock, RetryScheduler& retries, Promoter& promoter,
                EngineCounters& counters, Hooks hooks);
  LayerStreamer(const LayerStreamer&) = delete;
  LayerStreamer& operator=(const LayerStreamer&) = delete;

  // Streams `claims` for `load`: blocks claimed for promotion (kPromoting,
  // the load's pin among their waiters) of the load's layout, each at
  // index `claim.index` of the load. A block with no arena room ends its
  // promotion with NoSpace at once. No lock held on entry.
  void Start(const std::shared_ptr<LoadRecord>& load, std::span<const PinClaim> claims);

 private:
  struct LayerStream;
  // Submits the stream's next layer reads in order until the tier is busy.
  void Pump(const std::shared_ptr<LayerStream>& stream);
  // `level`: the one the read went to.
  void ReadDone(const std::shared_ptr<LayerStream>& stream, size_t block, uint32_t layer, size_t level,
                Result<BlockTier::LayerRead> read);
  // The level under `level` that holds the block of `stream`'s `block`
  // now, if any (no lock held: it asks the tiers).
  std::optional<size_t> LevelDown(const LayerStream& stream, size_t block, size_t level) const;

  HostTier& host_;
  const Clock& clock_;
  RetryScheduler& retries_;
  Promoter& promoter_;
  EngineCounters& counters_;
  const Hooks hooks_;
};

}  // namespace kvtier

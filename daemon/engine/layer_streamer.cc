#include "daemon/engine/layer_streamer.h"

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "daemon/engine/load_table.h"

namespace kvtier {

// The layer reads of a load's streamed blocks, in submission order.
struct LayerStreamer::LayerStream {
  std::shared_ptr<LoadRecord> load;
  uint32_t layers = 1;
  uint64_t layer_bytes = 0;
  struct Block {
    size_t index = 0;  // in the load
    BlockKey key;
    NamespaceFingerprint ns;
    size_t level = 0;  // the tier below its next reads go to (lower once followed down)
    HostTier::Extent extent;
    uint64_t checksum = 0;
    std::vector<uint64_t> layer_checksums;  // per layer, as each lands (verified by the tier)
    bool all_sums = true;                   // every layer landed with its checksum
    uint32_t landed = 0;
    uint32_t in_flight = 0;
    bool failed = false;
    bool finished = false;  // FinishPromotion called (or about to be)
    Status failure;
  };
  Mutex mu;  // a leaf
  // Filled by Start before the stream is shared; after, each Block's
  // index, key, ns and extent are read-only and its other fields are
  // guarded by mu.
  std::vector<Block> blocks;
  size_t next GUARDED_BY(mu) = 0;  // next read: layer next / blocks.size(), block next % blocks.size()
  // Reads to go again, from the level their block was followed down to:
  // (block, layer), before `next`'s.
  std::vector<std::pair<size_t, uint32_t>> redo GUARDED_BY(mu);
  size_t in_flight GUARDED_BY(mu) = 0;
  bool pumping GUARDED_BY(mu) = false;  // one thread submits at a time (keeps the order)
  bool pump_again GUARDED_BY(mu) = false;
  uint64_t last_progress_us GUARDED_BY(mu) = 0;  // on the engine's clock

  // Marks `b` failed; true when its promotion is to be finished now (no
  // read of it in flight).
  bool Fail(Block& b, Status why) {
    if (!b.failed) {
      b.failed = true;
      b.failure = std::move(why);
    }
    if (b.in_flight != 0 || b.finished) return false;
    b.finished = true;
    return true;
  }
};

LayerStreamer::LayerStreamer(HostTier& host, const Clock& clock, RetryScheduler& retries, Promoter& promoter,
                             EngineCounters& counters, Hooks hooks)
    : host_(host),
      clock_(clock),
      retries_(retries),
      promoter_(promoter),
      counters_(counters),
      hooks_(std::move(hooks)) {}

void LayerStreamer::Start(const std::shared_ptr<LoadRecord>& load, std::span<const PinClaim> claims) {
  auto stream = std::make_shared<LayerStream>();
  stream->load = load;
  stream->layers = load->layers;
  stream->layer_bytes = load->layer_bytes;
  {
    MutexLock lock(stream->mu);  // no other thread has the stream yet
    stream->last_progress_us = clock_.NowUs();
  }
  for (const PinClaim& c : claims) {
    hooks_.io_started();  // the promotion's; FinishPromotion ends it
    Result<HostTier::Extent> extent = hooks_.allocate(c.from.info.payload_bytes);
    if (!extent.ok()) {
      promoter_.FinishPromotion(c.key, extent.status(), {}, c.from.info.payload_checksum);
      continue;
    }
    {
      MutexLock lock(load->mu);
      load->board.SetOffset(static_cast<uint32_t>(c.index), extent->offset);
    }
    LayerStream::Block b;
    b.index = c.index;
    b.key = c.key;
    b.ns = c.from.info.ns;
    b.level = c.from.level;
    b.extent = *extent;
    b.checksum = c.from.info.payload_checksum;
    b.layer_checksums.assign(stream->layers, 0);
    stream->blocks.push_back(std::move(b));
  }
  Bump(counters_.load_streamed_blocks, static_cast<int64_t>(stream->blocks.size()));
  if (!stream->blocks.empty()) Pump(stream);
}

void LayerStreamer::Pump(const std::shared_ptr<LayerStream>& stream) {
  struct Finish {
    BlockKey key;
    Status status;
    HostTier::Extent extent;
    uint64_t checksum;
  };  // failures only: no layer checksums
  std::vector<Finish> finish;
  bool retry_later = false;
  MutexLock lock(stream->mu);
  if (stream->pumping) {
    stream->pump_again = true;
    return;
  }
  stream->pumping = true;
  const size_t n = stream->blocks.size();
  const size_t total = n * stream->layers;
  do {
    stream->pump_again = false;
    while (!stream->redo.empty() || stream->next < total) {
      const bool again_read = !stream->redo.empty();
      const size_t item = stream->next;
      const std::pair<size_t, uint32_t> next_read =
          again_read ? stream->redo.back() : std::pair{item % n, static_cast<uint32_t>(item / n)};
      const size_t block = next_read.first;
      const uint32_t layer = next_read.second;
      LayerStream::Block& b = stream->blocks[block];
      const auto advance = [&stream, again_read] {
        stream->mu.AssertHeld();  // called only below, under `lock`
        if (again_read) {
          stream->redo.pop_back();
        } else {
          ++stream->next;
        }
      };
      if (b.failed) {
        advance();
        continue;
      }
      // A block's later layers go once its first landed: the tier then
      // knows the block's record (the NVMe tier reads its header once),
      // and a block that fails at once costs one read. The order stays.
      if (!again_read && layer > 0 && b.landed == 0) break;
      ++b.in_flight;
      ++stream->in_flight;
      advance();
      const size_t level = b.level;
      TierLevel& below = hooks_.source(level);
      BlockTier& tier = *below.tier;
      const BlockKey key = b.key;
      std::span<std::byte> dst = host_.Bytes(b.extent).subspan(layer * stream->layer_bytes, stream->layer_bytes);
      lock.Unlock();
      below.read_meter.Started(stream->layer_bytes, clock_.NowUs());
      // The layer's checksum from a tier that keeps them, or hashed when the
      // load verifies (its board needs it); else a plain read.
      Status started =
          tier.keeps_layer_checksums() || stream->load->verify
              ? tier.ReadWithLayerChecksums(key, layer, layer + 1, dst,
                                            [this, stream, block, layer, level](Result<BlockTier::LayerRead> r) {
                                              ReadDone(stream, block, layer, level, std::move(r));
                                            })
              : tier.Read(key, layer, layer + 1, dst, [this, stream, block, layer, level](Result<size_t> r) {
                  if (!r.ok()) return ReadDone(stream, block, layer, level, r.status());
                  ReadDone(stream, block, layer, level, BlockTier::LayerRead{*r, {}});
                });
      if (!started.ok()) below.read_meter.Ended(stream->layer_bytes, 0, clock_.NowUs());
      const std::optional<size_t> down =
          started.code() == StatusCode::kNotFound ? LevelDown(*stream, block, level) : std::nullopt;
      lock.Lock();
      if (started.ok()) {
        Bump(counters_.load_layer_reads);
        continue;
      }
      LayerStream::Block& again = stream->blocks[block];
      --again.in_flight;
      --stream->in_flight;
      if (started.code() == StatusCode::kBusy) {
        // This read again, later.
        if (again_read) {
          stream->redo.emplace_back(block, layer);
        } else {
          stream->next = item;
        }
        if (stream->in_flight == 0) {
          if (clock_.NowUs() < stream->last_progress_us + kStreamBusyWaitUs) {
            retry_later = true;
          } else {
            for (auto& other : stream->blocks) {
              if (stream->Fail(other, Busy("the tier below stayed busy for the layer-wise load"))) {
                finish.push_back(Finish{other.key, other.failure, other.extent, other.checksum});
              }
            }
          }
        }
        break;
      }
      if (down && !again.failed) {
        again.level = std::max(again.level, *down);
        stream->redo.emplace_back(block, layer);
        Bump(counters_.load_reads_followed_down);
        continue;
      }
      if (stream->Fail(again, started)) {
        finish.push_back(Finish{again.key, again.failure, again.extent, again.checksum});
      }
    }
  } while (stream->pump_again);
  stream->pumping = false;
  lock.Unlock();
  for (Finish& f : finish) promoter_.FinishPromotion(f.key, f.status, f.extent, f.checksum);
  if (retry_later) {
    hooks_.io_started();  // the retry's, ended by the job
    const bool queued = retries_.RunAfter(kStreamRetryPauseUs, [this, stream] {
      Bump(counters_.load_busy_retries);
      Pump(stream);
      hooks_.io_finished();
    });
    if (!queued) {
      // The retry queue is full: fail what is left rather than spin here.
      std::vector<Finish> left;
      {
        MutexLock again(stream->mu);
        for (auto& b : stream->blocks) {
          if (stream->Fail(b, Busy("the tier below was busy and the retry queue full"))) {
            left.push_back(Finish{b.key, b.failure, b.extent, b.checksum});
          }
        }
      }
      for (Finish& f : left) promoter_.FinishPromotion(f.key, f.status, f.extent, f.checksum);
      hooks_.io_finished();
    }
  }
}

std::optional<size_t> LayerStreamer::LevelDown(const LayerStream& stream, size_t block, size_t level) const {
  const LayerStream::Block& b = stream.blocks[block];  // its key and ns are read-only
  std::optional<Located> again = hooks_.find_below(b.key, b.ns);
  // Only further down (so a block moves at most the stack's depth), and
  // never to the tier above, whose evictions go to the host tier.
  if (!again || again->level <= level) return std::nullopt;
  return again->level;
}

void LayerStreamer::ReadDone(const std::shared_ptr<LayerStream>& stream, size_t block, uint32_t layer, size_t level,
                             Result<BlockTier::LayerRead> read) {
  hooks_.source(level).read_meter.Ended(stream->layer_bytes, read.ok() ? read->bytes : 0, clock_.NowUs());
  const std::optional<size_t> down =
      read.status().code() == StatusCode::kNotFound ? LevelDown(*stream, block, level) : std::nullopt;
  uint64_t layer_checksum = 0;
  bool landed = false;
  bool finish = false;
  Status outcome = Status::Ok();
  LayerStream::Block snapshot;
  {
    MutexLock lock(stream->mu);
    LayerStream::Block& b = stream->blocks[block];
    --b.in_flight;
    --stream->in_flight;
    stream->last_progress_us = clock_.NowUs();
    if (down && !b.failed) {
      // Read again from the level under it; nothing lands or fails now.
      b.level = std::max(b.level, *down);
      stream->redo.emplace_back(block, layer);
      Bump(counters_.load_reads_followed_down);
      lock.Unlock();
      return Pump(stream);
    }
    const bool with_sum = read.ok() && read->layer_checksums.size() == 1;
    if (read.ok() && read->bytes == stream->layer_bytes && (with_sum || !stream->load->verify) && !b.failed) {
      landed = true;
      if (with_sum) layer_checksum = b.layer_checksums[layer] = read->layer_checksums[0];
      b.all_sums = b.all_sums && with_sum;
      if (++b.landed == stream->layers) {
        b.finished = true;
        finish = true;
      }
    } else {
      Status why = !read.ok()                           ? read.status()
                   : b.failed                           ? b.failure
                   : read->bytes != stream->layer_bytes ? IoError("short layer read")
                                                        : Internal("the tier gave no layer checksum");
      finish = stream->Fail(b, std::move(why));
    }
    if (finish) {
      outcome = b.failed ? b.failure : Status::Ok();
      snapshot = b;
    }
  }
  // The block's last layer to land is counted when the block resolves
  // (Loader::Resolved, after FinishPromotion verified it): a block can
  // still fail there, and layers_ready == layers promises every block is
  // loaded or failed.
  if (landed && !finish) {
    LoadRecord& load = *stream->load;
    MutexLock lock(load.mu);
    const size_t index = stream->blocks[block].index;
    if (load.board.has_checksums()) load.board.SetLayerChecksum(static_cast<uint32_t>(index), layer, layer_checksum);
    load.Count(index, layer);
    load.Advance();
  }
  if (finish) {
    if (!snapshot.all_sums) snapshot.layer_checksums.clear();
    promoter_.FinishPromotion(snapshot.key, outcome, snapshot.extent, snapshot.checksum,
                              std::move(snapshot.layer_checksums));
  }
  Pump(stream);
}

}  // namespace kvtier

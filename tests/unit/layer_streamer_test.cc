// Tests of the LayerStreamer, which reads a layer-wise load's blocks from
// a tier below layer by layer, driven without an Engine: real index shards
// and arena, a real Promoter ending each block's promotion, a MapTier
// below behind a scripted wrapper that records the order of the reads,
// fails the blocks it is told to and answers Busy while told to, and a
// FakeClock the test moves. The load's pin stands in for the engine's
// (what the Loader counts on the board as a block resolves).
#include "daemon/engine/layer_streamer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "common/checksum.h"
#include "common/load_board.h"
#include "daemon/engine/block_index.h"
#include "daemon/engine/load_table.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/index_shards.h"
#include "tests/testing/map_tier.h"
#include "tests/testing/test_daemon.h"
#include "tiers/forwarding_tier.h"

namespace kvtier {
namespace {

using ::kvtier::testing::FakeClock;
using ::kvtier::testing::MapTier;

constexpr uint32_t kLayers = 4;
constexpr uint64_t kLayerBytes = 4 << 10;
constexpr uint64_t kBlockBytes = kLayers * kLayerBytes;
constexpr size_t kArenaBlocks = 8;
constexpr NamespaceFingerprint kNs{0x57e, 0xa3};
constexpr ConnectionId kConn = 4;
constexpr size_t kShards = 2;

BlockKey Key(uint64_t i) { return BlockKey{0x57e, i}; }

std::vector<std::byte> BlockBytes(uint64_t i) {
  return ::kvtier::testing::LayeredBlockBytes(i, kBlockBytes, kLayerBytes);
}

// The tier below: records each read started (key, first layer) in order,
// fails every read of a key in `failing` (IoError, on its thread), and
// refuses every read while `busy`. It hands a key in `handed_down` to the
// tier under it (drops it: the test stored it there) at the key's first
// read of a layer past 0, which then starts NotFound; and a key in
// `vanishing` at its first read, which then completes NotFound (the
// record reclaimed while it was read).
class ScriptedTier final : public ForwardingTier {
 public:
  using ForwardingTier::ForwardingTier;
  std::atomic<bool> busy{false};
  std::set<BlockKey> failing;                 // set before the stream starts
  std::set<BlockKey> handed_down, vanishing;  // likewise

  Status Read(const BlockKey& key, uint32_t first_layer, uint32_t last_layer, std::span<std::byte> dst,
              ReadDone done) override {
    if (busy.load()) return Busy("scripted: no read staging");
    {
      std::lock_guard lock(mu_);
      reads_.emplace_back(key, first_layer);
    }
    if (handed_down.count(key) != 0 && first_layer > 0) (void)ForwardingTier::Erase(key);
    if (vanishing.count(key) != 0) {
      (void)ForwardingTier::Erase(key);
      return ForwardingTier::Read(key, first_layer, last_layer, dst, [key, done = std::move(done)](Result<size_t>) {
        done(NotFound("scripted: block " + key.ToHex() + " was reclaimed during the read"));
      });
    }
    const bool fail = failing.count(key) != 0;
    return ForwardingTier::Read(key, first_layer, last_layer, dst, [fail, done = std::move(done)](Result<size_t> r) {
      if (fail) return done(IoError("scripted: the device failed"));
      done(std::move(r));
    });
  }
  Status ReadWithLayerChecksums(const BlockKey& key, uint32_t first_layer, uint32_t last_layer,
                                std::span<std::byte> dst, LayerReadDone done) override {
    return BlockTier::ReadWithLayerChecksums(key, first_layer, last_layer, dst, std::move(done));
  }
  std::vector<std::pair<BlockKey, uint32_t>> reads() const {
    std::lock_guard lock(mu_);
    return reads_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::pair<BlockKey, uint32_t>> reads_;
};

class LayerStreamerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    host_ = ::kvtier::testing::OpenTestHostTier(kArenaBlocks * kBlockBytes + (64 << 10));
    ASSERT_NE(host_, nullptr);
    shards_ = ::kvtier::testing::MakeShards(*host_, kShards);
    level_.tier = &below_;
    lower_level_.tier = &lower_map_;
    Promoter::Hooks hooks;
    hooks.io_started = [this] { ++io_started_; };
    hooks.io_finished = [this] { ++io_finished_; };
    hooks.allocate = [this](uint64_t bytes) { return host_->Allocate(bytes); };
    hooks.source = [this](size_t level) -> TierLevel& { return level == 0 ? level_ : lower_level_; };
    hooks.find_below = [this](const BlockKey& key, const NamespaceFingerprint& ns) -> std::optional<Located> {
      for (size_t level = 0; level < 2; ++level) {
        std::optional<BlockTier::BlockInfo> info = (level == 0 ? level_ : lower_level_).tier->Find(key);
        if (info && info->ns == ns) return Located{level, *info};
      }
      return std::nullopt;
    };
    hooks.pin = ::kvtier::testing::PinCommitted;
    hooks.layer_count = [](const NamespaceFingerprint&, uint64_t size) { return size == kBlockBytes ? kLayers : 1u; };
    hooks.next_handle = [this] { return next_handle_++; };
    hooks.prefetch_read_ended = [](bool) {};
    promoter_ = std::make_unique<Promoter>(shards_, *host_, clock_, retries_, kBlockBytes, counters_, hooks);
    LayerStreamer::Hooks stream_hooks{hooks.io_started, hooks.io_finished, hooks.allocate, hooks.source,
                                      hooks.find_below};
    streamer_ = std::make_unique<LayerStreamer>(*host_, clock_, retries_, *promoter_, counters_, stream_hooks);
  }
  void TearDown() override {
    retries_.Stop();
    while (io_finished_.load() != io_started_.load()) std::this_thread::yield();
  }

  // Stores blocks 0..n-1 below, opens a load of them with its board, claims
  // each for promotion with the load's pin waiting, and streams them.
  // Returns the load's grants once every block resolved.
  std::future<std::vector<PinGrant>> Load(size_t n) {
    blocks_ = static_cast<uint32_t>(n);
    load_ = std::make_shared<LoadRecord>();
    load_->connection = kConn;
    load_->layers = kLayers;
    load_->layer_bytes = kLayerBytes;
    Result<HostTier::Extent> board = host_->Allocate(LoadBoardBytes(static_cast<uint32_t>(n)));
    EXPECT_TRUE(board.ok());
    board_ = *board;
    {
      MutexLock lock(load_->mu);
      load_->board_extent = *board;
      load_->board = LoadBoardWriter(host_->Bytes(*board).data(), static_cast<uint32_t>(n), kLayers, kLayerBytes,
                                     /*verify=*/false);
      load_->pending.assign(kLayers, static_cast<uint32_t>(n));
      load_->counted.assign(n * kLayers, 0);
      load_->leases.assign(n, 0);
      load_->unresolved = n;
    }
    auto batch = std::make_shared<PinBatch>();
    batch->connection = kConn;
    batch->grants.resize(n);
    batch->outstanding = static_cast<int>(n);
    batch->done = [this](std::vector<PinGrant> grants) { loaded_.set_value(std::move(grants)); };
    // What the Loader does with the board: the block's
    // layers not yet counted (its last, or all when it failed) count now.
    batch->on_resolve = [load = load_](size_t index, const PinGrant& grant) {
      MutexLock lock(load->mu);
      if (grant.status.ok()) {
        load->board.SetLoaded(static_cast<uint32_t>(index));
      } else {
        load->board.SetFailed(static_cast<uint32_t>(index), grant.status.code());
      }
      for (uint32_t l = 0; l < load->layers; ++l) load->Count(index, l);
      --load->unresolved;
      load->Advance();
    };
    std::vector<PinClaim> claims;
    for (size_t i = 0; i < n; ++i) {
      const std::vector<std::byte> bytes = BlockBytes(i);
      EXPECT_TRUE(map_.Write(
                          kNs, Key(i), kLayers, bytes, [](Status) {}, BlockChecksum(bytes))
                      .ok());
      BlockIndex& shard = *shards_[ShardIndexOf(Key(i), kShards)];
      MutexLock lock(shard.mu);
      shard.BeginPromotion(Key(i), kNs, kBlockBytes, /*prefetched=*/false);
      shard.promotion_waiters[Key(i)].push_back(PromotionWaiter{batch, i});
      claims.push_back(PinClaim{i, Key(i), Located{0, *map_.Find(Key(i))}});
    }
    std::future<std::vector<PinGrant>> out = loaded_.get_future();
    streamer_->Start(load_, claims);
    return out;
  }
  // The board as the client reads it.
  LoadBoardReader Board() { return LoadBoardReader(host_->Bytes(board_).data(), blocks_); }
  std::vector<std::byte> Arena(uint64_t offset, uint64_t length) {
    std::span<std::byte> bytes = ::kvtier::testing::SlotBytes(*host_, offset, length);
    return std::vector<std::byte>(bytes.begin(), bytes.end());
  }

  FakeClock clock_;
  EngineCounters counters_;
  std::unique_ptr<HostTier> host_;
  std::vector<std::unique_ptr<BlockIndex>> shards_;
  MapTier map_;
  ScriptedTier below_{map_};
  TierLevel level_;
  MapTier lower_map_;  // the tier under it (level 1)
  TierLevel lower_level_;
  RetryScheduler retries_{"test.retries", clock_, 64};
  std::atomic<int> io_started_{0}, io_finished_{0};
  std::atomic<BlockHandle> next_handle_{1};
  uint32_t blocks_ = 0;  // in the load
  std::shared_ptr<LoadRecord> load_;
  HostTier::Extent board_;  // the load's board in the arena (load_->board_extent)
  std::promise<std::vector<PinGrant>> loaded_;
  std::unique_ptr<Promoter> promoter_;
  std::unique_ptr<LayerStreamer> streamer_;
};

TEST_F(LayerStreamerTest, LayerZeroOfEveryBlockIsReadFirstAndEveryBlockLandsByteExact) {
  constexpr size_t kBlocks = 3;
  const std::vector<PinGrant> grants = Load(kBlocks).get();
  std::vector<std::pair<BlockKey, uint32_t>> expected;
  for (uint32_t l = 0; l < kLayers; ++l) {
    for (size_t b = 0; b < kBlocks; ++b) expected.emplace_back(Key(b), l);
  }
  EXPECT_EQ(below_.reads(), expected) << "one read per (layer, block), layer-major";
  for (size_t b = 0; b < kBlocks; ++b) {
    ASSERT_TRUE(grants[b].status.ok()) << b << ": " << grants[b].status.ToString();
    EXPECT_EQ(Arena(grants[b].offset, grants[b].length), BlockBytes(b)) << b;
    EXPECT_EQ(Board().offset(static_cast<uint32_t>(b)), grants[b].offset)
        << "the board says where the block lands, from the start";
  }
  EXPECT_EQ(Board().layers_ready(), kLayers) << "every layer but each block's last was counted by the stream";
  EXPECT_EQ(counters_.load_streamed_blocks.load(), 3);
  EXPECT_EQ(counters_.load_layer_reads.load(), 12);
  EXPECT_EQ(counters_.promotions.load(), 3);
}

TEST_F(LayerStreamerTest, AFailedBlockFailsAloneAfterOneRead) {
  below_.failing.insert(Key(1));
  const std::vector<PinGrant> grants = Load(3).get();
  EXPECT_EQ(grants[1].status.code(), StatusCode::kNotFound) << grants[1].status.ToString();
  for (size_t b : {0, 2}) {
    ASSERT_TRUE(grants[b].status.ok()) << b << ": " << grants[b].status.ToString();
    EXPECT_EQ(Arena(grants[b].offset, grants[b].length), BlockBytes(b)) << b;
  }
  size_t reads_of_failed = 0;
  for (const auto& [key, layer] : below_.reads()) reads_of_failed += key == Key(1);
  EXPECT_EQ(reads_of_failed, 1u) << "its later layers are never asked for";
  EXPECT_EQ(counters_.promotion_failures.load(), 1);
  EXPECT_EQ(counters_.promotions.load(), 2);
  EXPECT_EQ(Board().layers_ready(), kLayers) << "layers_ready passes over the failed block";
  EXPECT_EQ(host_->used_bytes(), board_.length + 2 * kBlockBytes) << "the failed block's extent was freed";
  BlockIndex& shard = *shards_[ShardIndexOf(Key(1), kShards)];
  MutexLock lock(shard.mu);
  EXPECT_EQ(shard.index.count(Key(1)), 0u) << "its claim and its extent are gone";
}

TEST_F(LayerStreamerTest, ABusyTierIsRetriedOnTheClock) {
  below_.busy = true;
  const uint64_t start = clock_.NowUs();
  std::future<std::vector<PinGrant>> loaded = Load(2);
  EXPECT_EQ(clock_.AwaitWaiter(), start + LayerStreamer::kStreamRetryPauseUs);
  EXPECT_TRUE(below_.reads().empty());
  below_.busy = false;
  clock_.SetUs(start + LayerStreamer::kStreamRetryPauseUs);
  const std::vector<PinGrant> grants = loaded.get();
  for (size_t b = 0; b < 2; ++b) ASSERT_TRUE(grants[b].status.ok()) << b << ": " << grants[b].status.ToString();
  EXPECT_EQ(counters_.load_busy_retries.load(), 1);
  EXPECT_EQ(below_.reads().size(), 2u * kLayers);
}

TEST_F(LayerStreamerTest, ATierBusyPastTheWaitFailsEveryBlockWithBusy) {
  below_.busy = true;
  const uint64_t start = clock_.NowUs();
  std::future<std::vector<PinGrant>> loaded = Load(2);
  EXPECT_EQ(clock_.AwaitWaiter(), start + LayerStreamer::kStreamRetryPauseUs);
  clock_.SetUs(start + LayerStreamer::kStreamBusyWaitUs - 1);  // still within the wait: tried again
  EXPECT_EQ(clock_.AwaitWaiter(), start + LayerStreamer::kStreamBusyWaitUs - 1 + LayerStreamer::kStreamRetryPauseUs);
  EXPECT_EQ(loaded.wait_for(std::chrono::seconds(0)), std::future_status::timeout);
  clock_.SetUs(start + LayerStreamer::kStreamBusyWaitUs - 1 + LayerStreamer::kStreamRetryPauseUs);
  const std::vector<PinGrant> grants = loaded.get();
  for (size_t b = 0; b < 2; ++b) EXPECT_EQ(grants[b].status.code(), StatusCode::kBusy) << b;
  EXPECT_EQ(counters_.load_busy_retries.load(), 2);
  EXPECT_EQ(host_->used_bytes(), board_.length) << "only the board holds arena space";
}

// A block the tier hands to the tier under it between the claim and a
// read (here: after its layer 0 landed, and during its first read) is
// followed down: its other layers come from there, and the load lands
// every block byte-exact.
TEST_F(LayerStreamerTest, ABlockHandedDownMidStreamIsReadOnFromTheTierUnderIt) {
  for (uint64_t i : {1, 2}) {
    const std::vector<std::byte> bytes = BlockBytes(i);
    ASSERT_TRUE(lower_map_
                    .Write(
                        kNs, Key(i), kLayers, bytes, [](Status) {}, BlockChecksum(bytes))
                    .ok());
  }
  below_.handed_down.insert(Key(1));
  below_.vanishing.insert(Key(2));
  const std::vector<PinGrant> grants = Load(3).get();
  for (size_t b = 0; b < 3; ++b) {
    ASSERT_TRUE(grants[b].status.ok()) << b << ": " << grants[b].status.ToString();
    EXPECT_EQ(Arena(grants[b].offset, grants[b].length), BlockBytes(b)) << b;
  }
  EXPECT_EQ(counters_.load_reads_followed_down.load(), 2) << "one read again per block, then its level is the lower";
  EXPECT_EQ(counters_.promotions.load(), 3);
  EXPECT_EQ(counters_.promotion_failures.load(), 0);
  EXPECT_EQ(Board().layers_ready(), kLayers);
  size_t upper_reads_of_1 = 0, upper_reads_of_2 = 0;
  for (const auto& [key, layer] : below_.reads()) {
    upper_reads_of_1 += key == Key(1);
    upper_reads_of_2 += key == Key(2);
  }
  EXPECT_EQ(upper_reads_of_1, 2u) << "layer 0, and the layer that found it gone";
  EXPECT_EQ(upper_reads_of_2, 1u);
}

}  // namespace
}  // namespace kvtier

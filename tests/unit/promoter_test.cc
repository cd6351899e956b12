// Tests of the Promoter, which moves blocks up into the host arena, driven
// without an Engine: real index shards and a real arena, a MapTier below
// behind a scripted wrapper (busy, rotting reads), a FakeClock the test
// moves for retries. A promotion lands byte-exact, committed with its
// checksum and pinned for its waiter; a read that does not verify is a
// miss whose space is freed; a busy tier is retried on the clock until the
// deadline and then Busy; layer reads land in the transient pool, which
// refuses a read past its size and takes back what a failed read held.
#include "daemon/engine/promoter.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "common/checksum.h"
#include "daemon/engine/block_index.h"
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
constexpr size_t kBlocks = 8;
constexpr NamespaceFingerprint kNs{0x960, 0x7e};
constexpr ConnectionId kConn = 9;
constexpr size_t kShards = 2;

BlockKey Key(uint64_t i) { return BlockKey{0x960, i}; }

std::vector<std::byte> BlockBytes(uint64_t i) {
  return ::kvtier::testing::LayeredBlockBytes(i, kBlockBytes, kLayerBytes);
}

// The tier below as the test scripts it: Busy to every read while `busy`,
// Corruption for every read that completes while `rot` (as a tier whose
// bytes no longer verify), and whether it says it keeps layer checksums.
class ScriptedTier final : public ForwardingTier {
 public:
  using ForwardingTier::ForwardingTier;
  std::atomic<bool> busy{false}, rot{false}, keeps_layers{false};
  std::atomic<int> refused{0};

  bool keeps_layer_checksums() const override { return keeps_layers.load(); }
  Status Read(const BlockKey& key, uint32_t first_layer, uint32_t last_layer, std::span<std::byte> dst,
              ReadDone done) override {
    if (busy.load()) {
      ++refused;
      return Busy("scripted: no read staging");
    }
    return ForwardingTier::Read(key, first_layer, last_layer, dst, [this, done = std::move(done)](Result<size_t> r) {
      if (rot.load()) return done(Corruption("scripted: the bytes do not verify"));
      done(std::move(r));
    });
  }
  // The base class's: Read, then each layer hashed.
  Status ReadWithLayerChecksums(const BlockKey& key, uint32_t first_layer, uint32_t last_layer,
                                std::span<std::byte> dst, LayerReadDone done) override {
    return BlockTier::ReadWithLayerChecksums(key, first_layer, last_layer, dst, std::move(done));
  }
};

class PromoterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    host_ = ::kvtier::testing::OpenTestHostTier(kBlocks * kBlockBytes);
    ASSERT_NE(host_, nullptr);
    shards_ = ::kvtier::testing::MakeShards(*host_, kShards);
    level_.tier = &below_;
    lower_level_.tier = &lower_map_;
  }
  void TearDown() override {
    retries_.Stop();
    WaitIdle();
  }

  Promoter& Make(uint64_t layer_read_pool_bytes = kBlocks * kBlockBytes) {
    Promoter::Hooks hooks;
    hooks.io_started = [this] { ++io_started_; };
    hooks.io_finished = [this] { ++io_finished_; };
    hooks.allocate = [this](uint64_t bytes) { return host_->Allocate(bytes); };
    hooks.source = [this](size_t level) -> TierLevel& {
      EXPECT_LE(level, 1u);
      return level == 0 ? level_ : lower_level_;
    };
    hooks.find_below = [this](const BlockKey& key, const NamespaceFingerprint& ns) -> std::optional<Located> {
      for (size_t level = 0; level < 2; ++level) {
        std::optional<BlockTier::BlockInfo> info = (level == 0 ? level_ : lower_level_).tier->Find(key);
        if (info && info->ns == ns) return Located{level, *info};
      }
      return std::nullopt;
    };
    hooks.pin = ::kvtier::testing::PinCommitted;
    hooks.layer_count = [](const NamespaceFingerprint& ns, uint64_t size) {
      EXPECT_EQ(ns, kNs);
      return size == kBlockBytes ? kLayers : 1u;
    };
    hooks.next_handle = [this] { return next_handle_++; };
    hooks.prefetch_read_ended = [this](bool) { ++prefetch_reads_ended_; };
    promoter_ = std::make_unique<Promoter>(shards_, *host_, clock_, retries_, layer_read_pool_bytes, counters_,
                                           std::move(hooks));
    return *promoter_;
  }

  // Hands block `i` (stored in the tier below) down to the tier under it,
  // as that tier's reclaim does: the lower tier has it, the upper not.
  void HandDown(uint64_t i) {
    const std::vector<std::byte> bytes = BlockBytes(i);
    EXPECT_TRUE(lower_map_
                    .Write(
                        kNs, Key(i), kLayers, bytes, [](Status) {}, BlockChecksum(bytes))
                    .ok());
    EXPECT_TRUE(map_.Erase(Key(i)).ok());
  }

  // Stores block `i` in the tier below; where a pin finds it.
  Located Store(uint64_t i) {
    const std::vector<std::byte> bytes = BlockBytes(i);
    EXPECT_TRUE(map_.Write(
                        kNs, Key(i), kLayers, bytes, [](Status) {}, BlockChecksum(bytes))
                    .ok());
    std::optional<BlockTier::BlockInfo> info = below_.Find(Key(i));
    EXPECT_TRUE(info.has_value());
    return Located{0, info.value_or(BlockTier::BlockInfo{})};
  }

  BlockIndex& ShardOf(const BlockKey& key) { return *shards_[ShardIndexOf(key, kShards)]; }

  // A pin of one key waiting for a read: its grant, once it resolves.
  std::shared_ptr<PinBatch> Batch(std::promise<PinGrant>& landed) {
    auto batch = std::make_shared<PinBatch>();
    batch->connection = kConn;
    batch->grants.resize(1);  // outstanding starts at 1: this one key
    batch->done = [&landed](std::vector<PinGrant> grants) { landed.set_value(std::move(grants[0])); };
    return batch;
  }
  // Claims `key` for promotion (as a pin does) with one waiting pin.
  std::future<PinGrant> Claim(const BlockKey& key, std::promise<PinGrant>& landed) {
    BlockIndex& shard = ShardOf(key);
    MutexLock lock(shard.mu);
    shard.BeginPromotion(key, kNs, kBlockBytes, /*prefetched=*/false);
    shard.promotion_waiters[key].push_back(PromotionWaiter{Batch(landed), 0});
    return landed.get_future();
  }
  // The host entry of `key`, if there is one: (state, checksum, layer checksums).
  std::optional<BlockEntry> Entry(const BlockKey& key) { return ::kvtier::testing::EntryOf(shards_, key); }
  std::vector<std::byte> Arena(uint64_t offset, uint64_t length) {
    std::span<std::byte> bytes = ::kvtier::testing::SlotBytes(*host_, offset, length);
    return std::vector<std::byte>(bytes.begin(), bytes.end());
  }
  // Every I/O started has ended (reads complete on the tier's thread,
  // just after the waiters were resolved).
  void WaitIdle() {
    while (io_finished_.load() != io_started_.load()) std::this_thread::yield();
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
  std::atomic<int> io_started_{0}, io_finished_{0}, prefetch_reads_ended_{0};
  std::atomic<BlockHandle> next_handle_{1};
  std::unique_ptr<Promoter> promoter_;
};

TEST_F(PromoterTest, APromotionLandsByteExactCommittedAndPinnedForItsWaiter) {
  Promoter& promoter = Make();
  const Located from = Store(1);
  std::promise<PinGrant> landed;
  std::future<PinGrant> grant = Claim(Key(1), landed);
  promoter.Promote(Key(1), from);
  const PinGrant g = grant.get();
  ASSERT_TRUE(g.status.ok()) << g.status.ToString();
  EXPECT_EQ(g.length, kBlockBytes);
  EXPECT_NE(g.lease, 0u);
  EXPECT_EQ(g.checksum, BlockChecksum(BlockBytes(1))) << "the checksum the tier verified the read against";
  EXPECT_EQ(Arena(g.offset, g.length), BlockBytes(1));
  std::optional<BlockEntry> entry = Entry(Key(1));
  ASSERT_TRUE(entry.has_value());
  EXPECT_EQ(entry->state(), BlockState::kPinned);
  EXPECT_EQ(entry->checksum, BlockChecksum(BlockBytes(1)));
  EXPECT_TRUE(entry->layer_checksums.empty()) << "a plain read from a tier that keeps no layer checksums";
  EXPECT_EQ(counters_.promotions.load(), 1);
  EXPECT_EQ(counters_.promotion_failures.load(), 0);
  EXPECT_TRUE(map_.Find(Key(1)).has_value()) << "the copy below stays";
  WaitIdle();
  EXPECT_EQ(io_started_.load(), 1);
  EXPECT_EQ(prefetch_reads_ended_.load(), 0) << "not a prefetched block";
}

TEST_F(PromoterTest, LayerChecksumsFromATierThatKeepsThemAreRecorded) {
  Promoter& promoter = Make();
  below_.keeps_layers = true;
  const Located from = Store(2);
  std::promise<PinGrant> landed;
  std::future<PinGrant> grant = Claim(Key(2), landed);
  promoter.Promote(Key(2), from);
  ASSERT_TRUE(grant.get().status.ok());
  std::optional<BlockEntry> entry = Entry(Key(2));
  ASSERT_TRUE(entry.has_value());
  const std::vector<std::byte> bytes = BlockBytes(2);
  ASSERT_EQ(entry->layer_checksums.size(), kLayers);
  for (uint32_t l = 0; l < kLayers; ++l) {
    EXPECT_EQ(entry->layer_checksums[l],
              BlockChecksum(std::span<const std::byte>(bytes).subspan(l * kLayerBytes, kLayerBytes)))
        << l;
  }
}

TEST_F(PromoterTest, AReadThatDoesNotVerifyIsAMissAndFreesItsSpace) {
  Promoter& promoter = Make();
  const Located from = Store(3);
  below_.rot = true;
  std::promise<PinGrant> landed;
  std::future<PinGrant> grant = Claim(Key(3), landed);
  promoter.Promote(Key(3), from);
  const PinGrant g = grant.get();
  EXPECT_EQ(g.status.code(), StatusCode::kNotFound) << g.status.ToString();
  EXPECT_NE(g.status.message().find("corruption"), std::string::npos) << g.status.ToString();
  EXPECT_FALSE(Entry(Key(3)).has_value()) << "the claim is gone: a later pin may try again";
  EXPECT_EQ(host_->used_bytes(), 0u) << "its arena space was freed";
  EXPECT_EQ(counters_.promotion_failures.load(), 1);
  EXPECT_EQ(counters_.pin_misses.load(), 1);
  EXPECT_EQ(counters_.promotions.load(), 0);
  WaitIdle();
}

TEST_F(PromoterTest, NoArenaRoomIsNoSpaceNotAMiss) {
  Promoter& promoter = Make();
  const Located from = Store(4);
  std::vector<HostTier::Extent> filler;
  for (Result<HostTier::Extent> e = host_->Allocate(kBlockBytes); e.ok(); e = host_->Allocate(kBlockBytes)) {
    filler.push_back(*e);
  }
  std::promise<PinGrant> landed;
  std::future<PinGrant> grant = Claim(Key(4), landed);
  promoter.Promote(Key(4), from);
  EXPECT_EQ(grant.get().status.code(), StatusCode::kNoSpace);
  EXPECT_FALSE(Entry(Key(4)).has_value());
  EXPECT_EQ(counters_.pin_misses.load(), 1);
  for (const HostTier::Extent& e : filler) host_->Free(e);
}

TEST_F(PromoterTest, ABusyTierIsRetriedOnTheClockUntilTheDeadlineThenBusy) {
  Promoter& promoter = Make();
  const Located from = Store(5);
  below_.busy = true;
  const uint64_t start = clock_.NowUs();
  std::promise<PinGrant> landed;
  std::future<PinGrant> grant = Claim(Key(5), landed);
  promoter.Promote(Key(5), from);
  EXPECT_EQ(host_->used_bytes(), 0u) << "a refused read holds no space while it waits";
  EXPECT_EQ(clock_.AwaitWaiter(), start + Promoter::kPromotionRetryPauseUs);
  // Just before the deadline: tried again, refused again, and waits on.
  clock_.SetUs(start + Promoter::kPromotionBusyWaitUs - 1);
  EXPECT_EQ(clock_.AwaitWaiter(), start + Promoter::kPromotionBusyWaitUs - 1 + Promoter::kPromotionRetryPauseUs);
  EXPECT_EQ(grant.wait_for(std::chrono::seconds(0)), std::future_status::timeout) << "the pin still waits";
  EXPECT_EQ(counters_.promotion_retries.load(), 1);
  // Past it: the pin gets Busy (not a miss: it may try again).
  clock_.SetUs(start + Promoter::kPromotionBusyWaitUs - 1 + Promoter::kPromotionRetryPauseUs);
  EXPECT_EQ(grant.get().status.code(), StatusCode::kBusy);
  EXPECT_EQ(counters_.promotion_retries.load(), 2);
  EXPECT_EQ(below_.refused.load(), 3);
  EXPECT_FALSE(Entry(Key(5)).has_value());
  EXPECT_EQ(counters_.promotion_failures.load(), 1);
  WaitIdle();
}

TEST_F(PromoterTest, ABusyTierThatHasRoomAgainBeforeTheDeadlineIsPromoted) {
  Promoter& promoter = Make();
  const Located from = Store(6);
  below_.busy = true;
  std::promise<PinGrant> landed;
  std::future<PinGrant> grant = Claim(Key(6), landed);
  promoter.Promote(Key(6), from);
  const uint64_t when = clock_.AwaitWaiter();
  below_.busy = false;
  clock_.SetUs(when);
  const PinGrant g = grant.get();
  ASSERT_TRUE(g.status.ok()) << g.status.ToString();
  EXPECT_EQ(Arena(g.offset, g.length), BlockBytes(6));
  EXPECT_EQ(counters_.promotion_retries.load(), 1);
  EXPECT_EQ(counters_.promotions.load(), 1);
}

TEST_F(PromoterTest, ALayerReadLandsInTheTransientPoolWithItsLayersChecksums) {
  Promoter& promoter = Make();
  const Located from = Store(7);
  std::promise<PinGrant> landed;
  promoter.ReadLayers(Batch(landed), 0, Key(7), from, LayerSpan{1, 3});
  const PinGrant g = landed.get_future().get();
  ASSERT_TRUE(g.status.ok()) << g.status.ToString();
  EXPECT_EQ(g.length, 2 * kLayerBytes);
  const std::vector<std::byte> bytes = BlockBytes(7);
  const std::span<const std::byte> layers = std::span<const std::byte>(bytes).subspan(kLayerBytes, 2 * kLayerBytes);
  EXPECT_EQ(Arena(g.offset, g.length), std::vector<std::byte>(layers.begin(), layers.end()));
  ASSERT_EQ(g.layer_checksums.size(), 2u);
  EXPECT_EQ(g.layer_checksums[0], BlockChecksum(layers.first(kLayerBytes)));
  EXPECT_EQ(g.layer_checksums[1], BlockChecksum(layers.last(kLayerBytes)));
  EXPECT_EQ(promoter.transient_bytes(), 2 * kLayerBytes) << "held by the lease until it ends";
  EXPECT_FALSE(Entry(Key(7)).has_value()) << "the block is not promoted";
  EXPECT_EQ(counters_.layer_reads.load(), 1);
  EXPECT_EQ(counters_.pins.load(), 1);
  // The lease's end gives the bytes back (as Engine::Release does).
  {
    BlockIndex& shard = ShardOf(Key(7));
    MutexLock lock(shard.mu);
    Result<LeaseRecord> record = shard.leases.Take(kConn, g.lease);
    ASSERT_TRUE(record.ok());
    promoter.EndTransient(shard.Unpin(*record, clock_.NowUs()));
  }
  EXPECT_EQ(promoter.transient_bytes(), 0u);
  EXPECT_EQ(host_->used_bytes(), 0u);
  WaitIdle();
}

TEST_F(PromoterTest, ALayerReadPastTheTransientPoolIsBusy) {
  Promoter& promoter = Make(/*layer_read_pool_bytes=*/3 * kLayerBytes);
  const Located from = Store(8);
  std::promise<PinGrant> first, second, third;
  promoter.ReadLayers(Batch(first), 0, Key(8), from, LayerSpan{0, 2});
  ASSERT_TRUE(first.get_future().get().status.ok());
  promoter.ReadLayers(Batch(second), 0, Key(8), from, LayerSpan{0, 2});
  const PinGrant refused = second.get_future().get();
  EXPECT_EQ(refused.status.code(), StatusCode::kBusy) << refused.status.ToString();
  EXPECT_EQ(counters_.layer_reads_busy.load(), 1);
  EXPECT_EQ(promoter.transient_bytes(), 2 * kLayerBytes) << "the refused read took nothing";
  promoter.ReadLayers(Batch(third), 0, Key(8), from, LayerSpan{2, 3});
  EXPECT_TRUE(third.get_future().get().status.ok()) << "what is left of the pool still serves";
  EXPECT_EQ(promoter.transient_bytes(), 3 * kLayerBytes);
  WaitIdle();
}

TEST_F(PromoterTest, AFailedLayerReadGivesBackItsPoolShareAndSpace) {
  Promoter& promoter = Make();
  const Located from = Store(9);
  below_.rot = true;
  std::promise<PinGrant> landed;
  promoter.ReadLayers(Batch(landed), 0, Key(9), from, LayerSpan{0, 1});
  const PinGrant g = landed.get_future().get();
  EXPECT_EQ(g.status.code(), StatusCode::kNotFound) << g.status.ToString();
  EXPECT_EQ(promoter.transient_bytes(), 0u);
  EXPECT_EQ(host_->used_bytes(), 0u);
  EXPECT_EQ(counters_.pin_misses.load(), 1);
  EXPECT_EQ(counters_.layer_reads.load(), 0);
  WaitIdle();
}

// The tier a pin found a block in handed it to the tier under it before
// the read (its reclaim): the promotion follows it down and reads it from
// there; a block no lower tier holds is a miss.
TEST_F(PromoterTest, ABlockHandedDownBeforeTheReadIsReadFromTheTierUnderIt) {
  Promoter& promoter = Make();
  const Located from = Store(7);
  const std::vector<std::byte> bytes = BlockBytes(7);
  HandDown(7);  // between the find and the read
  std::promise<PinGrant> landed;
  std::future<PinGrant> grant = Claim(Key(7), landed);
  promoter.Promote(Key(7), from);
  const PinGrant g = grant.get();
  ASSERT_TRUE(g.status.ok()) << g.status.ToString();
  EXPECT_EQ(Arena(g.offset, g.length), bytes);
  EXPECT_EQ(counters_.promotions_followed_down.load(), 1);
  EXPECT_EQ(counters_.promotions.load(), 1);

  const Located gone = Store(8);
  ASSERT_TRUE(map_.Erase(Key(8)).ok());  // and no tier under it has it
  std::promise<PinGrant> missed;
  std::future<PinGrant> miss = Claim(Key(8), missed);
  promoter.Promote(Key(8), gone);
  EXPECT_EQ(miss.get().status.code(), StatusCode::kNotFound);
  EXPECT_EQ(counters_.promotions_followed_down.load(), 1) << "nothing under it to follow";
  WaitIdle();
}

// The same for a layer read: the layers come from the tier under the one
// the pin found the block in, the pool holds them once, and a block no
// lower tier holds is a miss that gives back its share and space.
TEST_F(PromoterTest, ALayerReadOfABlockHandedDownBeforeTheReadFollowsItDown) {
  Promoter& promoter = Make();
  const Located from = Store(7);
  const std::vector<std::byte> bytes = BlockBytes(7);
  HandDown(7);  // between the find and the read
  std::promise<PinGrant> landed;
  promoter.ReadLayers(Batch(landed), 0, Key(7), from, LayerSpan{1, 3});
  const PinGrant g = landed.get_future().get();
  ASSERT_TRUE(g.status.ok()) << g.status.ToString();
  const std::span<const std::byte> layers = std::span<const std::byte>(bytes).subspan(kLayerBytes, 2 * kLayerBytes);
  EXPECT_EQ(Arena(g.offset, g.length), std::vector<std::byte>(layers.begin(), layers.end()));
  ASSERT_EQ(g.layer_checksums.size(), 2u);
  EXPECT_EQ(g.layer_checksums[1], BlockChecksum(layers.last(kLayerBytes)));
  EXPECT_EQ(counters_.layer_reads_followed_down.load(), 1);
  EXPECT_EQ(counters_.layer_reads.load(), 1);
  EXPECT_EQ(promoter.transient_bytes(), 2 * kLayerBytes) << "the pool holds the read once";
  EXPECT_EQ(host_->used_bytes(), 2 * kLayerBytes) << "the first try's space was given back";
  EXPECT_FALSE(Entry(Key(7)).has_value()) << "the block is not promoted";

  const Located gone = Store(8);
  ASSERT_TRUE(map_.Erase(Key(8)).ok());  // and no tier under it has it
  std::promise<PinGrant> missed;
  promoter.ReadLayers(Batch(missed), 0, Key(8), gone, LayerSpan{0, 1});
  EXPECT_EQ(missed.get_future().get().status.code(), StatusCode::kNotFound);
  EXPECT_EQ(counters_.layer_reads_followed_down.load(), 1) << "nothing under it to follow";
  EXPECT_EQ(promoter.transient_bytes(), 2 * kLayerBytes) << "the miss gave its share back";
  EXPECT_EQ(host_->used_bytes(), 2 * kLayerBytes);
  WaitIdle();
}

}  // namespace
}  // namespace kvtier

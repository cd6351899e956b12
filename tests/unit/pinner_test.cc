// Tests of the Pinner, which hands out and ends leases, driven without an
// Engine: real index shards over a real arena, a real Promoter reading
// from a MapTier below behind a gate (reads held until the test opens
// it). A host hit is pinned at once and released; a miss is NotFound and
// probed; a key whose demotion is being written waits and is pinned when
// it ends; a promotion is claimed once while a second pin waits on it; a
// layer span outside the block is InvalidArgument; RecordUses counts only
// committed blocks of the namespace; Release checks the lease's owner.
#include "daemon/engine/pinner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
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
constexpr NamespaceFingerprint kNs{0x914, 0x7e};
constexpr NamespaceFingerprint kOtherNs{0x914, 0x7f};
constexpr ConnectionId kConn = 5;
constexpr ConnectionId kOtherConn = 6;
constexpr ConnectionId kWriter = 7;
constexpr size_t kShards = 2;

BlockKey Key(uint64_t i) { return BlockKey{0x914, i}; }

std::vector<std::byte> BlockBytes(uint64_t i) {
  return ::kvtier::testing::LayeredBlockBytes(i, kBlockBytes, kLayerBytes);
}

std::vector<uint64_t> LayerSums(const std::vector<std::byte>& bytes) {
  std::vector<uint64_t> sums;
  for (uint32_t l = 0; l < kLayers; ++l) {
    sums.push_back(BlockChecksum(std::span<const std::byte>(bytes).subspan(l * kLayerBytes, kLayerBytes)));
  }
  return sums;
}

// The tier below, whose reads wait while it is closed (as a slow tier's
// do): Open starts the reads held meanwhile.
class GatedTier final : public ForwardingTier {
 public:
  using ForwardingTier::ForwardingTier;
  std::atomic<int> reads{0};

  void Close() {
    std::lock_guard lock(mu_);
    closed_ = true;
  }
  void Open() {
    std::vector<std::function<void()>> held;
    {
      std::lock_guard lock(mu_);
      closed_ = false;
      held.swap(held_);
    }
    for (auto& start : held) start();
  }
  size_t held() {
    std::lock_guard lock(mu_);
    return held_.size();
  }

  Status Read(const BlockKey& key, uint32_t first_layer, uint32_t last_layer, std::span<std::byte> dst,
              ReadDone done) override {
    ++reads;
    {
      std::lock_guard lock(mu_);
      if (closed_) {
        held_.push_back([this, key, first_layer, last_layer, dst, done = std::move(done)]() mutable {
          EXPECT_TRUE(ForwardingTier::Read(key, first_layer, last_layer, dst, std::move(done)).ok());
        });
        return Status::Ok();
      }
    }
    return ForwardingTier::Read(key, first_layer, last_layer, dst, std::move(done));
  }
  // The base class's: Read, then each layer hashed.
  Status ReadWithLayerChecksums(const BlockKey& key, uint32_t first_layer, uint32_t last_layer,
                                std::span<std::byte> dst, LayerReadDone done) override {
    return BlockTier::ReadWithLayerChecksums(key, first_layer, last_layer, dst, std::move(done));
  }

 private:
  std::mutex mu_;
  bool closed_ = false;
  std::vector<std::function<void()>> held_;
};

class PinnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    host_ = ::kvtier::testing::OpenTestHostTier(kBlocks * kBlockBytes);
    ASSERT_NE(host_, nullptr);
    shards_ = ::kvtier::testing::MakeShards(*host_, kShards);
    level_.tier = &below_;

    Promoter::Hooks hooks;
    hooks.io_started = [this] { ++io_started_; };
    hooks.io_finished = [this] { ++io_finished_; };
    hooks.allocate = [this](uint64_t bytes) { return host_->Allocate(bytes); };
    hooks.source = [this](size_t level) -> TierLevel& {
      EXPECT_EQ(level, 0u);
      return level_;
    };
    hooks.find_below = [this](const BlockKey& key, const NamespaceFingerprint& ns) { return FindOutside(key, ns); };
    hooks.pin = [this](BlockIndex& shard, ConnectionId connection, const BlockKey& key, uint64_t now_us,
                       bool with_layers) { return pinner_->PinLocked(shard, connection, key, now_us, with_layers); };
    hooks.layer_count = LayerCount;
    hooks.next_handle = [this] { return next_handle_++; };
    hooks.prefetch_read_ended = [](bool) {};
    promoter_ = std::make_unique<Promoter>(shards_, *host_, clock_, retries_, kBlocks * kBlockBytes, counters_,
                                           std::move(hooks));

    Pinner::Hooks pins;
    pins.find_outside = [this](const BlockKey& key, const NamespaceFingerprint& ns) { return FindOutside(key, ns); };
    pins.layer_count = LayerCount;
    pins.probe = [this](const NamespaceFingerprint& ns, std::span<const BlockKey> keys) {
      EXPECT_EQ(ns, kNs);
      std::lock_guard lock(mu_);
      probed_.insert(probed_.end(), keys.begin(), keys.end());
    };
    pins.note_prefetch_use = [this] { ++prefetch_uses_; };
    pins.uses_noted = [this] { ++uses_noted_; };
    pinner_ = std::make_unique<Pinner>(shards_, clock_, *promoter_, counters_, std::move(pins));
  }
  void TearDown() override {
    below_.Open();
    retries_.Stop();
    while (io_finished_.load() != io_started_.load()) std::this_thread::yield();
  }

  static uint32_t LayerCount(const NamespaceFingerprint&, uint64_t size) { return size == kBlockBytes ? kLayers : 1u; }
  std::optional<Located> FindOutside(const BlockKey& key, const NamespaceFingerprint& ns) {
    std::optional<BlockTier::BlockInfo> info = below_.Find(key);
    if (info && info->ns == ns) return Located{0, *info};
    return std::nullopt;
  }
  BlockIndex& ShardOf(const BlockKey& key) { return *shards_[ShardIndexOf(key, kShards)]; }

  // Block `i` written and committed in the host tier under `ns`, with the
  // checksum of each layer, as a Reserve and a Commit leave it.
  void Commit(uint64_t i, const NamespaceFingerprint& ns = kNs) {
    const std::vector<std::byte> bytes = BlockBytes(i);
    BlockIndex& shard = ShardOf(Key(i));
    MutexLock lock(shard.mu);
    ASSERT_TRUE(shard.Reserve(Key(i), ns, kBlockBytes, kWriter).ok());
    auto it = shard.index.find(Key(i));
    Result<HostTier::Extent> extent = host_->Allocate(kBlockBytes);
    ASSERT_TRUE(extent.ok());
    it->second.extent = *extent;
    it->second.allocated = true;
    std::copy(bytes.begin(), bytes.end(), host_->Bytes(*extent).begin());
    shard.CommitReserved(it, kWriter, BlockChecksum(bytes), LayerSums(bytes), next_handle_++, clock_.NowUs());
  }
  // Block `i` stored in the tier below.
  void Store(uint64_t i) {
    const std::vector<std::byte> bytes = BlockBytes(i);
    ASSERT_TRUE(map_.Write(kNs, Key(i), kLayers, bytes, [](Status) {}, BlockChecksum(bytes)).ok());
  }
  std::optional<BlockEntry> Entry(const BlockKey& key) {
    BlockIndex& shard = ShardOf(key);
    MutexLock lock(shard.mu);
    auto it = shard.index.find(key);
    if (it == shard.index.end()) return std::nullopt;
    return it->second;
  }
  std::vector<std::byte> Arena(uint64_t offset, uint64_t length) {
    std::span<std::byte> bytes = ::kvtier::testing::SlotBytes(*host_, offset, length);
    return std::vector<std::byte>(bytes.begin(), bytes.end());
  }
  // A PinAsync of `keys` whose grants arrive in the returned future.
  std::future<std::vector<PinGrant>> PinLater(std::promise<std::vector<PinGrant>>& landed,
                                              std::vector<BlockKey> keys, LayerSpan layers = {}) {
    pinner_->PinAsync(kConn, kNs, std::move(keys),
                      [&landed](std::vector<PinGrant> grants) { landed.set_value(std::move(grants)); }, layers);
    return landed.get_future();
  }
  Status ReleaseOne(ConnectionId connection, LeaseId lease) {
    std::vector<Status> out = pinner_->Release(connection, {&lease, 1});
    return out.at(0);
  }

  FakeClock clock_;
  EngineCounters counters_;
  std::unique_ptr<HostTier> host_;
  std::vector<std::unique_ptr<BlockIndex>> shards_;
  MapTier map_;
  GatedTier below_{map_};
  TierLevel level_;
  RetryScheduler retries_{"test.retries", clock_, 64};
  std::atomic<int> io_started_{0}, io_finished_{0}, prefetch_uses_{0}, uses_noted_{0};
  std::atomic<BlockHandle> next_handle_{1};
  std::mutex mu_;
  std::vector<BlockKey> probed_;
  std::unique_ptr<Promoter> promoter_;
  std::unique_ptr<Pinner> pinner_;
};

TEST_F(PinnerTest, AHostHitIsPinnedAtOnceAndReleased) {
  Commit(1);
  bool answered = false;
  std::vector<PinGrant> grants;
  pinner_->PinAsync(kConn, kNs, {Key(1)}, [&](std::vector<PinGrant> g) {
    grants = std::move(g);
    answered = true;
  });
  ASSERT_TRUE(answered) << "no key needed I/O: done runs inline";
  ASSERT_EQ(grants.size(), 1u);
  const PinGrant& g = grants[0];
  ASSERT_TRUE(g.status.ok()) << g.status.ToString();
  EXPECT_EQ(g.length, kBlockBytes);
  EXPECT_EQ(g.checksum, BlockChecksum(BlockBytes(1)));
  EXPECT_TRUE(g.layer_checksums.empty()) << "a plain pin does not ask for them";
  EXPECT_EQ(Arena(g.offset, g.length), BlockBytes(1));
  std::optional<BlockEntry> entry = Entry(Key(1));
  ASSERT_TRUE(entry.has_value());
  EXPECT_EQ(entry->state(), BlockState::kPinned);
  EXPECT_EQ(entry->hits, 1u) << "a pin is a use";
  EXPECT_EQ(counters_.pins.load(), 1);
  EXPECT_EQ(counters_.host_pinned_bytes.load(), static_cast<int64_t>(kBlockBytes));
  EXPECT_EQ(below_.reads.load(), 0);
  EXPECT_EQ(uses_noted_.load(), 1);

  EXPECT_TRUE(ReleaseOne(kConn, g.lease).ok());
  EXPECT_EQ(Entry(Key(1))->state(), BlockState::kCommitted);
  EXPECT_EQ(ReleaseOne(kConn, g.lease).code(), StatusCode::kNotFound) << "released already";
  EXPECT_EQ(counters_.releases.load(), 2);
  EXPECT_EQ(counters_.release_failures.load(), 1);
}

TEST_F(PinnerTest, AMissIsNotFoundAndOnlyUnknownKeysAreProbed) {
  Commit(3, kOtherNs);  // known to the host tier, under another namespace
  const std::vector<PinGrant> grants = pinner_->Pin(kConn, kNs, std::vector<BlockKey>{Key(2), Key(3)});
  ASSERT_EQ(grants.size(), 2u);
  EXPECT_EQ(grants[0].status.code(), StatusCode::kNotFound) << grants[0].status.ToString();
  EXPECT_EQ(grants[1].status.code(), StatusCode::kNotFound) << "another namespace's block is not this one";
  EXPECT_EQ(counters_.pin_misses.load(), 2);
  EXPECT_EQ(counters_.pins.load(), 0);
  std::lock_guard lock(mu_);
  EXPECT_EQ(probed_, std::vector<BlockKey>{Key(2)}) << "a key the host tier knows is not probed";
}

TEST_F(PinnerTest, AKeyBeingDemotedWaitsAndIsPinnedWhenItsWriteEnds) {
  Commit(4);
  BlockIndex& shard = ShardOf(Key(4));
  {
    MutexLock lock(shard.mu);
    const BlockEntry victim = shard.BeginDemotion(shard.index.find(Key(4)), 0);
    host_->Free(victim.extent);
  }
  std::promise<std::vector<PinGrant>> landed;
  std::future<std::vector<PinGrant>> grants = PinLater(landed, {Key(4)});
  EXPECT_EQ(grants.wait_for(std::chrono::milliseconds(0)), std::future_status::timeout)
      << "the block is in no tier's index while its write is in flight: the pin waits";
  EXPECT_EQ(counters_.pin_misses.load(), 0);
  // The write lands below, then the demotion ends and runs its waiters.
  Store(4);
  std::vector<std::function<void()>> waiters;
  {
    MutexLock lock(shard.mu);
    std::optional<BlockIndex::Demoting> ended = shard.EndDemotion(Key(4));
    ASSERT_TRUE(ended.has_value());
    waiters = std::move(ended->waiters);
  }
  ASSERT_EQ(waiters.size(), 1u);
  for (auto& retry : waiters) retry();
  const std::vector<PinGrant> g = grants.get();
  ASSERT_TRUE(g[0].status.ok()) << g[0].status.ToString();
  EXPECT_EQ(Arena(g[0].offset, g[0].length), BlockBytes(4)) << "promoted from the tier it was demoted to";
  EXPECT_EQ(counters_.promotions.load(), 1);
  EXPECT_TRUE(ReleaseOne(kConn, g[0].lease).ok());
}

TEST_F(PinnerTest, APromotionIsClaimedOnceWhileASecondPinWaitsOnIt) {
  Store(5);
  below_.Close();
  std::promise<std::vector<PinGrant>> first, second;
  std::future<std::vector<PinGrant>> a = PinLater(first, {Key(5)});
  std::future<std::vector<PinGrant>> b = PinLater(second, {Key(5)});
  std::optional<BlockEntry> entry = Entry(Key(5));
  ASSERT_TRUE(entry.has_value());
  EXPECT_EQ(entry->state(), BlockState::kPromoting) << "the first pin claimed the key";
  EXPECT_EQ(below_.reads.load(), 1) << "one read for both pins";
  EXPECT_EQ(below_.held(), 1u);
  EXPECT_EQ(a.wait_for(std::chrono::milliseconds(0)), std::future_status::timeout);
  EXPECT_EQ(b.wait_for(std::chrono::milliseconds(0)), std::future_status::timeout);
  below_.Open();
  const PinGrant ga = a.get()[0];
  const PinGrant gb = b.get()[0];
  ASSERT_TRUE(ga.status.ok()) << ga.status.ToString();
  ASSERT_TRUE(gb.status.ok()) << gb.status.ToString();
  EXPECT_EQ(ga.offset, gb.offset) << "one copy in the arena";
  EXPECT_NE(ga.lease, gb.lease) << "a lease each";
  EXPECT_EQ(Arena(ga.offset, ga.length), BlockBytes(5));
  EXPECT_EQ(counters_.promotions.load(), 1);
  EXPECT_EQ(Entry(Key(5))->pins, 2u);
  EXPECT_TRUE(ReleaseOne(kConn, ga.lease).ok());
  EXPECT_TRUE(ReleaseOne(kConn, gb.lease).ok());
  EXPECT_EQ(Entry(Key(5))->state(), BlockState::kCommitted);
}

TEST_F(PinnerTest, ALayerSpanOutsideTheBlockIsInvalidArgument) {
  Commit(6);  // in the host tier
  Store(7);   // only below
  const std::vector<BlockKey> keys{Key(6), Key(7)};
  for (LayerSpan bad : {LayerSpan{2, 5}, LayerSpan{3, 3}, LayerSpan{3, 1}}) {
    const std::vector<PinGrant> grants = pinner_->Pin(kConn, kNs, keys, bad);
    EXPECT_EQ(grants[0].status.code(), StatusCode::kInvalidArgument) << grants[0].status.ToString();
    EXPECT_EQ(grants[1].status.code(), StatusCode::kInvalidArgument) << grants[1].status.ToString();
  }
  EXPECT_EQ(counters_.pins.load(), 0);
  EXPECT_EQ(below_.reads.load(), 0);

  // Within it: the host block's layers in place, the other's read from below.
  const std::vector<PinGrant> grants = pinner_->Pin(kConn, kNs, keys, LayerSpan{1, 3});
  ASSERT_TRUE(grants[0].status.ok()) << grants[0].status.ToString();
  ASSERT_TRUE(grants[1].status.ok()) << grants[1].status.ToString();
  const std::vector<std::byte> host = BlockBytes(6);
  EXPECT_EQ(grants[0].length, 2 * kLayerBytes);
  EXPECT_EQ(grants[0].offset, grants[0].block_offset + kLayerBytes);
  EXPECT_EQ(grants[0].block_length, kBlockBytes);
  EXPECT_EQ(grants[0].checksum, BlockChecksum(host)) << "the whole block's";
  const std::vector<uint64_t> sums = LayerSums(host);
  EXPECT_EQ(grants[0].layer_checksums, std::vector<uint64_t>(sums.begin() + 1, sums.begin() + 3));
  const std::vector<std::byte> below = BlockBytes(7);
  EXPECT_EQ(Arena(grants[1].offset, grants[1].length),
            std::vector<std::byte>(below.begin() + kLayerBytes, below.begin() + 3 * kLayerBytes));
  EXPECT_EQ(grants[1].layer_checksums.size(), 2u);
  EXPECT_EQ(promoter_->transient_bytes(), 2 * kLayerBytes);
  EXPECT_FALSE(Entry(Key(7)).has_value()) << "a layer read does not promote";
  for (const PinGrant& g : grants) EXPECT_TRUE(ReleaseOne(kConn, g.lease).ok());
  EXPECT_EQ(promoter_->transient_bytes(), 0u) << "the lease's end gives the transient space back";
}

TEST_F(PinnerTest, RecordUsesCountsOnlyCommittedBlocksOfTheNamespace) {
  Commit(8);
  Commit(9, kOtherNs);
  {
    BlockIndex& shard = ShardOf(Key(10));  // reserved, never committed
    MutexLock lock(shard.mu);
    ASSERT_TRUE(shard.Reserve(Key(10), kNs, kBlockBytes, kWriter).ok());
  }
  {
    BlockIndex& shard = ShardOf(Key(12));  // read in by a prefetch, not used since
    MutexLock lock(shard.mu);
    shard.BeginPromotion(Key(12), kNs, kBlockBytes, /*prefetched=*/true);
    Result<HostTier::Extent> extent = host_->Allocate(kBlockBytes);
    ASSERT_TRUE(extent.ok());
    shard.CommitPromoted(shard.index.find(Key(12)), *extent, 0x12, {}, next_handle_++, clock_.NowUs());
  }
  clock_.SetUs(1000);
  const std::vector<BlockKey> keys{Key(8), Key(9), Key(10), Key(11), Key(12)};
  EXPECT_EQ(pinner_->RecordUses(kNs, keys), 2u);
  EXPECT_EQ(Entry(Key(8))->hits, 1u);
  EXPECT_EQ(Entry(Key(8))->last_use_us, 1000u);
  EXPECT_EQ(Entry(Key(9))->hits, 0u) << "another namespace's";
  EXPECT_EQ(Entry(Key(12))->hits, 1u);
  EXPECT_EQ(counters_.directory_uses.load(), 2);
  EXPECT_EQ(counters_.directory_stale_uses.load(), 3);
  EXPECT_EQ(prefetch_uses_.load(), 1) << "the prefetched block's first use";
  EXPECT_EQ(counters_.prefetches_on_time.load(), 1);
  EXPECT_EQ(uses_noted_.load(), 1);
  EXPECT_EQ(Entry(Key(8))->state(), BlockState::kCommitted) << "a reported use pins nothing";
}

TEST_F(PinnerTest, AReleaseOfAnotherConnectionsLeaseIsPermissionDenied) {
  Commit(13);
  const std::vector<PinGrant> grants = pinner_->Pin(kConn, kNs, std::vector<BlockKey>{Key(13)});
  ASSERT_TRUE(grants[0].status.ok());
  EXPECT_EQ(ReleaseOne(kOtherConn, grants[0].lease).code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(Entry(Key(13))->state(), BlockState::kPinned) << "still held by its owner";
  EXPECT_TRUE(ReleaseOne(kConn, grants[0].lease).ok());
  EXPECT_EQ(Entry(Key(13))->state(), BlockState::kCommitted);
  // A lease naming a shard past the last is no lease.
  EXPECT_EQ(ReleaseOne(kConn, LeaseId{200}).code(), StatusCode::kNotFound);
  EXPECT_EQ(counters_.release_failures.load(), 2);
}

}  // namespace
}  // namespace kvtier

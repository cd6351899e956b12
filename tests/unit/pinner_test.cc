// Tests of the Pinner, which hands out and ends leases, driven without an
// Engine: real index shards over a real arena, a real Promoter reading
// from a MapTier below behind a gate (reads held until the test opens it;
// tests/testing/pin_parts.h). A host hit is pinned at once and released; a miss is NotFound and
// probed; a key whose demotion is being written waits and is pinned when
// it ends; a promotion is claimed once while a second pin waits on it; a
// layer span outside the block is InvalidArgument; RecordUses counts only
// committed blocks of the namespace; Release checks the lease's owner;
// EndConnection ends a closing connection's reservations and leases only.
#include "daemon/engine/pinner.h"

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <mutex>
#include <optional>
#include <vector>

#include "common/checksum.h"
#include "daemon/engine/block_index.h"
#include "tests/testing/pin_parts.h"

namespace kvtier {
namespace {

constexpr NamespaceFingerprint kNs{0x914, 0x7e};
constexpr NamespaceFingerprint kOtherNs{0x914, 0x7f};
constexpr ConnectionId kConn = 5;
constexpr ConnectionId kOtherConn = 6;

class PinnerTest : public ::testing::Test, protected ::kvtier::testing::PinParts {
 protected:
  void Commit(uint64_t i, const NamespaceFingerprint& ns = kNs) { PinParts::Commit(i, ns); }
  void Store(uint64_t i) { PinParts::Store(i, kNs); }
  // A PinAsync of `keys` whose grants arrive in the returned future.
  std::future<std::vector<PinGrant>> PinLater(std::promise<std::vector<PinGrant>>& landed, std::vector<BlockKey> keys,
                                              LayerSpan layers = {}) {
    pinner_->PinAsync(
        kConn, kNs, std::move(keys), [&landed](std::vector<PinGrant> grants) { landed.set_value(std::move(grants)); },
        layers);
    return landed.get_future();
  }
  Status ReleaseOne(ConnectionId connection, LeaseId lease) {
    std::vector<Status> out = pinner_->Release(connection, {&lease, 1});
    return out.at(0);
  }
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
  BeginDemotion(4);
  std::promise<std::vector<PinGrant>> landed;
  std::future<std::vector<PinGrant>> grants = PinLater(landed, {Key(4)});
  EXPECT_EQ(grants.wait_for(std::chrono::milliseconds(0)), std::future_status::timeout)
      << "the block is in no tier's index while its write is in flight: the pin waits";
  EXPECT_EQ(counters_.pin_misses.load(), 0);
  // The write lands below, then the demotion ends and runs its waiters.
  Store(4);
  ASSERT_EQ(EndDemotion(4), 1u);
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

TEST_F(PinnerTest, EndConnectionEndsItsReservationsAndLeasesAndNothingElse) {
  // Block i reserved for `connection` with its arena room, as the Writer
  // leaves it until Commit.
  const auto reserve = [this](uint64_t i, ConnectionId connection) {
    BlockIndex& shard = ShardOf(Key(i));
    MutexLock lock(shard.mu);
    ASSERT_TRUE(shard.Reserve(Key(i), kNs, kBlockBytes, connection).ok());
    Result<HostTier::Extent> extent = host_->Allocate(kBlockBytes);
    ASSERT_TRUE(extent.ok());
    BlockEntry& entry = shard.index.at(Key(i));
    entry.extent = *extent;
    entry.allocated = true;
  };
  std::vector<bool> shard_used(kShards);
  for (uint64_t i = 20; i < 24; ++i) {
    reserve(i, kConn);
    shard_used[ShardIndexOf(Key(i), kShards)] = true;
  }
  ASSERT_EQ(shard_used, std::vector<bool>(kShards, true)) << "the test wants reservations in every shard";
  reserve(24, kOtherConn);
  Commit(25);
  Store(26);
  const std::vector<PinGrant> mine = pinner_->Pin(kConn, kNs, std::vector<BlockKey>{Key(25)});
  const std::vector<PinGrant> theirs = pinner_->Pin(kOtherConn, kNs, std::vector<BlockKey>{Key(25)});
  const std::vector<PinGrant> layer = pinner_->Pin(kConn, kNs, std::vector<BlockKey>{Key(26)}, LayerSpan{1, 2});
  ASSERT_TRUE(mine[0].status.ok());
  ASSERT_TRUE(theirs[0].status.ok());
  ASSERT_TRUE(layer[0].status.ok()) << layer[0].status.ToString();
  ASSERT_EQ(promoter_->transient_bytes(), kLayerBytes);
  const int64_t releases = counters_.releases.load();

  pinner_->EndConnection(kConn);
  for (uint64_t i = 20; i < 24; ++i) EXPECT_FALSE(Entry(Key(i)).has_value()) << i;
  EXPECT_EQ(Entry(Key(24))->state(), BlockState::kReserved) << "another connection's";
  EXPECT_EQ(Entry(Key(25))->state(), BlockState::kPinned) << "the other connection's lease stays";
  EXPECT_EQ(Entry(Key(25))->pins, 1u);
  EXPECT_EQ(promoter_->transient_bytes(), 0u) << "the layer read's space went back with its lease";
  EXPECT_EQ(host_->used_bytes(), 2 * kBlockBytes) << "block 24's reservation and block 25";
  EXPECT_EQ(counters_.releases.load(), releases) << "not counted as releases";
  EXPECT_EQ(ReleaseOne(kConn, mine[0].lease).code(), StatusCode::kNotFound) << "ended already";
  EXPECT_TRUE(ReleaseOne(kOtherConn, theirs[0].lease).ok());
  EXPECT_EQ(Entry(Key(25))->state(), BlockState::kCommitted);
}

}  // namespace
}  // namespace kvtier

// Tests of BlockIndex, where every block of the host tier changes state:
// each transition of block_entry.h's diagram keeps the maps, the policy,
// the byte counts and the arena in step, and a transition from a state the
// diagram does not allow stops the daemon (a broken invariant).
#include "daemon/engine/block_index.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "tests/testing/test_daemon.h"

namespace kvtier {
namespace {

constexpr uint64_t kBlockBytes = 64 << 10;
constexpr NamespaceFingerprint kNs{0xb10c, 0x1d};
constexpr ConnectionId kWriter = 7;
constexpr ConnectionId kReader = 9;

BlockKey Key(uint64_t i) { return BlockKey{0x1dc5, i}; }

class BlockIndexTest : public ::testing::Test {
 protected:
  void SetUp() override {
    host_ = ::kvtier::testing::OpenTestHostTier(8 * kBlockBytes);
    ASSERT_NE(host_, nullptr);
    index_ = std::make_unique<BlockIndex>(0, 1, MakeEvictionPolicy("lru"), *host_);
  }

  // Reserves and commits `key`, as a Reserve and a Commit do.
  BlockIndex::Entries::iterator Committed(const BlockKey& key, uint64_t now_us = 1) {
    EXPECT_TRUE(index_->Reserve(key, kNs, kBlockBytes, kWriter).ok());
    auto it = index_->index.find(key);
    Result<HostTier::Extent> extent = host_->Allocate(kBlockBytes);
    EXPECT_TRUE(extent.ok());
    it->second.extent = *extent;
    it->second.allocated = true;
    index_->CommitReserved(it, kWriter, 0xc0ffee, {}, next_handle_++, now_us);
    return it;
  }

  std::unique_ptr<HostTier> host_;
  std::unique_ptr<BlockIndex> index_;
  BlockHandle next_handle_ = 1;
};

TEST_F(BlockIndexTest, ACommittedBlockIsVisibleCountedAndAVictim) {
  auto it = Committed(Key(1));
  EXPECT_EQ(it->second.state(), BlockState::kCommitted);
  EXPECT_TRUE(it->second.cached());
  EXPECT_EQ(it->second.checksum, 0xc0ffeeu);
  EXPECT_EQ(index_->stored_bytes, kBlockBytes);
  EXPECT_EQ(index_->committed.at(it->second.handle), Key(1));
  EXPECT_TRUE(index_->reserved.empty()) << "a committed block is no longer its writer's reservation";
  ASSERT_TRUE(index_->policy->Victim().has_value());
  EXPECT_EQ(index_->policy->Victim()->handle, it->second.handle);
}

TEST_F(BlockIndexTest, AKeyTakenInAnyStateIsNotReservedAgain) {
  ASSERT_TRUE(index_->Reserve(Key(1), kNs, kBlockBytes, kWriter).ok());
  Status again = index_->Reserve(Key(1), kNs, kBlockBytes, kReader);
  EXPECT_EQ(again.code(), StatusCode::kAlreadyExists);
  EXPECT_NE(again.message().find("being written"), std::string::npos) << again.ToString();
  index_->BeginPromotion(Key(2), kNs, kBlockBytes, false);
  again = index_->Reserve(Key(2), kNs, kBlockBytes, kWriter);
  EXPECT_NE(again.message().find("being read in"), std::string::npos) << again.ToString();
  Committed(Key(3));
  again = index_->Reserve(Key(3), kNs, kBlockBytes, kWriter);
  EXPECT_NE(again.message().find("cached"), std::string::npos) << again.ToString();
}

TEST_F(BlockIndexTest, DroppedReservationsFreeTheirSpaceAndOnlyTheWritersGo) {
  ASSERT_TRUE(index_->Reserve(Key(1), kNs, kBlockBytes, kWriter).ok());
  auto it = index_->index.find(Key(1));
  it->second.extent = *host_->Allocate(kBlockBytes);
  it->second.allocated = true;
  ASSERT_TRUE(index_->Reserve(Key(2), kNs, kBlockBytes, kWriter).ok());
  EXPECT_FALSE(index_->DropReservation(kReader, Key(1))) << "another connection's reservation";
  EXPECT_EQ(host_->used_bytes(), kBlockBytes);
  index_->DropReservations(kWriter);
  EXPECT_TRUE(index_->index.empty());
  EXPECT_TRUE(index_->reserved.empty());
  EXPECT_EQ(host_->used_bytes(), 0u);
}

TEST_F(BlockIndexTest, APinnedBlockIsNoVictimUntilItsLastPinGoes) {
  auto it = Committed(Key(1));
  bool prefetched = true;
  const LeaseId first = index_->Pin(Key(1), it->second, kReader, 5, &prefetched);
  EXPECT_FALSE(prefetched);
  const LeaseId second = index_->Pin(Key(1), it->second, kReader, 6, &prefetched);
  EXPECT_EQ(it->second.state(), BlockState::kPinned);
  EXPECT_EQ(it->second.hits, 2u);
  EXPECT_FALSE(index_->policy->Victim().has_value());
  EXPECT_EQ(index_->Unpin(*index_->leases.Take(kReader, first), 7), 0u);
  EXPECT_EQ(it->second.state(), BlockState::kPinned) << "one pin is left";
  EXPECT_EQ(index_->Unpin(*index_->leases.Take(kReader, second), 8), 0u);
  EXPECT_EQ(it->second.state(), BlockState::kCommitted);
  EXPECT_TRUE(index_->policy->Victim().has_value());
}

TEST_F(BlockIndexTest, AnErasedPinnedBlockIsFreedWithItsLastLease) {
  auto it = Committed(Key(1));
  bool prefetched = false;
  const LeaseId lease = index_->Pin(Key(1), it->second, kReader, 5, &prefetched);
  index_->RemoveCommitted(it);
  EXPECT_EQ(index_->index.count(Key(1)), 0u) << "invisible at once";
  EXPECT_EQ(index_->stored_bytes, 0u);
  ASSERT_EQ(index_->zombies.size(), 1u);
  EXPECT_EQ(index_->zombies.begin()->second.state(), BlockState::kErasedWhilePinned);
  EXPECT_EQ(host_->used_bytes(), kBlockBytes) << "its reader still reads it";
  index_->Unpin(*index_->leases.Take(kReader, lease), 6);
  EXPECT_TRUE(index_->zombies.empty());
  EXPECT_EQ(host_->used_bytes(), 0u);
}

TEST_F(BlockIndexTest, APromotionCommitsWhenItsReadLandsAndLeavesNothingWhenItFails) {
  BlockEntry& entry = index_->BeginPromotion(Key(1), kNs, kBlockBytes, /*prefetched=*/true);
  EXPECT_EQ(entry.state(), BlockState::kPromoting);
  EXPECT_EQ(index_->prefetched_bytes, kBlockBytes);
  EXPECT_FALSE(entry.cached());
  auto it = index_->index.find(Key(1));
  index_->CommitPromoted(it, *host_->Allocate(kBlockBytes), 0xabc, {1, 2}, next_handle_++, 3);
  EXPECT_EQ(it->second.state(), BlockState::kCommitted);
  EXPECT_EQ(it->second.layer_checksums, (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(index_->stored_bytes, kBlockBytes);

  index_->BeginPromotion(Key(2), kNs, kBlockBytes, /*prefetched=*/true);
  auto failed = index_->index.find(Key(2));
  index_->EraseWhilePromoting(failed);
  EXPECT_EQ(failed->second.state(), BlockState::kErasedWhilePromoting);
  index_->FailPromotion(failed, *host_->Allocate(kBlockBytes));
  EXPECT_EQ(index_->index.count(Key(2)), 0u);
  EXPECT_EQ(index_->prefetched_bytes, kBlockBytes) << "only Key(1)'s prefetch is still unused";
  EXPECT_EQ(host_->used_bytes(), kBlockBytes) << "the failed read's extent is freed";
}

TEST_F(BlockIndexTest, ADemotionLeavesTheIndexAndAnEraseMeanwhileIsRemembered) {
  auto it = Committed(Key(1));
  const BlockEntry entry = index_->BeginDemotion(it, 2);
  EXPECT_EQ(entry.state(), BlockState::kDemoting);
  EXPECT_EQ(entry.checksum, 0xc0ffeeu);
  EXPECT_EQ(index_->index.count(Key(1)), 0u);
  EXPECT_EQ(index_->stored_bytes, 0u);
  EXPECT_FALSE(index_->policy->Victim().has_value());
  auto demoting = index_->demoting.find(Key(1));
  ASSERT_NE(demoting, index_->demoting.end());
  EXPECT_EQ(demoting->second.level, 2u);
  index_->EraseWhileDemoting(demoting);
  std::optional<BlockIndex::Demoting> ended = index_->EndDemotion(Key(1));
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->state(), BlockState::kErasedWhileDemoting);
  EXPECT_FALSE(index_->EndDemotion(Key(1)).has_value());
  host_->Free(entry.extent);  // the caller frees it once the tier copied it
}

TEST_F(BlockIndexTest, ALayerReadIsHeldByOneLeaseAndGivesItsBytesBack) {
  const LeaseId lease = index_->AddLayerRead(Key(1), *host_->Allocate(4096), 4096, next_handle_++, kReader);
  EXPECT_EQ(index_->index.count(Key(1)), 0u) << "never visible";
  EXPECT_EQ(index_->Unpin(*index_->leases.Take(kReader, lease), 2), 4096u);
  EXPECT_EQ(host_->used_bytes(), 0u);
}

using BlockIndexDeathTest = BlockIndexTest;

TEST_F(BlockIndexDeathTest, TransitionsTheDiagramDoesNotAllowStopTheDaemon) {
  auto it = Committed(Key(1));
  EXPECT_DEATH(index_->CommitReserved(it, kWriter, 0, {}, next_handle_++, 2), "commit of no reservation");
  EXPECT_DEATH(index_->CommitPromoted(it, {}, 0, {}, next_handle_++, 2), "not being promoted");
  bool prefetched = false;
  index_->Pin(Key(1), it->second, kReader, 3, &prefetched);
  EXPECT_DEATH(index_->BeginDemotion(it, 0), "demotion of a block pinned");
  EXPECT_DEATH(index_->BeginPromotion(Key(1), kNs, kBlockBytes, false), "promotion of a key the index holds");
  ASSERT_TRUE(index_->Reserve(Key(2), kNs, kBlockBytes, kWriter).ok());
  auto reserved = index_->index.find(Key(2));
  EXPECT_DEATH(index_->Pin(Key(2), reserved->second, kReader, 4, &prefetched), "pin of a block not cached");
  EXPECT_DEATH(index_->RemoveCommitted(reserved), "removal of a block not cached");
}

}  // namespace
}  // namespace kvtier

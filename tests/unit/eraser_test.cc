// Tests of the Eraser, a block's removal from every tier, driven without an
// Engine: real index shards over a real arena and two MapTiers below
// (tests/testing/pin_parts.h), with the tier above a recording hook. A
// committed block goes from the host tier and every copy below; a pinned
// one lives on as a zombie; a block being promoted or demoted is marked so
// its move ends as a miss or is undone, and what the tiers below hold of
// it goes too; another namespace's blocks stay.
#include "daemon/engine/eraser.h"

#include <gtest/gtest.h>

#include <memory>
#include <tuple>
#include <vector>

#include "common/checksum.h"
#include "daemon/engine/block_index.h"
#include "tests/testing/pin_parts.h"

namespace kvtier {
namespace {

constexpr NamespaceFingerprint kNs{0x914, 0xe1};
constexpr NamespaceFingerprint kOtherNs{0x914, 0xe2};
constexpr ConnectionId kConn = 4;

class EraserTest : public ::testing::Test, protected ::kvtier::testing::PinParts {
 protected:
  EraserTest() {
    for (BlockTier* tier : {static_cast<BlockTier*>(&map_), static_cast<BlockTier*>(&lower_)}) {
      auto level = std::make_unique<TierLevel>();
      level->tier = tier;
      levels_.push_back(std::move(level));
    }
  }

  Eraser& Make(bool with_above) {
    Eraser::Hooks hooks;
    if (with_above) {
      hooks.erase_above = [this](const NamespaceFingerprint& ns, const BlockKey& key, bool moving) {
        above_calls_.emplace_back(ns, key, moving);
        return key == Key(above_holds_);
      };
    }
    eraser_ = std::make_unique<Eraser>(shards_, levels_, counters_, std::move(hooks));
    return *eraser_;
  }
  // Block `i` of `ns` stored in the lowest tier.
  void StoreLower(uint64_t i, const NamespaceFingerprint& ns) {
    const std::vector<std::byte> bytes = BlockBytes(i);
    ASSERT_TRUE(lower_
                    .Write(
                        ns, Key(i), kLayers, bytes, [](Status) {}, BlockChecksum(bytes))
                    .ok());
  }
  size_t EraseOne(uint64_t i, const NamespaceFingerprint& ns = kNs) {
    const BlockKey key = Key(i);
    return eraser_->Erase(ns, {&key, 1});
  }

  ::kvtier::testing::MapTier lower_;
  std::vector<std::unique_ptr<TierLevel>> levels_;  // map_, then lower_
  std::unique_ptr<Eraser> eraser_;
  std::vector<std::tuple<NamespaceFingerprint, BlockKey, bool>> above_calls_;
  uint64_t above_holds_ = ~uint64_t{0};  // the block the tier above says it erased
};

TEST_F(EraserTest, ACommittedBlockGoesFromEveryTierAndOnlyItsNamespaces) {
  Make(false);
  Commit(1, kNs);
  Store(1, kNs);
  StoreLower(1, kNs);
  Commit(2, kOtherNs);
  Store(2, kOtherNs);
  StoreLower(3, kNs);  // only in the lowest tier

  const std::vector<BlockKey> keys{Key(1), Key(2), Key(3), Key(4)};
  EXPECT_EQ(eraser_->Erase(kNs, keys), 2u) << "blocks 1 and 3; 2 is another namespace's, 4 is nowhere";
  EXPECT_FALSE(Entry(Key(1)).has_value());
  EXPECT_FALSE(map_.Find(Key(1)).has_value());
  EXPECT_FALSE(lower_.Find(Key(1)).has_value());
  EXPECT_FALSE(lower_.Find(Key(3)).has_value());
  EXPECT_EQ(Entry(Key(2))->state(), BlockState::kCommitted);
  EXPECT_TRUE(map_.Find(Key(2)).has_value());
  EXPECT_EQ(host_->used_bytes(), kBlockBytes) << "block 1's space is back";
  EXPECT_EQ(counters_.erases.load(), 2);
}

TEST_F(EraserTest, AnEraseOfThisNodeLeavesTheLevelsOffIt) {
  Make(false);
  levels_[1]->reported = Tier::kRemote;  // the lowest level is off this node (the remote pool, a peer)
  Commit(1, kNs);
  Store(1, kNs);
  StoreLower(1, kNs);
  const BlockKey key = Key(1);
  EXPECT_EQ(eraser_->Erase(kNs, {&key, 1}, Eraser::Reach::kThisNode), 1u);
  EXPECT_FALSE(Entry(key).has_value());
  EXPECT_FALSE(map_.Find(key).has_value());
  EXPECT_TRUE(lower_.Find(key).has_value()) << "the shared pool keeps its copy";
  EXPECT_EQ(eraser_->Erase(kNs, {&key, 1}), 1u) << "every tier: the pool's copy goes too";
  EXPECT_FALSE(lower_.Find(key).has_value());
}

TEST_F(EraserTest, APinnedBlockLivesOnAsAZombieUntilItsLastRelease) {
  Make(false);
  Commit(5, kNs);
  const std::vector<PinGrant> pins = pinner_->Pin(kConn, kNs, std::vector<BlockKey>{Key(5)});
  ASSERT_TRUE(pins[0].status.ok());
  EXPECT_EQ(EraseOne(5), 1u);
  EXPECT_FALSE(Entry(Key(5)).has_value()) << "invisible";
  EXPECT_EQ(host_->used_bytes(), kBlockBytes) << "its bytes stay while pinned";
  EXPECT_EQ(Arena(pins[0].offset, pins[0].length), BlockBytes(5));
  EXPECT_TRUE(pinner_->Release(kConn, {&pins[0].lease, 1})[0].ok());
  EXPECT_EQ(host_->used_bytes(), 0u);
}

TEST_F(EraserTest, ABlockBeingPromotedOrDemotedIsMarkedAndErasedBelow) {
  Make(false);
  Store(6, kNs);
  {
    BlockIndex& shard = ShardOf(Key(6));
    MutexLock lock(shard.mu);
    shard.BeginPromotion(Key(6), kNs, kBlockBytes, /*prefetched=*/false);
  }
  Commit(7, kNs);
  BeginDemotion(7);
  Store(7, kOtherNs);  // what the tier holds under the key: a write in flight's, whatever its namespace

  EXPECT_EQ(EraseOne(6), 1u);
  EXPECT_EQ(Entry(Key(6))->state(), BlockState::kErasedWhilePromoting) << "the read ends as a miss";
  EXPECT_FALSE(map_.Find(Key(6)).has_value());
  EXPECT_EQ(EraseOne(7), 1u);
  {
    BlockIndex& shard = ShardOf(Key(7));
    MutexLock lock(shard.mu);
    ASSERT_EQ(shard.demoting.count(Key(7)), 1u);
    EXPECT_EQ(shard.demoting.at(Key(7)).state(), BlockState::kErasedWhileDemoting);
  }
  EXPECT_FALSE(map_.Find(Key(7)).has_value()) << "moving: erased below whatever it is stored under";
  EXPECT_EQ(EndDemotion(7), 0u);
  EXPECT_EQ(EraseOne(8, kOtherNs), 0u);
}

TEST_F(EraserTest, TheTierAboveIsAskedForEveryKeyAndCounts) {
  Make(true);
  above_holds_ = 9;
  Store(10, kNs);
  {
    BlockIndex& shard = ShardOf(Key(10));
    MutexLock lock(shard.mu);
    shard.BeginPromotion(Key(10), kNs, kBlockBytes, /*prefetched=*/false);
  }
  EXPECT_EQ(EraseOne(9), 1u) << "held only above";
  EXPECT_EQ(EraseOne(10), 1u);
  EXPECT_EQ(EraseOne(11), 0u);
  ASSERT_EQ(above_calls_.size(), 3u);
  EXPECT_EQ(above_calls_[0], std::make_tuple(kNs, Key(9), false));
  EXPECT_EQ(above_calls_[1], std::make_tuple(kNs, Key(10), true)) << "it was moving";
  EXPECT_EQ(above_calls_[2], std::make_tuple(kNs, Key(11), false));
  EXPECT_EQ(counters_.erases.load(), 2);
}

}  // namespace
}  // namespace kvtier

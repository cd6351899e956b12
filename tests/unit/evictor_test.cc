// Tests of the Evictor, where the host tier makes room and a victim's
// place below is decided: the lowest-ranked block of every shard goes
// first, to the first tier below that takes it (none when a tier below
// holds it already), is dropped and counted when none does, expired holds
// go before anything is evicted, and nothing evictable is NoSpace.
#include "daemon/engine/evictor.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "daemon/engine/block_index.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/index_shards.h"
#include "tests/testing/map_tier.h"
#include "tests/testing/test_daemon.h"

namespace kvtier {
namespace {

constexpr uint64_t kBlockBytes = 64 << 10;
constexpr size_t kBlocks = 8;
constexpr NamespaceFingerprint kNs{0xe71c, 0x7};
constexpr ConnectionId kWriter = 3;
constexpr size_t kShards = 2;

BlockKey Key(uint64_t i) { return BlockKey{0xe71c, i}; }

struct Demoted {
  size_t level;
  BlockKey key;
  uint64_t size;
  uint64_t checksum;
};

class EvictorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    host_ = ::kvtier::testing::OpenTestHostTier(kBlocks * kBlockBytes);
    ASSERT_NE(host_, nullptr);
    shards_ = ::kvtier::testing::MakeShards(*host_, kShards);
  }

  // Adds a tier below (after those added before) admitting by `admission`.
  ::kvtier::testing::MapTier& AddLevel(AdmissionPolicyId admission) {
    tiers_.push_back(std::make_unique<::kvtier::testing::MapTier>());
    auto level = std::make_unique<TierLevel>();
    level->tier = tiers_.back().get();
    auto made = TierAdmission::Create(admission, DwpdOptions{}, 0, *level->tier, clock_);
    EXPECT_TRUE(made.ok()) << made.status().ToString();
    level->admission = std::move(made).value();
    below_.push_back(std::move(level));
    return *tiers_.back();
  }

  Evictor& Make() {
    Evictor::Hooks hooks;
    hooks.release_expired_holds = [this] { ++expiry_sweeps_; };
    hooks.demote = [this](size_t level, const NamespaceFingerprint& ns, const BlockKey& key, HostTier::Extent extent,
                          uint64_t size, uint64_t checksum) {
      EXPECT_EQ(ns, kNs);
      EXPECT_EQ(extent.length, size) << "the victim's bytes are still there while they are copied";
      demoted_.push_back(Demoted{level, key, size, checksum});
    };
    evictor_ = std::make_unique<Evictor>(shards_, *host_, below_, lineage_, clock_, /*lookahead_us=*/0, counters_,
                                         std::move(hooks));
    return *evictor_;
  }

  BlockIndex& ShardOf(const BlockKey& key) { return *shards_[ShardIndexOf(key, kShards)]; }

  // Commits `key` at time `now_us` (its recency) with `hits` uses, as a
  // Reserve and a Commit do.
  void Commit(const BlockKey& key, uint64_t now_us, uint32_t hits = 0) {
    BlockIndex& shard = ShardOf(key);
    MutexLock lock(shard.mu);
    ASSERT_TRUE(shard.Reserve(key, kNs, kBlockBytes, kWriter).ok());
    auto it = shard.index.find(key);
    Result<HostTier::Extent> extent = host_->Allocate(kBlockBytes);
    ASSERT_TRUE(extent.ok());
    it->second.extent = *extent;
    it->second.allocated = true;
    shard.CommitReserved(it, kWriter, 0xc0de0000 + key.lo, {}, next_handle_++, now_us);
    it->second.hits = hits;
  }
  // Fills the arena with blocks 0..kBlocks-1, block i committed at time i + 1.
  void Fill(uint32_t hits = 0) {
    for (uint64_t i = 0; i < kBlocks; ++i) Commit(Key(i), i + 1, hits);
  }
  bool InHost(const BlockKey& key) {
    BlockIndex& shard = ShardOf(key);
    MutexLock lock(shard.mu);
    return shard.index.count(key) != 0;
  }

  ::kvtier::testing::FakeClock clock_;
  EngineCounters counters_;
  Lineage lineage_{1024};
  std::unique_ptr<HostTier> host_;
  std::vector<std::unique_ptr<BlockIndex>> shards_;
  std::vector<std::unique_ptr<::kvtier::testing::MapTier>> tiers_;
  std::vector<std::unique_ptr<TierLevel>> below_;
  std::unique_ptr<Evictor> evictor_;
  std::vector<Demoted> demoted_;
  int expiry_sweeps_ = 0;
  BlockHandle next_handle_ = 1;
};

TEST_F(EvictorTest, AnAllocationEvictsTheLowestRankedBlockOfEveryShard) {
  Fill();
  Evictor& evictor = Make();
  ASSERT_FALSE(host_->Allocate(kBlockBytes).ok()) << "the arena is full";
  Result<HostTier::Extent> extent = evictor.Allocate(kBlockBytes);
  ASSERT_TRUE(extent.ok()) << extent.status().ToString();
  EXPECT_FALSE(InHost(Key(0))) << "the least recently used block, whichever shard holds it";
  for (uint64_t i = 1; i < kBlocks; ++i) EXPECT_TRUE(InHost(Key(i))) << i;
  EXPECT_EQ(counters_.evictions.load(), 1);
  EXPECT_EQ(expiry_sweeps_, 1) << "expired holds go before anything is evicted";
  EXPECT_EQ(counters_.admission_drops.load(), 0) << "with no tier below, a victim is not an admission drop";
  EXPECT_TRUE(demoted_.empty());
}

TEST_F(EvictorTest, AVictimGoesToTheFirstTierBelowThatTakesIt) {
  AddLevel(AdmissionPolicyId::kSecondHit);
  AddLevel(AdmissionPolicyId::kAll);
  Commit(Key(0), 1, /*hits=*/0);  // no evidence of reuse: the first tier refuses it
  Commit(Key(1), 2, /*hits=*/1);
  for (uint64_t i = 2; i < kBlocks; ++i) Commit(Key(i), i + 1, 1);
  Evictor& evictor = Make();
  ASSERT_TRUE(evictor.Allocate(kBlockBytes).ok());
  ASSERT_TRUE(evictor.Allocate(kBlockBytes).ok());
  ASSERT_EQ(demoted_.size(), 2u);
  EXPECT_EQ(demoted_[0].level, 1u);
  EXPECT_EQ(demoted_[0].key, Key(0));
  EXPECT_EQ(demoted_[0].size, kBlockBytes);
  EXPECT_EQ(demoted_[0].checksum, 0xc0de0000u);
  EXPECT_EQ(demoted_[1].level, 0u);
  EXPECT_EQ(demoted_[1].key, Key(1));
  EXPECT_FALSE(InHost(Key(0)));
  EXPECT_FALSE(InHost(Key(1)));
  EXPECT_EQ(counters_.admission_drops.load(), 0);
}

TEST_F(EvictorTest, AVictimNoTierTakesIsDroppedAndCounted) {
  AddLevel(AdmissionPolicyId::kSecondHit);
  Fill(/*hits=*/0);
  Evictor& evictor = Make();
  ASSERT_TRUE(evictor.Allocate(kBlockBytes).ok());
  EXPECT_TRUE(demoted_.empty());
  EXPECT_FALSE(InHost(Key(0)));
  EXPECT_EQ(counters_.admission_drops.load(), 1);
}

TEST_F(EvictorTest, AVictimATierBelowHoldsCostsNoWrite) {
  ::kvtier::testing::MapTier& nvme = AddLevel(AdmissionPolicyId::kAll);
  Fill();
  std::vector<std::byte> bytes(kBlockBytes, std::byte{7});
  ASSERT_TRUE(nvme.Write(
                      kNs, Key(0), 1, bytes, [](Status) {}, std::nullopt)
                  .ok());
  Evictor& evictor = Make();
  ASSERT_TRUE(evictor.Allocate(kBlockBytes).ok());
  EXPECT_TRUE(demoted_.empty()) << "promoted from there, so still there";
  EXPECT_FALSE(InHost(Key(0)));
  EXPECT_EQ(counters_.admission_drops.load(), 0);
}

TEST_F(EvictorTest, NothingEvictableIsNoSpace) {
  Fill();
  for (uint64_t i = 0; i < kBlocks; ++i) {
    BlockIndex& shard = ShardOf(Key(i));
    MutexLock lock(shard.mu);
    bool prefetched = false;
    shard.Pin(Key(i), shard.index.at(Key(i)), kWriter, 100, &prefetched);
  }
  Evictor& evictor = Make();
  Result<HostTier::Extent> extent = evictor.Allocate(kBlockBytes);
  ASSERT_FALSE(extent.ok());
  EXPECT_EQ(extent.status().code(), StatusCode::kNoSpace);
  EXPECT_NE(extent.status().message().find("nothing is evictable"), std::string::npos) << extent.status().ToString();
  EXPECT_EQ(counters_.eviction_failures.load(), 1);
  EXPECT_GE(expiry_sweeps_, 1) << "expired holds are released before giving up";
  for (uint64_t i = 0; i < kBlocks; ++i) EXPECT_TRUE(InHost(Key(i))) << "a pinned block is never evicted";
}

TEST_F(EvictorTest, AdmissionFactsComeFromTheLineageAndEveryTier) {
  ::kvtier::testing::MapTier& nvme = AddLevel(AdmissionPolicyId::kAll);
  Evictor& evictor = Make();
  // Key(2)'s parent is Key(1), in conversation 9.
  const std::vector<BlockKey> chain{Key(1), Key(2)};
  lineage_.Record(chain, 9);
  EXPECT_FALSE(evictor.HeldAnywhere(Key(1)));
  TierAdmission::Facts facts = evictor.GatherFacts(Key(2), 3);
  EXPECT_EQ(facts.uses, 3u);
  EXPECT_FALSE(facts.parent_held);
  EXPECT_EQ(facts.conversation, Lineage::State::kOpen);
  std::vector<std::byte> bytes(kBlockBytes, std::byte{1});
  ASSERT_TRUE(nvme.Write(
                      kNs, Key(1), 1, bytes, [](Status) {}, std::nullopt)
                  .ok());
  EXPECT_TRUE(evictor.HeldAnywhere(Key(1))) << "held in a tier below";
  EXPECT_TRUE(evictor.GatherFacts(Key(2), 0).parent_held);
  ASSERT_TRUE(nvme.Erase(Key(1)).ok());
  Commit(Key(1), 5);
  EXPECT_TRUE(evictor.HeldAnywhere(Key(1))) << "held in the host tier";
  lineage_.SetConversation(9, false);
  EXPECT_EQ(evictor.GatherFacts(Key(2), 0).conversation, Lineage::State::kClosed);
  // A key no hint named: no evidence either way.
  EXPECT_TRUE(evictor.GatherFacts(Key(50), 0).parent_held);
}

}  // namespace
}  // namespace kvtier

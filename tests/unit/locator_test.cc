// Tests of the Locator, which answers lookups, driven without an Engine:
// real index shards over a real arena, MapTiers below (one behind a
// prober that learns of blocks only when asked) and above. A chain is
// placed tier by tier up to its first miss, each key in the highest place
// that holds it (the tier above first); a block reserved, of another
// namespace, or only being demoted is placed as the contract says; steps
// count one lookup at the end; a prober is asked once, for the keys from
// the first unknown one on.
#include "daemon/engine/locator.h"

#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "daemon/engine/block_index.h"
#include "tests/testing/index_shards.h"
#include "tests/testing/map_tier.h"
#include "tests/testing/test_daemon.h"
#include "tiers/forwarding_tier.h"

namespace kvtier {
namespace {

using ::kvtier::testing::MapTier;

constexpr uint64_t kBlockBytes = 4 << 10;
constexpr size_t kBlocks = 8;
constexpr NamespaceFingerprint kNs{0x10c, 0x1};
constexpr NamespaceFingerprint kOtherNs{0x10c, 0x2};
constexpr ConnectionId kConn = 6;
constexpr size_t kShards = 2;

BlockKey Key(uint64_t i) { return BlockKey{0x10c, i}; }

// A tier that learns of a block (one of `learnable`) only when probed for
// it, as the remote tier does for blocks other daemons wrote.
class ProbingTier final : public ForwardingTier, public Prober {
 public:
  explicit ProbingTier(MapTier& inner) : ForwardingTier(inner), map_(inner) {}
  std::set<uint64_t> learnable;
  std::vector<std::vector<BlockKey>> probes;  // the keys of each Probe

  Prober* prober() override { return this; }
  void Probe(const NamespaceFingerprint& ns, std::span<const BlockKey> keys) override {
    probes.emplace_back(keys.begin(), keys.end());
    for (const BlockKey& key : keys) {
      if (learnable.count(key.lo) == 0) continue;
      const std::vector<std::byte> bytes(kBlockBytes, std::byte{7});
      EXPECT_TRUE(map_.Write(
                          ns, key, 1, bytes, [](Status) {}, std::nullopt)
                      .ok());
    }
  }

 private:
  MapTier& map_;
};

class LocatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    host_ = ::kvtier::testing::OpenTestHostTier(kBlocks * kBlockBytes);
    ASSERT_NE(host_, nullptr);
    shards_ = ::kvtier::testing::MakeShards(*host_, kShards);
    AddLevel(nvme_, Tier::kNvme);
    AddLevel(remote_, Tier::kRemote);
    above_level_.tier = &above_;
    above_level_.reported = Tier::kHbm;
  }

  void AddLevel(BlockTier& tier, Tier reported) {
    auto level = std::make_unique<TierLevel>();
    level->tier = &tier;
    level->reported = reported;
    below_.push_back(std::move(level));
  }

  Locator& Make(bool with_above = false) {
    Locator::Hooks hooks;
    hooks.above = [this, with_above]() -> TierLevel* { return with_above ? &above_level_ : nullptr; };
    hooks.find_below = [this](const BlockKey& key, const NamespaceFingerprint& ns) -> std::optional<Located> {
      for (size_t level = 0; level < below_.size(); ++level) {
        std::optional<BlockTier::BlockInfo> info = below_[level]->tier->Find(key);
        if (info && info->ns == ns) return Located{level, *info};
      }
      return std::nullopt;
    };
    locator_ = std::make_unique<Locator>(shards_, below_, counters_, std::move(hooks));
    return *locator_;
  }

  BlockIndex& ShardOf(const BlockKey& key) { return *shards_[ShardIndexOf(key, kShards)]; }
  // Reserves `key` in the host tier for kConn, with its arena space.
  BlockIndex::Entries::iterator Reserve(BlockIndex& shard, const BlockKey& key, const NamespaceFingerprint& ns)
      REQUIRES(shard.mu) {
    EXPECT_TRUE(shard.Reserve(key, ns, kBlockBytes, kConn).ok());
    auto it = shard.index.find(key);
    Result<HostTier::Extent> extent = host_->Allocate(kBlockBytes);
    EXPECT_TRUE(extent.ok());
    it->second.extent = *extent;
    it->second.allocated = true;
    return it;
  }
  // Commits `key` in the host tier, as a Reserve and a Commit do.
  void CommitInHost(const BlockKey& key, const NamespaceFingerprint& ns = kNs) {
    BlockIndex& shard = ShardOf(key);
    MutexLock lock(shard.mu);
    shard.CommitReserved(Reserve(shard, key, ns), kConn, 0, {}, next_handle_++, 1);
  }
  void Store(BlockTier& tier, const BlockKey& key) {
    const std::vector<std::byte> bytes(kBlockBytes, std::byte{1});
    EXPECT_TRUE(tier.Write(
                        kNs, key, 1, bytes, [](Status) {}, std::nullopt)
                    .ok());
  }

  EngineCounters counters_;
  std::unique_ptr<HostTier> host_;
  std::vector<std::unique_ptr<BlockIndex>> shards_;
  MapTier nvme_;
  MapTier remote_map_;
  ProbingTier remote_{remote_map_};
  MapTier above_;
  TierLevel above_level_;
  std::vector<std::unique_ptr<TierLevel>> below_;
  BlockHandle next_handle_ = 1;
  std::unique_ptr<Locator> locator_;
};

TEST_F(LocatorTest, AChainIsPlacedTierByTierUpToItsFirstMiss) {
  Locator& locator = Make();
  CommitInHost(Key(0));
  Store(nvme_, Key(1));
  Store(remote_map_, Key(2));
  CommitInHost(Key(4));  // after the miss: not in the prefix
  const BlockKey keys[] = {Key(0), Key(1), Key(2), Key(3), Key(4)};
  const LookupOutcome out = locator.Lookup(kNs, keys);
  EXPECT_EQ(out.prefix_blocks, 3u);
  EXPECT_EQ(out.tiers, (std::vector<Tier>{Tier::kHost, Tier::kNvme, Tier::kRemote}));
  EXPECT_EQ(counters_.lookups.load(), 1);
  EXPECT_EQ(counters_.lookup_misses.load(), 1);
  EXPECT_EQ(counters_.lookup_keys.load(), 5);
  EXPECT_EQ(counters_.lookup_hit_blocks.load(), 3);
  EXPECT_EQ(counters_.host_lookup_hits.load(), 1);
  EXPECT_EQ(below_[0]->lookup_hits.load(), 1);
  EXPECT_EQ(below_[1]->lookup_hits.load(), 1);
}

TEST_F(LocatorTest, AHostBlockIsPlacedBeforeItsCopyBelowAndTheTierAboveBeforeBoth) {
  CommitInHost(Key(0));
  Store(nvme_, Key(0));
  const BlockKey keys[] = {Key(0)};
  EXPECT_EQ(Make().Lookup(kNs, keys).tiers, std::vector<Tier>{Tier::kHost});
  Store(above_, Key(0));
  EXPECT_EQ(Make(/*with_above=*/true).Lookup(kNs, keys).tiers, std::vector<Tier>{Tier::kHbm});
  EXPECT_EQ(above_level_.lookup_hits.load(), 1);
  EXPECT_EQ(counters_.host_lookup_hits.load(), 1) << "the first lookup only";
  EXPECT_EQ(below_[0]->lookup_hits.load(), 0);
}

TEST_F(LocatorTest, AReservedBlockOrOneOfAnotherNamespaceIsAMiss) {
  Locator& locator = Make();
  {
    BlockIndex& shard = ShardOf(Key(0));
    MutexLock lock(shard.mu);
    Reserve(shard, Key(0), kNs);
  }
  CommitInHost(Key(1), kOtherNs);
  const BlockKey reserved[] = {Key(0)};
  EXPECT_EQ(locator.Lookup(kNs, reserved).prefix_blocks, 0u) << "invisible until committed";
  const BlockKey other[] = {Key(1)};
  EXPECT_EQ(locator.Lookup(kNs, other).prefix_blocks, 0u);
  EXPECT_EQ(locator.Lookup(kOtherNs, other).prefix_blocks, 1u);
  EXPECT_EQ(counters_.lookup_misses.load(), 2);
}

TEST_F(LocatorTest, ABlockBeingDemotedIsInTheTierItIsWrittenTo) {
  Locator& locator = Make();
  CommitInHost(Key(0));
  {
    BlockIndex& shard = ShardOf(Key(0));
    MutexLock lock(shard.mu);
    const BlockEntry victim = shard.BeginDemotion(shard.index.find(Key(0)), /*level=*/1);
    host_->Free(victim.extent);
  }
  const BlockKey keys[] = {Key(0)};
  EXPECT_EQ(locator.Lookup(kNs, keys).tiers, std::vector<Tier>{Tier::kRemote});
  EXPECT_EQ(locator.Lookup(kOtherNs, keys).prefix_blocks, 0u) << "not for another namespace";
  EXPECT_EQ(below_[1]->lookup_hits.load(), 1);
}

TEST_F(LocatorTest, ALookupInStepsCountsOnceAtTheEnd) {
  Locator& locator = Make();
  for (uint64_t i = 0; i < 3; ++i) CommitInHost(Key(i));
  const BlockKey keys[] = {Key(0), Key(1), Key(2)};
  LookupCursor cursor;
  locator.LookupSome(kNs, keys, cursor, 2);
  EXPECT_FALSE(cursor.done);
  EXPECT_EQ(cursor.next, 2u);
  EXPECT_EQ(counters_.lookups.load(), 0) << "not a lookup until it ends";
  locator.LookupSome(kNs, keys, cursor, 0);  // at least one key a step
  EXPECT_TRUE(cursor.done);
  EXPECT_EQ(cursor.out.prefix_blocks, 3u);
  locator.LookupSome(kNs, keys, cursor, 2);  // done: nothing more
  EXPECT_EQ(cursor.out.tiers.size(), 3u);
  EXPECT_EQ(counters_.lookups.load(), 1);
  EXPECT_EQ(counters_.lookup_keys.load(), 3);
  EXPECT_EQ(counters_.host_lookup_hits.load(), 3);
}

TEST_F(LocatorTest, AProberIsAskedOnceForTheKeysFromTheFirstUnknownOn) {
  Locator& locator = Make();
  CommitInHost(Key(0));
  remote_.learnable = {1, 2};
  const BlockKey keys[] = {Key(0), Key(1), Key(2), Key(3)};
  const LookupOutcome out = locator.Lookup(kNs, keys);
  EXPECT_EQ(out.tiers, (std::vector<Tier>{Tier::kHost, Tier::kRemote, Tier::kRemote}));
  ASSERT_EQ(remote_.probes.size(), 1u) << "once, though key 3 misses too";
  EXPECT_EQ(remote_.probes[0], (std::vector<BlockKey>{Key(1), Key(2), Key(3)}));
}

}  // namespace
}  // namespace kvtier

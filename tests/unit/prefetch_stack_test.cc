// Tests of the prefetcher's view of the stack (prefetch_stack.h), built
// without an Engine: real index shards over a real arena, two tiers below
// (a MapTier behind a gate, whose reads wait while it is closed, then a
// plain MapTier) and a real Promoter and Pinner (tests/testing/pin_parts.h).
// place says host, below (with the level and bytes) or nowhere, by
// namespace; read_bandwidths are the levels' meters; start_read claims a
// key held only below (a pin waits for that read, which is the only one)
// and refuses a key the host tier has or no tier below holds.
#include "daemon/engine/prefetch_stack.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <vector>

#include "common/checksum.h"
#include "daemon/engine/block_index.h"
#include "tests/testing/pin_parts.h"

namespace kvtier {
namespace {

constexpr NamespaceFingerprint kNs{0x914, 0x51};
constexpr NamespaceFingerprint kOtherNs{0x914, 0x52};
constexpr ConnectionId kConn = 3;

class PrefetchStackTest : public ::testing::Test, protected ::kvtier::testing::PinParts {
 protected:
  PrefetchStackTest() {
    for (BlockTier* tier : {static_cast<BlockTier*>(&below_), static_cast<BlockTier*>(&lower_)}) {
      auto level = std::make_unique<TierLevel>();
      level->tier = tier;
      levels_.push_back(std::move(level));
    }
    stack_ = MakePrefetchStack({shards_, levels_, *promoter_, [this] { ++reads_started_; }});
  }

  // Block `i` of `ns` stored in the lowest tier, of one layer.
  void StoreLower(uint64_t i, const NamespaceFingerprint& ns) {
    const std::vector<std::byte> bytes = BlockBytes(i);
    ASSERT_TRUE(lower_
                    .Write(
                        ns, Key(i), 1, bytes, [](Status) {}, BlockChecksum(bytes))
                    .ok());
  }
  PrefetchBlock Place(uint64_t i, const NamespaceFingerprint& ns = kNs) { return stack_.place(ns, Key(i)); }

  ::kvtier::testing::MapTier lower_;
  std::vector<std::unique_ptr<TierLevel>> levels_;  // below_ (gated), then lower_
  std::atomic<int> reads_started_{0};
  Prefetcher::Stack stack_;
};

TEST_F(PrefetchStackTest, PlaceSaysHostBelowOrNowhereByNamespace) {
  Commit(1, kNs);
  Store(1, kNs);  // also below: the host tier's copy is the place
  Store(2, kNs);
  StoreLower(3, kNs);
  Commit(5, kOtherNs);
  Store(6, kOtherNs);

  EXPECT_EQ(Place(1).place, BlockPlace::kHost);
  const PrefetchBlock two = Place(2);
  EXPECT_EQ(two.place, BlockPlace::kBelow);
  EXPECT_EQ(two.level, 0u);
  EXPECT_EQ(two.bytes, kBlockBytes);
  const PrefetchBlock three = Place(3);
  EXPECT_EQ(three.place, BlockPlace::kBelow);
  EXPECT_EQ(three.level, 1u) << "the second tier below";
  EXPECT_EQ(three.bytes, kBlockBytes);
  EXPECT_EQ(Place(4).place, BlockPlace::kNowhere);
  EXPECT_EQ(Place(5).place, BlockPlace::kNowhere) << "another namespace's host block";
  EXPECT_EQ(Place(6).place, BlockPlace::kNowhere) << "another namespace's block below";
  EXPECT_EQ(Place(5, kOtherNs).place, BlockPlace::kHost);
  EXPECT_EQ(Place(6, kOtherNs).place, BlockPlace::kBelow);
}

TEST_F(PrefetchStackTest, ReadBandwidthsAreEachLevelsMeterHighestFirst) {
  levels_[1]->read_meter.Started(64ull << 20, 0);
  levels_[1]->read_meter.Ended(64ull << 20, 64ull << 20, 1000);  // 64 MiB in a millisecond: not the initial 1 GB/s
  const std::vector<BandwidthEstimate> bandwidths = stack_.read_bandwidths();
  ASSERT_EQ(bandwidths.size(), 2u);
  for (size_t level = 0; level < 2; ++level) {
    EXPECT_EQ(bandwidths[level].Percentile(10), levels_[level]->read_meter.estimate().Percentile(10)) << level;
  }
  EXPECT_NE(bandwidths[0].Percentile(10), bandwidths[1].Percentile(10));
}

TEST_F(PrefetchStackTest, StartReadClaimsTheKeyAndAPinWaitsForThatRead) {
  Store(1, kNs);
  below_.Close();
  EXPECT_EQ(stack_.unused_prefetched_bytes(), 0u);
  const std::optional<uint64_t> bytes = stack_.start_read(kNs, Key(1));
  ASSERT_TRUE(bytes.has_value());
  EXPECT_EQ(*bytes, kBlockBytes);
  EXPECT_EQ(reads_started_.load(), 1);
  EXPECT_EQ(below_.reads.load(), 1);
  std::optional<BlockEntry> entry = Entry(Key(1));
  ASSERT_TRUE(entry.has_value());
  EXPECT_EQ(entry->state(), BlockState::kPromoting);
  EXPECT_TRUE(entry->prefetched);
  EXPECT_EQ(stack_.unused_prefetched_bytes(), kBlockBytes) << "read in and not used yet";
  EXPECT_EQ(Place(1).place, BlockPlace::kHost) << "on its way into the host tier";
  EXPECT_EQ(stack_.start_read(kNs, Key(1)), std::nullopt) << "claimed already";

  std::promise<std::vector<PinGrant>> landed;
  pinner_->PinAsync(kConn, kNs, {Key(1)}, [&landed](std::vector<PinGrant> g) { landed.set_value(std::move(g)); });
  std::future<std::vector<PinGrant>> grants = landed.get_future();
  EXPECT_EQ(grants.wait_for(std::chrono::milliseconds(0)), std::future_status::timeout) << "the pin waits for the read";
  below_.Open();
  const std::vector<PinGrant> g = grants.get();
  ASSERT_TRUE(g[0].status.ok()) << g[0].status.ToString();
  EXPECT_EQ(Arena(g[0].offset, g[0].length), BlockBytes(1));
  EXPECT_EQ(below_.reads.load(), 1) << "the pin read nothing of its own";
  EXPECT_EQ(reads_started_.load(), 1);
  EXPECT_EQ(stack_.unused_prefetched_bytes(), 0u) << "used by the pin";
  EXPECT_TRUE(pinner_->Release(kConn, {&g[0].lease, 1})[0].ok());
}

TEST_F(PrefetchStackTest, StartReadRefusesAKeyTheHostTierHas) {
  Commit(2, kNs);
  Store(2, kNs);
  Store(3, kNs);
  {
    BlockIndex& shard = ShardOf(Key(3));
    MutexLock lock(shard.mu);
    ASSERT_TRUE(shard.Reserve(Key(3), kNs, kBlockBytes, kWriter).ok());  // being written meanwhile
  }
  EXPECT_EQ(stack_.start_read(kNs, Key(2)), std::nullopt) << "cached";
  EXPECT_EQ(stack_.start_read(kNs, Key(3)), std::nullopt) << "being written";
  EXPECT_EQ(Entry(Key(2))->state(), BlockState::kCommitted);
  EXPECT_EQ(Entry(Key(3))->state(), BlockState::kReserved);
  EXPECT_EQ(reads_started_.load(), 0);
  EXPECT_EQ(below_.reads.load(), 0);
  EXPECT_EQ(stack_.unused_prefetched_bytes(), 0u);
}

TEST_F(PrefetchStackTest, StartReadOfAKeyNoTierBelowHoldsClaimsNothing) {
  Store(4, kOtherNs);
  EXPECT_EQ(stack_.start_read(kNs, Key(5)), std::nullopt) << "evicted meanwhile";
  EXPECT_EQ(stack_.start_read(kNs, Key(4)), std::nullopt) << "another namespace's";
  EXPECT_FALSE(Entry(Key(4)).has_value());
  EXPECT_FALSE(Entry(Key(5)).has_value());
  EXPECT_EQ(reads_started_.load(), 0);
  EXPECT_EQ(below_.reads.load(), 0);
}

}  // namespace
}  // namespace kvtier

// Tests of the Prefetcher, the glue between the engine's queue hints and
// the prefetch planner: it plans from the queue's earliest requests and
// where their blocks are, reads only what the plan names, root first,
// within the share of the host tier less what is still unused, counts
// what it started, and keeps the flags that say when to plan again.
#include "daemon/engine/prefetcher.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <set>
#include <vector>

#include "daemon/engine/block_index.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/test_daemon.h"

namespace kvtier {
namespace {

constexpr NamespaceFingerprint kNs{0xfe7c, 0x4};
constexpr uint64_t kBlockBytes = 64 << 10;
constexpr uint64_t kHostBytes = 1 << 20;
constexpr uint64_t kLater = 60'000'000;  // a start far enough off for every read

BlockKey Key(uint64_t i) { return BlockKey{0xfe7c, i}; }

std::vector<BlockKey> Chain(uint64_t first, size_t n) {
  std::vector<BlockKey> chain;
  for (size_t i = 0; i < n; ++i) chain.push_back(Key(first + i));
  return chain;
}

class PrefetcherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    host_ = ::kvtier::testing::OpenTestHostTier(kHostBytes);
    ASSERT_NE(host_, nullptr);
    shards_.push_back(std::make_unique<BlockIndex>(0, 1, MakeEvictionPolicy("lru"), *host_));
    queue_ = std::make_unique<RequestQueue>(shards_, RequestQueue::Limits{64, 64, 1024});
  }

  // A prefetcher over this test's stack: blocks in places_ (absent:
  // nowhere), reads recorded in reads_ (refused for keys in refused_).
  Prefetcher& Make(double share, uint32_t min_blocks = 1) {
    Prefetcher::Stack stack;
    stack.place = [this](const NamespaceFingerprint& ns, const BlockKey& key) {
      EXPECT_EQ(ns, kNs);
      ++asked_;
      auto it = places_.find(key);
      if (it == places_.end()) return PrefetchBlock{key, 0, BlockPlace::kNowhere};
      return PrefetchBlock{key, kBlockBytes, it->second, 0};
    };
    stack.read_bandwidths = [] { return std::vector<BandwidthEstimate>{BandwidthEstimate(1e9)}; };
    stack.unused_prefetched_bytes = [this] { return unused_; };
    stack.start_read = [this](const NamespaceFingerprint&, const BlockKey& key) -> std::optional<uint64_t> {
      if (refused_.count(key) != 0) return std::nullopt;
      prefetcher_->ReadStarted();
      reads_.push_back(key);
      return kBlockBytes;
    };
    prefetcher_ = std::make_unique<Prefetcher>(Prefetcher::Options{share, min_blocks, kHostBytes}, *queue_,
                                               std::move(stack), clock_, counters_);
    return *prefetcher_;
  }

  void Queue(uint64_t request, const std::vector<BlockKey>& chain, uint64_t start_in_us = kLater) {
    ASSERT_TRUE(queue_->Add(1, kNs, request, chain, clock_.NowUs() + start_in_us, 0).ok());
  }

  ::kvtier::testing::FakeClock clock_;
  EngineCounters counters_;
  std::unique_ptr<HostTier> host_;
  std::vector<std::unique_ptr<BlockIndex>> shards_;
  std::unique_ptr<RequestQueue> queue_;
  std::map<BlockKey, BlockPlace> places_;
  std::set<BlockKey> refused_;
  uint64_t unused_ = 0;
  int asked_ = 0;
  std::vector<BlockKey> reads_;
  std::unique_ptr<Prefetcher> prefetcher_;
};

TEST_F(PrefetcherTest, ReadsTheBlocksBelowOfAQueuedPrefixRootFirst) {
  const std::vector<BlockKey> chain = Chain(0, 4);
  places_[chain[0]] = BlockPlace::kHost;
  for (size_t i = 1; i < chain.size(); ++i) places_[chain[i]] = BlockPlace::kBelow;
  Queue(1, chain);
  Prefetcher& prefetcher = Make(0.5);
  EXPECT_EQ(prefetcher.Run(), 3u);
  EXPECT_EQ(reads_, std::vector<BlockKey>(chain.begin() + 1, chain.end())) << "the host block is not read";
  EXPECT_EQ(counters_.prefetch_plans.load(), 1);
  EXPECT_EQ(counters_.prefetches.load(), 3);
  EXPECT_EQ(counters_.prefetch_bytes.load(), int64_t{3 * kBlockBytes});
}

TEST_F(PrefetcherTest, APrefixEndsAtItsFirstBlockCachedNowhere) {
  const std::vector<BlockKey> chain = Chain(0, 5);
  places_[chain[0]] = BlockPlace::kBelow;
  places_[chain[1]] = BlockPlace::kBelow;
  // chain[2] is nowhere; chain[3] and chain[4] are below but unusable.
  places_[chain[3]] = BlockPlace::kBelow;
  places_[chain[4]] = BlockPlace::kBelow;
  Queue(1, chain);
  Prefetcher& prefetcher = Make(0.5);
  EXPECT_EQ(prefetcher.Run(), 2u);
  EXPECT_EQ(reads_, Chain(0, 2));
  EXPECT_EQ(asked_, 3) << "no block after the hole is looked up";
}

TEST_F(PrefetcherTest, APrefixShorterThanTheMinimumIsSkippedAndCounted) {
  places_[Key(0)] = BlockPlace::kBelow;
  Queue(1, Chain(0, 3));  // one usable block
  Prefetcher& prefetcher = Make(0.5, /*min_blocks=*/2);
  EXPECT_EQ(prefetcher.Run(), 0u);
  EXPECT_TRUE(reads_.empty());
  EXPECT_EQ(counters_.prefetch_skipped_short.load(), 1);
}

TEST_F(PrefetcherTest, TheBudgetIsTheShareLessWhatEarlierPlansLeftUnused) {
  const std::vector<BlockKey> chain = Chain(0, 8);
  for (const BlockKey& k : chain) places_[k] = BlockPlace::kBelow;
  Queue(1, chain);
  // A quarter of 1 MiB is 4 blocks of 64 KiB; 2 of them are still unused.
  unused_ = 2 * kBlockBytes;
  Prefetcher& prefetcher = Make(0.25);
  EXPECT_EQ(prefetcher.Run(), 2u);
  EXPECT_EQ(reads_, Chain(0, 2));
  reads_.clear();
  unused_ = 0;
  EXPECT_EQ(prefetcher.Run(), 4u) << "the budget comes back as prefetched blocks are used";
}

TEST_F(PrefetcherTest, TheEarliestRequestIsReadFirst) {
  for (const BlockKey& k : Chain(0, 4)) places_[k] = BlockPlace::kBelow;
  for (const BlockKey& k : Chain(10, 4)) places_[k] = BlockPlace::kBelow;
  Queue(1, Chain(10, 4), kLater);
  Queue(2, Chain(0, 4), kLater / 2);
  Prefetcher& prefetcher = Make(0.125);  // 2 blocks
  EXPECT_EQ(prefetcher.Run(), 2u);
  EXPECT_EQ(reads_, Chain(0, 2));
}

TEST_F(PrefetcherTest, AReadThatCannotBeClaimedIsNotCounted) {
  const std::vector<BlockKey> chain = Chain(0, 3);
  for (const BlockKey& k : chain) places_[k] = BlockPlace::kBelow;
  refused_.insert(chain[1]);  // cached or evicted since it was placed
  Queue(1, chain);
  Prefetcher& prefetcher = Make(0.5);
  EXPECT_EQ(prefetcher.Run(), 2u);
  EXPECT_EQ(reads_, (std::vector<BlockKey>{chain[0], chain[2]}));
  EXPECT_EQ(counters_.prefetches.load(), 2);
  EXPECT_EQ(counters_.prefetch_bytes.load(), int64_t{2 * kBlockBytes});
}

TEST_F(PrefetcherTest, WithoutAShareNothingIsPlanned) {
  places_[Key(0)] = BlockPlace::kBelow;
  Queue(1, Chain(0, 1));
  Prefetcher& prefetcher = Make(0);
  EXPECT_FALSE(prefetcher.enabled());
  EXPECT_EQ(prefetcher.Run(), 0u);
  EXPECT_EQ(asked_, 0);
  EXPECT_EQ(counters_.prefetch_plans.load(), 0);
}

TEST_F(PrefetcherTest, TheFlagsSayWhenToPlanAgain) {
  Prefetcher& prefetcher = Make(0.5);
  EXPECT_TRUE(prefetcher.TryScheduling());
  EXPECT_FALSE(prefetcher.TryScheduling()) << "one plan scheduled at a time";
  prefetcher.Scheduled();
  EXPECT_TRUE(prefetcher.TryScheduling());
  prefetcher.ReadStarted();
  prefetcher.ReadStarted();
  EXPECT_FALSE(prefetcher.ReadLanded());
  EXPECT_TRUE(prefetcher.ReadLanded()) << "the last read of a plan in flight";
  EXPECT_FALSE(prefetcher.TakeUse());
  prefetcher.NoteUse();
  prefetcher.NoteUse();
  EXPECT_TRUE(prefetcher.TakeUse());
  EXPECT_FALSE(prefetcher.TakeUse());
}

}  // namespace
}  // namespace kvtier

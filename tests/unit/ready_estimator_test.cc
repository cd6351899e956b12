// Tests of the ReadyEstimator (daemon/engine/ready_estimator.h) without an
// Engine: real index shards over a test arena, MapTiers below (reported as
// nvme and remote) and above (hbm), each level's read meter fed samples and
// queued reads by the test. Every expected time is computed here from the
// same inputs the estimator reads (the meter's percentile, its bytes in
// flight, the overhead and the copy rate), never written down as a number.
#include "daemon/engine/ready_estimator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <vector>

#include "daemon/engine/block_index.h"
#include "daemon/engine/preload_rates.h"
#include "tests/testing/index_shards.h"
#include "tests/testing/map_tier.h"
#include "tests/testing/test_daemon.h"

namespace kvtier {
namespace {

using ::kvtier::testing::MapTier;

constexpr uint64_t kBlockBytes = 4 << 10;
constexpr size_t kBlocks = 8;
constexpr NamespaceFingerprint kNs{0x4ead, 0x1};
constexpr ConnectionId kConn = 3;
constexpr size_t kShards = 2;
constexpr double kCopyBytesPerS = 8e9;
constexpr double kOverheadUs = PreloadRates::kBelowLayerOverheadUs;

BlockKey Key(uint64_t i) { return BlockKey{0x4ead, i}; }

// Microseconds to move `bytes` at `bytes_per_s`.
double Us(uint64_t bytes, double bytes_per_s) { return double(bytes) / bytes_per_s * 1e6; }

class ReadyEstimatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    host_ = ::kvtier::testing::OpenTestHostTier(kBlocks * kBlockBytes);
    ASSERT_NE(host_, nullptr);
    shards_ = ::kvtier::testing::MakeShards(*host_, kShards);
    for (auto [tier, reported] : {std::pair<MapTier*, Tier>{&nvme_, Tier::kNvme}, {&remote_, Tier::kRemote}}) {
      auto level = std::make_unique<TierLevel>();
      level->tier = tier;
      level->reported = reported;
      below_.push_back(std::move(level));
    }
    above_level_.tier = &above_;
    above_level_.reported = Tier::kHbm;
    Locator::Hooks hooks;
    hooks.above = [this]() -> TierLevel* { return &above_level_; };
    hooks.find_below = [this](const BlockKey& key, const NamespaceFingerprint& ns) {
      return FindBelow(below_, key, ns);
    };
    locator_ = std::make_unique<Locator>(shards_, below_, counters_, std::move(hooks));
    estimator_ = std::make_unique<ReadyEstimator>(*locator_, below_, [this] {
      ++copy_rate_asked_;
      return kCopyBytesPerS;
    });
  }

  BlockIndex& ShardOf(const BlockKey& key) { return *shards_[ShardIndexOf(key, kShards)]; }
  void CommitInHost(const BlockKey& key) {
    BlockIndex& shard = ShardOf(key);
    MutexLock lock(shard.mu);
    ASSERT_TRUE(shard.Reserve(key, kNs, kBlockBytes, kConn).ok());
    auto it = shard.index.find(key);
    Result<HostTier::Extent> extent = host_->Allocate(kBlockBytes);
    ASSERT_TRUE(extent.ok());
    it->second.extent = *extent;
    it->second.allocated = true;
    shard.CommitReserved(it, kConn, 0, {}, next_handle_++, 1);
  }
  void Store(BlockTier& tier, const BlockKey& key, uint64_t bytes = kBlockBytes) {
    const std::vector<std::byte> payload(bytes, std::byte{1});
    ASSERT_TRUE(tier.Write(
                        kNs, key, 1, payload, [](Status) {}, std::nullopt)
                    .ok());
  }
  // Claims `key` (stored below) for a promotion, as a pin does, and starts
  // its read on `level`'s meter, as the Promoter does.
  void BeginPromotion(const BlockKey& key, size_t level) {
    {
      BlockIndex& shard = ShardOf(key);
      MutexLock lock(shard.mu);
      shard.BeginPromotion(key, kNs, kBlockBytes, false);
    }
    below_[level]->read_meter.Started(kBlockBytes, 0);
  }
  // One busy period of `bytes` read in `us` on `level`'s meter: a sample.
  void Sample(size_t level, uint64_t bytes, uint64_t us) {
    below_[level]->read_meter.Started(bytes, 1'000'000);
    below_[level]->read_meter.Ended(bytes, bytes, 1'000'000 + us);
  }
  // Just after the samples Sample takes (within the fresh window).
  static uint64_t Now() { return 3'000'000; }
  double Percentile(size_t level) {
    return below_[level]->read_meter.estimate().Percentile(PreloadRates::kReadPercentile);
  }
  ReadyEstimate Estimate(std::vector<BlockKey> keys) {
    Result<ReadyEstimate> out = estimator_->Estimate(kNs, keys);
    EXPECT_TRUE(out.ok()) << out.status().ToString();
    return out.ok() ? *out : ReadyEstimate{};
  }

  EngineCounters counters_;
  std::unique_ptr<HostTier> host_;
  std::vector<std::unique_ptr<BlockIndex>> shards_;
  MapTier nvme_, remote_, above_;
  TierLevel above_level_;
  std::vector<std::unique_ptr<TierLevel>> below_;
  BlockHandle next_handle_ = 1;
  std::unique_ptr<Locator> locator_;
  std::unique_ptr<ReadyEstimator> estimator_;
  int copy_rate_asked_ = 0;
};

TEST_F(ReadyEstimatorTest, APrefixInTheHostTierIsReadyAtOnceAndOnTheGpuAfterItsCopy) {
  for (uint64_t i = 0; i < 3; ++i) CommitInHost(Key(i));
  const ReadyEstimate out = Estimate({Key(0), Key(1), Key(2)});
  EXPECT_EQ(out.prefix_blocks, 3u);
  EXPECT_EQ(out.tiers, std::vector<Tier>(3, Tier::kHost));
  EXPECT_EQ(out.prefix_bytes, 3 * kBlockBytes);
  EXPECT_EQ(out.host_ready_us, 0);
  EXPECT_EQ(out.gpu_copy_bytes, 3 * kBlockBytes);
  EXPECT_EQ(out.gpu_copy_bytes_per_s, kCopyBytesPerS);
  EXPECT_DOUBLE_EQ(out.gpu_ready_us, Us(3 * kBlockBytes, kCopyBytesPerS));
  ASSERT_EQ(out.below.size(), 2u) << "every tier below, with nothing to read";
  for (const ReadyTierShare& share : out.below) {
    EXPECT_EQ(share.blocks, 0u);
    EXPECT_EQ(share.ready_us, 0);
  }
}

TEST_F(ReadyEstimatorTest, ThePrefixEndsAtTheFirstMissWithEachBlocksTier) {
  Store(above_, Key(0));
  CommitInHost(Key(1));
  Store(nvme_, Key(2));
  Store(remote_, Key(3));
  Store(nvme_, Key(5));  // after the miss: not in the prefix
  const ReadyEstimate out = Estimate({Key(0), Key(1), Key(2), Key(3), Key(4), Key(5)});
  EXPECT_EQ(out.prefix_blocks, 4u);
  EXPECT_EQ(out.tiers, (std::vector<Tier>{Tier::kHbm, Tier::kHost, Tier::kNvme, Tier::kRemote}));
  EXPECT_EQ(out.below[0].blocks, 1u) << "block 5 is past the miss";
  EXPECT_EQ(out.below[1].blocks, 1u);
  EXPECT_EQ(out.gpu_copy_bytes, 3 * kBlockBytes) << "the HBM block is on the GPU already";
  EXPECT_EQ(counters_.lookups.load(), 0) << "an estimate is not a lookup";
}

TEST_F(ReadyEstimatorTest, BlocksBelowTakeTheirBytesOverTheMeasuredPercentilePlusOneOverhead) {
  // Samples of 10, 20, ..., 100 MB/s on NVMe: the 10th percentile is the
  // slowest, not the moving average.
  for (uint64_t mb = 10; mb <= 100; mb += 10) Sample(0, mb * 1'000'000, 1'000'000);
  ASSERT_NE(Percentile(0), below_[0]->read_meter.estimate().bytes_per_s());
  for (uint64_t i = 0; i < 4; ++i) Store(nvme_, Key(i));
  const ReadyEstimate out = Estimate({Key(0), Key(1), Key(2), Key(3)});
  const ReadyTierShare& nvme = out.below[0];
  EXPECT_EQ(nvme.tier, Tier::kNvme);
  EXPECT_EQ(nvme.blocks, 4u);
  EXPECT_EQ(nvme.bytes, 4 * kBlockBytes);
  EXPECT_EQ(nvme.read_bytes_per_s, Percentile(0));
  EXPECT_EQ(nvme.overhead_us, kOverheadUs);
  EXPECT_DOUBLE_EQ(nvme.ready_us, kOverheadUs + Us(4 * kBlockBytes, Percentile(0)));
  EXPECT_DOUBLE_EQ(out.host_ready_us, nvme.ready_us);
  EXPECT_DOUBLE_EQ(out.gpu_ready_us, out.host_ready_us + Us(4 * kBlockBytes, kCopyBytesPerS));
}

TEST_F(ReadyEstimatorTest, TiersAreReadConcurrentlySoTheSlowestTierDecides) {
  Sample(0, 100'000'000, 1'000'000);  // NVMe 100 MB/s
  Sample(1, 10'000'000, 1'000'000);   // remote 10 MB/s
  Store(nvme_, Key(0));
  Store(nvme_, Key(1));
  Store(remote_, Key(2));
  const ReadyEstimate out = Estimate({Key(0), Key(1), Key(2)});
  const double nvme = kOverheadUs + Us(2 * kBlockBytes, Percentile(0));
  const double remote = kOverheadUs + Us(kBlockBytes, Percentile(1));
  EXPECT_DOUBLE_EQ(out.below[0].ready_us, nvme);
  EXPECT_DOUBLE_EQ(out.below[1].ready_us, remote);
  EXPECT_DOUBLE_EQ(out.host_ready_us, std::max(nvme, remote)) << "not their sum";
}

TEST_F(ReadyEstimatorTest, ReadsQueuedOnATierDelayTheBlocksReadFromIt) {
  Store(nvme_, Key(0));
  const double idle = Estimate({Key(0)}).host_ready_us;
  below_[0]->read_meter.Started(3 * kBlockBytes, 0);  // someone's reads, not ended
  below_[0]->read_meter.Started(kBlockBytes, 0);
  const ReadyEstimate loaded = Estimate({Key(0)});
  EXPECT_EQ(loaded.below[0].queued_reads, 2u);
  EXPECT_EQ(loaded.below[0].queued_bytes, 4 * kBlockBytes);
  EXPECT_DOUBLE_EQ(loaded.host_ready_us - idle, Us(4 * kBlockBytes, Percentile(0)));
  // A queue on a tier the prefix does not read from delays nothing.
  below_[1]->read_meter.Started(1 << 30, 0);
  EXPECT_DOUBLE_EQ(Estimate({Key(0)}).host_ready_us, loaded.host_ready_us);
}

TEST_F(ReadyEstimatorTest, ABlockBeingPromotedIsWaitedForNotReadAgain) {
  Store(nvme_, Key(0));
  Store(nvme_, Key(1));
  BeginPromotion(Key(0), 0);  // its read is queued on NVMe
  const ReadyEstimate out = Estimate({Key(0), Key(1)});
  EXPECT_EQ(out.tiers, (std::vector<Tier>{Tier::kNvme, Tier::kNvme})) << "placed as Lookup places it";
  const ReadyTierShare& nvme = out.below[0];
  EXPECT_EQ(nvme.promoting_blocks, 1u);
  EXPECT_EQ(nvme.blocks, 1u);
  EXPECT_EQ(nvme.bytes, kBlockBytes);
  EXPECT_EQ(nvme.queued_bytes, kBlockBytes);
  EXPECT_DOUBLE_EQ(out.host_ready_us, kOverheadUs + Us(2 * kBlockBytes, Percentile(0))) << "its bytes once";
  // Alone, it is ready when the queue it is in drains.
  EXPECT_DOUBLE_EQ(Estimate({Key(0)}).host_ready_us, kOverheadUs + Us(kBlockBytes, Percentile(0)));
}

TEST_F(ReadyEstimatorTest, ABlockBeingDemotedIsReadFromItsTargetWithItsBytes) {
  CommitInHost(Key(0));
  {
    BlockIndex& shard = ShardOf(Key(0));
    MutexLock lock(shard.mu);
    host_->Free(shard.BeginDemotion(shard.index.find(Key(0)), /*level=*/1).extent);
  }
  const ReadyEstimate out = Estimate({Key(0)});
  EXPECT_EQ(out.tiers, std::vector<Tier>{Tier::kRemote});
  EXPECT_EQ(out.below[1].bytes, kBlockBytes);
  EXPECT_DOUBLE_EQ(out.host_ready_us, kOverheadUs + Us(kBlockBytes, Percentile(1)));
}

TEST_F(ReadyEstimatorTest, APrefixInTheHbmTierIsOnTheGpuAndNeedsNoCopyRate) {
  Store(above_, Key(0));
  Store(above_, Key(1));
  const ReadyEstimate out = Estimate({Key(0), Key(1)});
  EXPECT_EQ(out.tiers, std::vector<Tier>(2, Tier::kHbm));
  EXPECT_EQ(out.host_ready_us, 0);
  EXPECT_EQ(out.gpu_ready_us, 0);
  EXPECT_EQ(out.gpu_copy_bytes, 0u);
  EXPECT_EQ(copy_rate_asked_, 0) << "the copy rate is measured only when a copy is needed";
}

TEST_F(ReadyEstimatorTest, NoKeysIsAnEmptyPrefixAndTooManyKeysInvalidArgument) {
  const ReadyEstimate none = Estimate({});
  EXPECT_EQ(none.prefix_blocks, 0u);
  EXPECT_EQ(none.host_ready_us, 0);
  const std::vector<BlockKey> many(ReadyEstimator::kMaxKeys + 1, Key(0));
  EXPECT_EQ(estimator_->Estimate(kNs, many).status().code(), StatusCode::kInvalidArgument);
  const std::vector<BlockKey> most(ReadyEstimator::kMaxKeys, Key(0));
  EXPECT_TRUE(estimator_->Estimate(kNs, most).ok());
}

TEST_F(ReadyEstimatorTest, ALoadsLateBlocksAreThoseBelowThatCannotArriveWithinItsBudget) {
  // NVMe at 10, 20, ..., 100 MB/s, twice: judged by the median, not the slow day.
  for (int round = 0; round < 2; ++round) {
    for (uint64_t mb = 10; mb <= 100; mb += 10) Sample(0, mb * 1'000'000, 1'000'000);
  }
  const double rate = below_[0]->read_meter.estimate().Percentile(ReadyEstimator::kLatePercentile);
  ASSERT_GT(rate, Percentile(0));
  for (size_t n = 0; n < ReadyEstimator::kLateMinSamples; ++n) Sample(1, 1'000'000'000, 1'000'000);  // remote 1 GB/s
  CommitInHost(Key(0));
  for (uint64_t i = 1; i <= 4; ++i) Store(nvme_, Key(i));
  Store(remote_, Key(6));
  const uint64_t now = Now();
  // Two NVMe blocks fit, with half a block's time to spare; key 5 is cached nowhere.
  const double budget = kOverheadUs + Us(2 * kBlockBytes, rate) + Us(kBlockBytes / 2, rate);
  const std::vector<BlockKey> keys{Key(0), Key(1), Key(2), Key(3), Key(4), Key(5), Key(6)};
  EXPECT_EQ(estimator_->Late(kNs, keys, budget, now), (std::vector<bool>{false, false, false, true, true, false, true}))
      << "the host block is there; after the first late block the remote one would serve nothing";
  // Reads queued on the NVMe tier come first: now only one fits.
  below_[0]->read_meter.Started(kBlockBytes, now);
  EXPECT_EQ(estimator_->Late(kNs, keys, budget, now), (std::vector<bool>{false, false, true, true, true, false, true}));
  // A budget every block fits in.
  EXPECT_EQ(estimator_->Late(kNs, keys, 1e12, now), std::vector<bool>(keys.size(), false));
  // The remote tier alone is judged by its own rate.
  EXPECT_EQ(estimator_->Late(kNs, std::vector<BlockKey>{Key(6)}, kOverheadUs + Us(kBlockBytes, 1e9) + 1, now),
            std::vector<bool>{false});
}

// Too few samples, or none for a while: nothing is called late, so the
// loads read the tier and measure it again.
TEST_F(ReadyEstimatorTest, AnEstimateOnFewOrOldSamplesCallsNothingLate) {
  Store(nvme_, Key(1));
  const std::vector<BlockKey> keys{Key(1)};
  const double budget = kOverheadUs / 2;  // shorter than any read: late wherever the rate is judged
  EXPECT_EQ(estimator_->Late(kNs, keys, budget, Now()), std::vector<bool>{false}) << "no sample";
  for (size_t n = 1; n < ReadyEstimator::kLateMinSamples; ++n) Sample(0, 100'000'000, 1'000'000);
  EXPECT_EQ(estimator_->Late(kNs, keys, budget, Now()), std::vector<bool>{false}) << "one sample short";
  Sample(0, 100'000'000, 1'000'000);
  EXPECT_EQ(estimator_->Late(kNs, keys, budget, Now()), std::vector<bool>{true});
  EXPECT_EQ(estimator_->Late(kNs, keys, budget, Now() + ReadyEstimator::kLateFreshUs + 1), std::vector<bool>{false})
      << "the latest sample is too old";
}

TEST(ModelLateTest, ATierWithoutARateAndBlocksAboveOrBeingPromotedAreJudgedAsTheModelSays) {
  Locator::Placed host{Tier::kHost, std::nullopt, 1 << 20, false};
  Locator::Placed unknown_rate{Tier::kRemote, 1, 1 << 30, false};
  Locator::Placed fresh{Tier::kNvme, 0, 1 << 20, false};
  Locator::Placed promoting{Tier::kNvme, 0, 1 << 20, true};
  std::vector<ReadyLevelNow> levels{{Tier::kNvme, 1e9, {1, 1 << 20}, true}, {Tier::kRemote, 0, {}, true}};
  // A fresh read before the promotion does not delay it: its read is queued already.
  const std::vector<std::optional<Locator::Placed>> blocks{host, unknown_rate, fresh, promoting, std::nullopt};
  const double queued_us = kOverheadUs + Us(1 << 20, 1e9);
  const double after_us = kOverheadUs + Us(2 << 20, 1e9);
  EXPECT_EQ(ModelLate(blocks, levels, after_us + 1), std::vector<bool>(5, false));
  EXPECT_EQ(ModelLate(blocks, levels, queued_us + 1), (std::vector<bool>{false, false, true, true, false}))
      << "the fresh read does not fit; the promotion would, but comes after a late block";
  const std::vector<std::optional<Locator::Placed>> promoted_first{host, promoting, fresh};
  EXPECT_EQ(ModelLate(promoted_first, levels, queued_us + 1), (std::vector<bool>{false, false, true}));
  // A level not judged calls nothing late.
  levels[0].judged = false;
  EXPECT_EQ(ModelLate(blocks, levels, 1), std::vector<bool>(5, false));
}

}  // namespace
}  // namespace kvtier

// Engine::EstimateReady (daemon/engine/ready_estimator.h) over a real
// engine: a host tier of 8 blocks above an NVMe tier on an in-memory
// device whose reads the test holds (FaultInjectingDevice::HoldReads, a
// stalled drive), on a fake clock. The estimate places the prefix as
// Lookup does, reads NVMe at the rate its read meter measured, waits
// behind the reads queued on the device (promotions, a layer-wise load's
// layer reads) and counts a block already on its way up once. Expected
// times are computed from the same inputs (the bytes, the measured or
// initial rate, the queued bytes), not written down.
#include <gtest/gtest.h>

#include <future>
#include <memory>
#include <vector>

#include "daemon/engine/engine.h"
#include "policy/option_defaults.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/fault_injecting_device.h"
#include "tests/testing/memory_device.h"
#include "tests/testing/memory_nvme.h"
#include "tests/testing/test_daemon.h"
#include "tiers/nvme/nvme_tier.h"

namespace kvtier {
namespace {

using ::kvtier::testing::FakeClock;
using ::kvtier::testing::FaultInjectingDevice;
using ::kvtier::testing::MemoryDevice;

constexpr uint64_t kBlockBytes = 64 << 10;
constexpr NamespaceFingerprint kNs{0x4ead, 0xe};
constexpr uint64_t kHostBlocks = 8;
constexpr double kOverheadUs = PreloadRates::kBelowLayerOverheadUs;

BlockKey Key(uint64_t i) { return BlockKey{0x4e, i}; }
double Us(uint64_t bytes, double bytes_per_s) { return double(bytes) / bytes_per_s * 1e6; }

class EngineReadyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::kvtier::testing::MakeTempDir();
    memory_ = std::make_unique<MemoryDevice>(16 << 20);
    host_ = ::kvtier::testing::OpenTestHostTier(kHostBlocks * kBlockBytes);
    ASSERT_NE(host_, nullptr);
    auto tier = ::kvtier::testing::OpenMemoryNvmeTier(*memory_, dir_, clock_, ::kvtier::testing::SmallNvmeOptions(), {},
                                                      &device_);
    ASSERT_TRUE(tier.ok()) << tier.status().ToString();
    nvme_ = std::move(*tier);
    auto engine = Engine::Create(EngineOptions{2, EvictionPolicyId::kLru}, *host_, clock_, nvme_.get());
    ASSERT_TRUE(engine.ok());
    engine_ = std::move(*engine);
  }
  void TearDown() override {
    device_->ReleaseReads();
    engine_.reset();
    nvme_.reset();
    ::kvtier::testing::RemoveTree(dir_);
  }

  // Puts blocks 0 .. kHostBlocks + below - 1: the first `below` (the
  // oldest) are demoted to NVMe, the rest stay in the host tier.
  void Fill(uint64_t below) {
    for (uint64_t i = 0; i < kHostBlocks + below; ++i) {
      clock_.AdvanceUs(1);
      ASSERT_TRUE(::kvtier::testing::PutFilledBlock(*engine_, *host_, 1, kNs, Key(i), kBlockBytes).ok()) << i;
    }
    engine_->WaitForIdle();
    for (uint64_t i = 0; i < below; ++i) ASSERT_EQ(::kvtier::testing::LookupTier(*engine_, kNs, Key(i)), Tier::kNvme);
  }
  ReadyEstimate Estimate(std::vector<BlockKey> keys) {
    Result<ReadyEstimate> out = engine_->EstimateReady(kNs, keys);
    EXPECT_TRUE(out.ok()) << out.status().ToString();
    return out.ok() ? *out : ReadyEstimate{};
  }
  // Pins `key` (found only below: a promotion), its answer in `answer`.
  void PinAsync(const BlockKey& key, std::promise<std::vector<PinGrant>>& answer) {
    engine_->PinAsync(3, kNs, {key}, [&answer](std::vector<PinGrant> g) { answer.set_value(std::move(g)); });
  }

  std::string dir_;
  FakeClock clock_;
  std::unique_ptr<MemoryDevice> memory_;
  std::unique_ptr<HostTier> host_;
  FaultInjectingDevice* device_ = nullptr;  // owned by nvme_
  std::unique_ptr<NvmeTier> nvme_;
  std::unique_ptr<Engine> engine_;
};

TEST_F(EngineReadyTest, APrefixInTheHostTierIsReadyNow) {
  Fill(0);
  const ReadyEstimate out = Estimate({Key(0), Key(1), Key(2)});
  EXPECT_EQ(out.prefix_blocks, 3u);
  EXPECT_EQ(out.tiers, std::vector<Tier>(3, Tier::kHost));
  EXPECT_EQ(out.host_ready_us, 0);
  EXPECT_EQ(out.gpu_copy_bytes, 3 * kBlockBytes);
  EXPECT_GT(out.gpu_copy_bytes_per_s, 0) << "the host's copy rate, measured";
  EXPECT_DOUBLE_EQ(out.gpu_ready_us, Us(3 * kBlockBytes, out.gpu_copy_bytes_per_s));
  ASSERT_EQ(out.below.size(), 1u);
  EXPECT_EQ(out.below[0].tier, Tier::kNvme);
  EXPECT_EQ(out.below[0].blocks, 0u);
}

TEST_F(EngineReadyTest, ThePrefixEndsAtTheFirstMissWithEachBlocksTier) {
  Fill(2);
  const ReadyEstimate out = Estimate({Key(0), Key(1), Key(2), Key(999), Key(3)});
  EXPECT_EQ(out.prefix_blocks, 3u);
  EXPECT_EQ(out.tiers, (std::vector<Tier>{Tier::kNvme, Tier::kNvme, Tier::kHost}));
  EXPECT_EQ(out.prefix_bytes, 3 * kBlockBytes);
  EXPECT_EQ(out.below[0].blocks, 2u);
  EXPECT_EQ(out.below[0].bytes, 2 * kBlockBytes);
  EXPECT_EQ(out.below[0].read_bytes_per_s, defaults::kInitialReadBytesPerS) << "no read measured yet";
  EXPECT_DOUBLE_EQ(out.host_ready_us, kOverheadUs + Us(2 * kBlockBytes, defaults::kInitialReadBytesPerS));
}

TEST_F(EngineReadyTest, BlocksOnNvmeTakeTheirBytesOverTheRateItsReadsWereMeasuredAt) {
  Fill(4);
  // One promotion that takes kReadUs on the engine's clock: the NVMe
  // meter's one sample, so its 10th percentile, is kBlockBytes / kReadUs.
  constexpr uint64_t kReadUs = 2'000;
  device_->HoldReads();
  std::promise<std::vector<PinGrant>> pinned;
  PinAsync(Key(0), pinned);
  ASSERT_EQ(device_->held_reads(), 1u);
  clock_.AdvanceUs(kReadUs);
  device_->ReleaseReads();
  std::vector<PinGrant> grants = pinned.get_future().get();
  ASSERT_TRUE(grants[0].status.ok()) << grants[0].status.ToString();
  engine_->Release(3, {&grants[0].lease, 1});
  engine_->WaitForIdle();
  const double measured = double(kBlockBytes) / (double(kReadUs) / 1e6);

  const ReadyEstimate out = Estimate({Key(0), Key(1), Key(2), Key(3)});
  EXPECT_EQ(out.tiers, (std::vector<Tier>{Tier::kHost, Tier::kNvme, Tier::kNvme, Tier::kNvme}));
  const ReadyTierShare& nvme = out.below[0];
  EXPECT_DOUBLE_EQ(nvme.read_bytes_per_s, measured);
  EXPECT_EQ(nvme.blocks, 3u);
  EXPECT_EQ(nvme.queued_bytes, 0u);
  EXPECT_DOUBLE_EQ(out.host_ready_us, kOverheadUs + Us(3 * kBlockBytes, measured));
  EXPECT_DOUBLE_EQ(out.gpu_ready_us, out.host_ready_us + Us(4 * kBlockBytes, out.gpu_copy_bytes_per_s));
}

// A stalled drive: promotions wait on the device. The estimate grows with
// the bytes queued ahead, and a block whose own promotion is among them is
// waited for, not read a second time.
TEST_F(EngineReadyTest, OnAStalledDeviceTheQueuedReadsCountAndAPromotionInFlightCountsOnce) {
  Fill(4);
  const double rate = defaults::kInitialReadBytesPerS;  // the clock stands still: no sample
  const ReadyEstimate idle = Estimate({Key(0), Key(3)});
  EXPECT_DOUBLE_EQ(idle.host_ready_us, kOverheadUs + Us(2 * kBlockBytes, rate));
  device_->HoldReads();
  std::promise<std::vector<PinGrant>> pinned[3];
  for (uint64_t i = 0; i < 3; ++i) PinAsync(Key(i), pinned[i]);
  ASSERT_EQ(device_->held_reads(), 3u) << "three promotions wait on the device";

  const ReadyEstimate stalled = Estimate({Key(0), Key(3)});
  EXPECT_EQ(stalled.tiers, (std::vector<Tier>{Tier::kNvme, Tier::kNvme}));
  const ReadyTierShare& nvme = stalled.below[0];
  EXPECT_EQ(nvme.queued_reads, 3u);
  EXPECT_EQ(nvme.queued_bytes, 3 * kBlockBytes);
  EXPECT_EQ(nvme.promoting_blocks, 1u) << "block 0";
  EXPECT_EQ(nvme.blocks, 1u) << "block 3 only is read anew";
  EXPECT_DOUBLE_EQ(stalled.host_ready_us, kOverheadUs + Us(nvme.queued_bytes + kBlockBytes, rate))
      << "block 0's bytes once, in the queue";
  EXPECT_DOUBLE_EQ(stalled.host_ready_us - idle.host_ready_us, Us(nvme.queued_bytes - kBlockBytes, rate));
  // More reads queued: the estimate grows by their bytes.
  std::promise<std::vector<PinGrant>> more;
  PinAsync(Key(3), more);
  const ReadyEstimate later = Estimate({Key(0), Key(3)});
  EXPECT_EQ(later.below[0].queued_bytes, 4 * kBlockBytes);
  EXPECT_EQ(later.below[0].promoting_blocks, 2u);
  EXPECT_DOUBLE_EQ(later.host_ready_us, kOverheadUs + Us(4 * kBlockBytes, rate));

  device_->ReleaseReads();
  for (auto* answer : {&pinned[0], &pinned[1], &pinned[2], &more}) {
    std::vector<PinGrant> g = answer->get_future().get();
    ASSERT_TRUE(g[0].status.ok()) << g[0].status.ToString();
    engine_->Release(3, {&g[0].lease, 1});
  }
  engine_->WaitForIdle();
  const ReadyEstimate after = Estimate({Key(0), Key(3)});
  EXPECT_EQ(after.tiers, (std::vector<Tier>{Tier::kHost, Tier::kHost}));
  EXPECT_EQ(after.host_ready_us, 0);
  EXPECT_EQ(after.below[0].queued_bytes, 0u);
}

// A loaded queue: a layer-wise load's layer reads wait on the device. A
// block read from the same tier is ready that many bytes later than on
// the idle tier.
TEST_F(EngineReadyTest, ALoadedQueueDelaysABlockByTheQueuedBytesOverTheRate) {
  constexpr uint32_t kLayers = 4;
  engine_->RegisterNamespace(kNs, NamespaceLayout{kLayers, kBlockBytes});
  Fill(4);
  const ReadyEstimate idle = Estimate({Key(3)});
  const double rate = idle.below[0].read_bytes_per_s;
  EXPECT_EQ(rate, defaults::kInitialReadBytesPerS);
  device_->HoldReads();
  const BlockKey loaded[] = {Key(0), Key(1), Key(2)};
  auto start = engine_->BeginLoad(7, kNs, loaded);
  ASSERT_TRUE(start.ok()) << start.status().ToString();
  ASSERT_GT(device_->held_reads(), 0u);

  const ReadyEstimate busy = Estimate({Key(3)});
  const ReadyTierShare& nvme = busy.below[0];
  EXPECT_EQ(nvme.queued_reads, 3u) << "layer 0 of each loaded block";
  EXPECT_EQ(nvme.queued_bytes, 3 * kBlockBytes / kLayers);
  EXPECT_EQ(nvme.promoting_blocks, 0u);
  EXPECT_DOUBLE_EQ(busy.host_ready_us - idle.host_ready_us, Us(nvme.queued_bytes, rate));

  device_->ReleaseReads();
  ASSERT_TRUE(engine_->EndLoad(7, start->load).ok());
  engine_->WaitForIdle();
  EXPECT_EQ(Estimate({Key(3)}).below[0].queued_bytes, 0u) << "every read ended";
}

TEST_F(EngineReadyTest, TooManyKeysIsInvalidArgument) {
  const std::vector<BlockKey> keys(ReadyEstimator::kMaxKeys + 1, Key(0));
  EXPECT_EQ(engine_->EstimateReady(kNs, keys).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvtier

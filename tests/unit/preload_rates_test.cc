// Tests of PreloadRates (daemon/engine/preload_rates.h) without an Engine:
// a stack of two levels below (reported as nvme and remote) and a copy rate
// the test gives. A plan from a tier below uses its read meter with the
// per-layer overhead, one from the host tier the copy rate, asked once;
// a tier the stack lacks is NotFound and bad inputs are InvalidArgument.
#include "daemon/engine/preload_rates.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

namespace kvtier {
namespace {

constexpr uint64_t kLayerBytes = 1 << 20;

class PreloadRatesTest : public ::testing::Test {
 protected:
  PreloadRatesTest() {
    for (Tier reported : {Tier::kNvme, Tier::kRemote}) {
      auto level = std::make_unique<TierLevel>();
      level->reported = reported;
      below_.push_back(std::move(level));
    }
  }

  std::vector<std::unique_ptr<TierLevel>> below_;
  int copy_measures_ = 0;
  PreloadRates rates_{below_, [this] {
                        ++copy_measures_;
                        return 4e9;
                      }};
};

TEST_F(PreloadRatesTest, ATierBelowIsPlannedWithItsReadMeterAndTheLayerOverhead) {
  below_[1]->read_meter.Started(64ull << 20, 0);
  below_[1]->read_meter.Ended(64ull << 20, 64ull << 20, 100'000);  // 64 MiB in 0.1 s
  const double remote = below_[1]->read_meter.estimate().Percentile(10);
  ASSERT_NE(remote, below_[0]->read_meter.estimate().Percentile(10));

  Result<PreloadPlan> nvme = rates_.Plan(Tier::kNvme, kLayerBytes, 500, 32, 0);
  ASSERT_TRUE(nvme.ok()) << nvme.status().ToString();
  EXPECT_EQ(nvme->read_bytes_per_s, below_[0]->read_meter.estimate().Percentile(10));
  EXPECT_DOUBLE_EQ(nvme->read_us_per_layer,
                   kLayerBytes / nvme->read_bytes_per_s * 1e6 * 1.1 + PreloadRates::kBelowLayerOverheadUs);
  Result<PreloadPlan> lower = rates_.Plan(Tier::kRemote, kLayerBytes, 500, 32, 0);
  ASSERT_TRUE(lower.ok()) << lower.status().ToString();
  EXPECT_EQ(lower->read_bytes_per_s, remote) << "the remote tier's own meter";
  EXPECT_EQ(copy_measures_, 0);
}

TEST_F(PreloadRatesTest, TheHostTierIsPlannedWithTheCopyRateMeasuredOnce) {
  for (int i = 0; i < 3; ++i) {
    Result<PreloadPlan> host = rates_.Plan(Tier::kHost, kLayerBytes, 500, 32, 0);
    ASSERT_TRUE(host.ok()) << host.status().ToString();
    EXPECT_EQ(host->read_bytes_per_s, 4e9);
    EXPECT_DOUBLE_EQ(host->read_us_per_layer, kLayerBytes / 4e9 * 1e6 * 1.1) << "no per-layer overhead";
  }
  EXPECT_EQ(copy_measures_, 1);
}

TEST_F(PreloadRatesTest, AMissingTierIsNotFoundAndBadInputsInvalidArgument) {
  EXPECT_EQ(rates_.Plan(Tier::kHbm, kLayerBytes, 500, 32, 0).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(rates_.Plan(Tier::kNvme, kLayerBytes, 500, 0, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(rates_.Plan(Tier::kNvme, 0, 500, 32, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(rates_.Plan(Tier::kNvme, kLayerBytes, -1, 32, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(rates_.Plan(Tier::kNvme, kLayerBytes, 500, 32, std::nan("")).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(rates_.Plan(Tier::kHost, kLayerBytes, std::numeric_limits<double>::infinity(), 32, 0).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(copy_measures_, 0) << "a refused plan measures nothing";
}

TEST(MeasureCopyBytesPerSTest, IsPositive) { EXPECT_GT(MeasureCopyBytesPerS(), 0); }

}  // namespace
}  // namespace kvtier

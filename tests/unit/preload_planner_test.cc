// Tests of PlanPreload (policy/preload_planner.h): the buffer-depth formula
// on a Qwen3-8B-like example, by hand, and against a brute-force schedule.
#include "policy/preload_planner.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>

namespace kvtier {
namespace {

constexpr uint64_t kMiB = 1 << 20;

// The example: 36 layers of 32 MiB at 25 GB/s (48.3 ms for the
// whole read) against 30.9 ms of compute for the new tokens.
PreloadInput DesignExample() {
  PreloadInput in;
  in.read_bytes_per_s = 25e9;
  in.bytes_per_layer = 32 * kMiB;
  in.compute_us_per_layer = 30'900.0 / 36;
  in.layers = 36;
  in.margin = 0;
  return in;
}

TEST(PreloadPlannerTest, TheDesignExampleNeedsFourteenLayers) {
  const PreloadInput in = DesignExample();
  const PreloadPlan plan = PlanPreload(in);
  EXPECT_NEAR(plan.read_us_per_layer * 36, 48'300, 50) << "the whole read, 48.3 ms";
  // ceil(36 - 35 x 858.3 / 1342.2) = ceil(13.62)
  EXPECT_EQ(plan.layers_to_preload, 14u);
  EXPECT_EQ(plan.buffer_bytes, 14 * 32 * kMiB);
  // The continuous estimate, B x (T_read - T_new): about 437 MB, under
  // the 14 whole layers the buffer holds.
  const double continuous = in.read_bytes_per_s * (plan.read_us_per_layer * 36 - 30'900) / 1e6;
  EXPECT_NEAR(continuous, 437e6, 0.01 * 437e6);
  EXPECT_LT(continuous, double(plan.buffer_bytes));
  EXPECT_NEAR(plan.stall_us, 14 * plan.read_us_per_layer, 1e-6);
  EXPECT_NEAR(plan.total_us, plan.stall_us + 30'900, 1e-6);
  EXPECT_FALSE(plan.recompute_instead) << "no recompute time given";
}

TEST(PreloadPlannerTest, OneLayerIsEnoughWhenReadingKeepsAhead) {
  PreloadInput in = DesignExample();
  in.compute_us_per_layer = 2'000;  // slower than a 1.34 ms read
  PreloadPlan plan = PlanPreload(in);
  EXPECT_EQ(plan.layers_to_preload, 1u);
  EXPECT_EQ(plan.buffer_bytes, 32 * kMiB);
  // Equal times: still one.
  in.compute_us_per_layer = in.bytes_per_layer / in.read_bytes_per_s * 1e6;
  EXPECT_EQ(PlanPreload(in).layers_to_preload, 1u);
  // No compute to hide behind: every layer first.
  in.compute_us_per_layer = 0;
  EXPECT_EQ(PlanPreload(in).layers_to_preload, 36u);
}

TEST(PreloadPlannerTest, MarginAndOverheadLengthenTheRead) {
  PreloadInput in = DesignExample();
  in.margin = 0.1;  // t_read 1476.4 us: ceil(36 - 35 x 0.5814) = ceil(15.65)
  PreloadPlan plan = PlanPreload(in);
  EXPECT_NEAR(plan.read_us_per_layer, 1.1 * 32 * kMiB / 25e9 * 1e6, 1e-6);
  EXPECT_EQ(plan.layers_to_preload, 16u);
  in.margin = 0;
  in.overhead_us_per_layer = 100;  // t_read 1442.2 us: ceil(15.17)
  plan = PlanPreload(in);
  EXPECT_NEAR(plan.read_us_per_layer, 32 * kMiB / 25e9 * 1e6 + 100, 1e-6);
  EXPECT_EQ(plan.layers_to_preload, 16u);
}

TEST(PreloadPlannerTest, RecomputeInsteadWhenItCostsNoMoreThanTheStall) {
  PreloadInput in = DesignExample();
  const double stall = PlanPreload(in).stall_us;  // 14 x 1342.2 = 18,790 us
  in.recompute_us_per_layer = stall / 36;         // exactly the stall: recompute
  EXPECT_TRUE(PlanPreload(in).recompute_instead);
  in.recompute_us_per_layer = 600;  // 21.6 ms > 18.8 ms: load
  EXPECT_FALSE(PlanPreload(in).recompute_instead);
  in.recompute_us_per_layer = 500;  // 18.0 ms: recompute
  EXPECT_TRUE(PlanPreload(in).recompute_instead);
}

// A hand case: 4 layers, reads of 100 us, compute of 50 us: ceil(4 - 1.5) = 3.
TEST(PreloadPlannerTest, FourLayersByHand) {
  PreloadInput in;
  in.read_bytes_per_s = 1e6;  // 1 byte a microsecond
  in.bytes_per_layer = 100;
  in.compute_us_per_layer = 50;
  in.layers = 4;
  in.margin = 0;
  const PreloadPlan plan = PlanPreload(in);
  EXPECT_EQ(plan.layers_to_preload, 3u);
  EXPECT_EQ(plan.buffer_bytes, 300u);
  EXPECT_DOUBLE_EQ(plan.stall_us, 300);
  EXPECT_DOUBLE_EQ(plan.total_us, 500);  // the last read lands at 400, its compute ends at 500
}

// The compute of layer i, started once n_pre layers are in, never waits
// for a read; with one layer fewer it would (unless n_pre is 1).
bool NeverWaits(uint32_t layers, double t_read, double t_comp, uint32_t n_pre) {
  double now = n_pre * t_read;  // compute starts
  for (uint32_t i = 0; i < layers; ++i) {
    if ((i + 1) * t_read > now + 1e-6) return false;
    now += t_comp;
  }
  return true;
}

TEST(PreloadPlannerTest, TheDepthIsTheSmallestThatNeverWaits) {
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<uint32_t> layer_count(1, 128);
  std::uniform_real_distribution<double> time(1, 5000);
  for (int trial = 0; trial < 2000; ++trial) {
    PreloadInput in;
    in.layers = layer_count(rng);
    in.read_bytes_per_s = 1e6;
    in.bytes_per_layer = static_cast<uint64_t>(time(rng));
    in.compute_us_per_layer = time(rng);
    in.margin = 0;
    const PreloadPlan plan = PlanPreload(in);
    const double t_read = double(in.bytes_per_layer);
    ASSERT_GE(plan.layers_to_preload, 1u);
    ASSERT_LE(plan.layers_to_preload, in.layers);
    ASSERT_TRUE(NeverWaits(in.layers, t_read, in.compute_us_per_layer, plan.layers_to_preload))
        << in.layers << " layers, read " << t_read << ", compute " << in.compute_us_per_layer;
    if (plan.layers_to_preload > 1) {
      ASSERT_FALSE(NeverWaits(in.layers, t_read, in.compute_us_per_layer, plan.layers_to_preload - 1))
          << in.layers << " layers, read " << t_read << ", compute " << in.compute_us_per_layer;
    }
  }
}

}  // namespace
}  // namespace kvtier

// Client::PlanPreload: the daemon plans layer-wise preloading with each
// tier's measured read bandwidth (Engine::PlanPreload).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tests/testing/test_daemon.h"

namespace kvtier::testing {
namespace {

constexpr uint64_t kBlock = 64 * 1024;  // TestNamespace's whole block

// The formula of policy/preload_planner.h, written out again: the plan
// must be what it gives with the bandwidth the daemon reports.
uint32_t ExpectedDepth(double t_read, double t_comp, uint32_t layers) {
  if (t_read <= t_comp) return 1;
  return static_cast<uint32_t>(std::ceil(layers - (layers - 1) * t_comp / t_read - 1e-9));
}

TEST(PreloadPlanTest, TheNvmePlanUsesTheMeasuredReadsOfTheTier) {
  TestDaemonOptions options;
  options.arena_bytes = 4 << 20;
  options.nvme_in_memory = true;
  options.nvme_bytes = 16 << 20;
  options.nvme_region_bytes = 1 << 20;
  TestDaemon daemon(options);
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  constexpr uint64_t kLayerBytes = 32ull << 20;
  // Before any read from NVMe: the engine's initial 1 GB/s.
  auto before = client->PlanPreload(Tier::kNvme, kLayerBytes, 500, 36);
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  EXPECT_DOUBLE_EQ(before->read_bytes_per_s, 1e9);
  const double t_read = kLayerBytes / 1e9 * 1e6 * 1.1 + Engine::kBelowLayerOverheadUs;
  EXPECT_NEAR(before->read_us_per_layer, t_read, 1e-6);
  EXPECT_EQ(before->layers_to_preload, ExpectedDepth(t_read, 500, 36));
  EXPECT_EQ(before->buffer_bytes, before->layers_to_preload * kLayerBytes);
  // Blocks pushed out to NVMe and read back (promotions): measured reads.
  const auto keys = TestKeys(TestNamespace(), 150, 31);  // ~2.3x the arena
  for (const auto& k : keys) ASSERT_TRUE(client->Put(0, k, Block(k, kBlock)).ok());
  daemon.engine().WaitForIdle();
  std::vector<std::byte> dst(kBlock);
  for (size_t i = 0; i < 20; ++i) ASSERT_TRUE(client->Get(0, keys[i], dst).ok()) << i;
  ASSERT_GT(EngineCounter(daemon, "engine.promotions"), 0);
  auto after = client->PlanPreload(Tier::kNvme, kLayerBytes, 500, 36);
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_NE(after->read_bytes_per_s, 1e9) << "planned with what the reads measured";
  EXPECT_GT(after->read_bytes_per_s, 0);
  const double measured_t_read = kLayerBytes / after->read_bytes_per_s * 1e6 * 1.1 + Engine::kBelowLayerOverheadUs;
  EXPECT_NEAR(after->read_us_per_layer, measured_t_read, 1e-6 * measured_t_read);
  EXPECT_EQ(after->layers_to_preload, ExpectedDepth(measured_t_read, 500, 36));
  EXPECT_NEAR(after->stall_us, after->layers_to_preload * measured_t_read, 1e-6 * after->stall_us);
  // Recompute instead when recomputing costs no more than the stall.
  auto cheap = client->PlanPreload(Tier::kNvme, kLayerBytes, 500, 36, after->stall_us / 36 / 2);
  ASSERT_TRUE(cheap.ok());
  EXPECT_TRUE(cheap->recompute_instead);
  auto dear = client->PlanPreload(Tier::kNvme, kLayerBytes, 500, 36, after->stall_us);
  ASSERT_TRUE(dear.ok());
  EXPECT_FALSE(dear->recompute_instead);
}

TEST(PreloadPlanTest, TheHostPlanUsesMemcpysRateAndBadRequestsAreRefused) {
  TestDaemon daemon;
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  auto host = client->PlanPreload(Tier::kHost, 32ull << 20, 0, 36);
  ASSERT_TRUE(host.ok()) << host.status().ToString();
  EXPECT_GT(host->read_bytes_per_s, 1e8) << "memcpy runs faster than 100 MB/s";
  EXPECT_EQ(host->layers_to_preload, 36u) << "nothing to hide the reads behind";
  auto again = client->PlanPreload(Tier::kHost, 4096, 1e6, 36);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->read_bytes_per_s, host->read_bytes_per_s) << "measured once";
  EXPECT_EQ(again->layers_to_preload, 1u);
  EXPECT_EQ(client->PlanPreload(Tier::kNvme, 4096, 1, 36).status().code(), StatusCode::kNotFound) << "no NVMe tier";
  EXPECT_EQ(client->PlanPreload(Tier::kRemote, 4096, 1, 36).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(client->PlanPreload(Tier::kHost, 4096, 1, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(client->PlanPreload(Tier::kHost, 0, 1, 36).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(client->PlanPreload(Tier::kHost, 4096, -1, 36).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(client->PlanPreload(static_cast<Tier>(9), 4096, 1, 36).status().code(), StatusCode::kInvalidArgument);
  // The connection goes on after refusals.
  EXPECT_TRUE(client->PlanPreload(Tier::kHost, 4096, 1, 36).ok());
}

}  // namespace
}  // namespace kvtier::testing

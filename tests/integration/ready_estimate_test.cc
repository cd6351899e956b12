// Client::EstimateReady against an in-process kvtierd with an NVMe tier:
// the estimate places the prefix as Lookup does, times the NVMe part at
// the very bandwidth PlanPreload plans with and the GPU copy at the host
// copy rate PlanPreload uses for the host tier; bad requests (an
// unregistered namespace, on the wire or in the client, half a key) are
// InvalidArgument and the daemon serves on. (Too many keys: the engine's
// bound, engine_ready_test.cc; one frame of the default 1 MiB holds fewer.)
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "proto/wire.h"
#include "tests/testing/protocol_checks.h"
#include "tests/testing/raw_connection.h"
#include "tests/testing/test_daemon.h"

namespace kvtier::testing {
namespace {

constexpr uint64_t kBlock = 64 * 1024;  // TestNamespace's whole block

TEST(ReadyEstimateTest, ThePrefixIsPlacedAsLookupAndTimedAtPlanPreloadsRates) {
  TestDaemonOptions options;
  options.arena_bytes = 4 << 20;
  options.nvme_in_memory = true;
  options.nvme_bytes = 16 << 20;
  options.nvme_region_bytes = 1 << 20;
  TestDaemon daemon(options);
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  // A chain ~2.3x the arena: its oldest blocks go to NVMe.
  const auto keys = TestKeys(TestNamespace(), 150, 41);
  for (const auto& k : keys) ASSERT_TRUE(client->Put(0, k, Block(k, kBlock)).ok());
  daemon.engine().WaitForIdle();
  std::vector<std::byte> dst(kBlock);
  for (size_t i = 140; i < 150; ++i) ASSERT_TRUE(client->Get(0, keys[i], dst).ok()) << "measured reads";

  auto lookup = client->Lookup(0, keys);
  ASSERT_TRUE(lookup.ok()) << lookup.status().ToString();
  auto ready = client->EstimateReady(0, keys);
  ASSERT_TRUE(ready.ok()) << ready.status().ToString();
  EXPECT_EQ(ready->prefix_blocks, lookup->prefix_blocks);
  EXPECT_EQ(ready->tiers, lookup->tiers);
  const size_t on_nvme = static_cast<size_t>(std::count(ready->tiers.begin(), ready->tiers.end(), Tier::kNvme));
  ASSERT_GT(on_nvme, 0u);
  ASSERT_EQ(ready->below.size(), 1u);
  const ReadyTierShare& nvme = ready->below[0];
  EXPECT_EQ(nvme.tier, Tier::kNvme);
  EXPECT_EQ(nvme.blocks + nvme.promoting_blocks, on_nvme);
  EXPECT_EQ(ready->prefix_bytes, ready->prefix_blocks * kBlock);

  auto plan = client->PlanPreload(Tier::kNvme, kBlock, 500, 36);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(nvme.read_bytes_per_s, plan->read_bytes_per_s) << "the bandwidth and percentile PlanPreload uses";
  EXPECT_DOUBLE_EQ(nvme.ready_us,
                   nvme.overhead_us + double(nvme.queued_bytes + nvme.bytes) / nvme.read_bytes_per_s * 1e6);
  EXPECT_DOUBLE_EQ(ready->host_ready_us, nvme.ready_us) << "the one tier below decides";
  auto host_plan = client->PlanPreload(Tier::kHost, kBlock, 500, 36);
  ASSERT_TRUE(host_plan.ok());
  EXPECT_EQ(ready->gpu_copy_bytes_per_s, host_plan->read_bytes_per_s) << "the host copy rate PlanPreload uses";
  EXPECT_EQ(ready->gpu_copy_bytes, ready->prefix_bytes) << "no HBM tier";
  EXPECT_DOUBLE_EQ(ready->gpu_ready_us,
                   ready->host_ready_us + double(ready->gpu_copy_bytes) / ready->gpu_copy_bytes_per_s * 1e6);
  EXPECT_EQ(EngineCounter(daemon, "engine.lookups"), 1) << "an estimate is not counted as a lookup";
}

TEST(ReadyEstimateTest, BadRequestsAreInvalidArgumentAndTheDaemonServesOn) {
  TestDaemon daemon;
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  const auto keys = TestKeys(TestNamespace(), 3, 42);
  EXPECT_EQ(client->EstimateReady(5, keys).status().code(), StatusCode::kInvalidArgument) << "checked by the client";

  RawConnection raw = HelloRaw(daemon);
  v1::Request unknown = wire::MakeReadyEstimate(5, keys);
  unknown.set_id(30);
  auto r = RoundTrip(raw, unknown);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->id(), 30u);
  EXPECT_EQ(wire::FromProto(r->status()).code(), StatusCode::kInvalidArgument) << r->DebugString();
  EXPECT_NE(r->status().message().find("namespace 5 is not registered"), std::string::npos);

  v1::Request odd = wire::MakeReadyEstimate(0, keys);
  odd.set_id(31);
  odd.mutable_ready_estimate()->add_keys(7);  // half a key
  r = RoundTrip(raw, odd);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(wire::FromProto(r->status()).code(), StatusCode::kInvalidArgument) << r->DebugString();

  ASSERT_TRUE(client->Put(0, keys[0], Block(keys[0], kBlock)).ok());
  auto ready = client->EstimateReady(0, keys);
  ASSERT_TRUE(ready.ok()) << ready.status().ToString();
  EXPECT_EQ(ready->tiers, std::vector<Tier>{Tier::kHost});
  EXPECT_EQ(ready->host_ready_us, 0);
  EXPECT_TRUE(ready->below.empty()) << "no tier below the host";
  ExpectDaemonServes(daemon);
}

}  // namespace
}  // namespace kvtier::testing

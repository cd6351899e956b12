// Layer-wise load (Client::BeginLoad, LayerLoad): from the host tier and
// from NVMe, zero-copy and into the caller's buffers, with the planned
// depth, a block that fails alone, and waits that time out while the
// drive stalls.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

#include "tests/testing/test_daemon.h"

namespace kvtier::testing {
namespace {

constexpr uint32_t kLayers = 4;         // TestNamespace
constexpr uint64_t kBlock = 64 * 1024;  // its whole block
constexpr uint64_t kLayerBytes = kBlock / kLayers;

// Layer `layer` of the block Put stored for `key`.
std::vector<std::byte> ExpectedLayer(const BlockKey& key, uint32_t layer) {
  const auto whole = Block(key, kBlock);
  return {whole.begin() + layer * kLayerBytes, whole.begin() + (layer + 1) * kLayerBytes};
}

bool SameBytes(std::span<const std::byte> a, const std::vector<std::byte>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size()) == 0;
}

TestDaemonOptions NvmeOptions() {
  TestDaemonOptions options;
  options.arena_bytes = 4 << 20;  // 64 blocks
  options.nvme_in_memory = true;
  options.nvme_bytes = 16 << 20;
  options.nvme_region_bytes = 1 << 20;
  return options;
}

// Puts 150 blocks through a 64-block arena: the first ones end up on NVMe
// only. Returns the keys, the first `below` of which Lookup reports on NVMe.
// A client of `daemon` whose calls wait at most `call_timeout` (null
// when it cannot connect).
std::unique_ptr<Client> ConnectWithin(TestDaemon& daemon, std::chrono::milliseconds call_timeout) {
  ClientOptions options = daemon.Options();
  options.call_timeout = call_timeout;
  auto connected = Client::Connect(options);
  EXPECT_TRUE(connected.ok()) << connected.status().ToString();
  return connected.ok() ? std::move(*connected) : nullptr;
}

std::vector<BlockKey> PushToNvme(TestDaemon& daemon, Client& client, size_t below) {
  const auto keys = TestKeys(TestNamespace(), 150, 77);
  for (const auto& k : keys) EXPECT_TRUE(client.Put(0, k, Block(k, kBlock)).ok());
  daemon.engine().WaitForIdle();
  auto found = client.Lookup(0, std::span(keys).first(below));
  EXPECT_TRUE(found.ok());
  if (found.ok()) {
    EXPECT_EQ(found->prefix_blocks, below);
    for (Tier t : found->tiers) EXPECT_EQ(t, Tier::kNvme);
  }
  return keys;
}

TEST(LayerLoadTest, AHostPrefixIsReadyAtOnceAndReadInPlace) {
  TestDaemon daemon;
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  const auto keys = TestKeys(TestNamespace(), 5, 3);
  for (const auto& k : keys) ASSERT_TRUE(client->Put(0, k, Block(k, kBlock)).ok());
  auto load = client->BeginLoad(0, keys);
  ASSERT_TRUE(load.ok()) << load.status().ToString();
  EXPECT_EQ(load->size(), keys.size());
  EXPECT_EQ(load->layer_count(), kLayers);
  EXPECT_EQ(load->layer_bytes(), kLayerBytes);
  EXPECT_EQ(load->source(), Tier::kHost);
  EXPECT_EQ(load->layers_ready(), kLayers) << "host blocks are in place before the answer";
  EXPECT_TRUE(load->done());
  for (uint32_t l = 0; l < kLayers; ++l) {
    ASSERT_TRUE(load->WaitLayer(l).ok());
    for (size_t i = 0; i < keys.size(); ++i) {
      EXPECT_TRUE(SameBytes(load->LayerSpan(i, l), ExpectedLayer(keys[i], l))) << i << "/" << l;
    }
  }
  EXPECT_EQ(load->usable_prefix(), keys.size());
  EXPECT_GT(EngineCounter(daemon, "engine.leases"), 0);
  ASSERT_TRUE(load->End().ok());
  EXPECT_EQ(EngineCounter(daemon, "engine.leases"), 0) << "End let the pins go";
  EXPECT_EQ(load->WaitLayer(0).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(load->LayerSpan(0, 0).empty());
  EXPECT_TRUE(load->End().ok()) << "idempotent";
}

TEST(LayerLoadTest, AnNvmePrefixLoadsLayerByLayerIntoTheCallersBuffers) {
  TestDaemon daemon(NvmeOptions());
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  const auto all = PushToNvme(daemon, *client, 8);
  const std::vector<BlockKey> keys(all.begin(), all.begin() + 8);
  std::vector<std::vector<std::byte>> buffers(keys.size(), std::vector<std::byte>(kBlock));
  LoadOptions options;
  for (auto& b : buffers) options.dst.emplace_back(b);
  auto load = client->BeginLoad(0, keys, options);
  ASSERT_TRUE(load.ok()) << load.status().ToString();
  EXPECT_EQ(load->source(), Tier::kNvme);
  for (uint32_t l = 0; l < kLayers; ++l) {
    ASSERT_TRUE(load->WaitLayer(l).ok()) << l;
    EXPECT_GE(load->layers_ready(), l + 1);
    for (size_t i = 0; i < keys.size(); ++i) {
      const std::span<const std::byte> copied(buffers[i].data() + l * kLayerBytes, kLayerBytes);
      EXPECT_TRUE(SameBytes(copied, ExpectedLayer(keys[i], l))) << i << "/" << l;
    }
  }
  EXPECT_EQ(load->usable_prefix(), keys.size());
  EXPECT_EQ(EngineCounter(daemon, "engine.load_streamed_blocks"), 8);
  EXPECT_EQ(EngineCounter(daemon, "engine.load_layer_reads"), 8 * kLayers);
  ASSERT_TRUE(load->End().ok());
  auto found = client->Lookup(0, keys);
  ASSERT_TRUE(found.ok());
  ASSERT_EQ(found->prefix_blocks, keys.size());
  for (Tier t : found->tiers) EXPECT_EQ(t, Tier::kHost) << "loaded blocks are promoted";
}

TEST(LayerLoadTest, WaitForDepthReturnsWithThePlannedLayersIn) {
  TestDaemon daemon(NvmeOptions());
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  const auto all = PushToNvme(daemon, *client, 6);
  const std::vector<BlockKey> keys(all.begin(), all.begin() + 6);
  LoadOptions options;
  options.compute_us_per_layer = 0.01;  // compute far faster than any read: hold nearly everything
  options.wait_for_depth = true;
  auto load = client->BeginLoad(0, keys, options);
  ASSERT_TRUE(load.ok()) << load.status().ToString();
  ASSERT_TRUE(load->plan().has_value());
  EXPECT_EQ(load->plan()->layers_to_preload, kLayers);
  EXPECT_EQ(load->plan()->buffer_bytes, kLayers * 6 * kLayerBytes) << "six blocks' layers a layer";
  EXPECT_GE(load->layers_ready(), load->plan()->layers_to_preload);
  // Without a compute time there is no plan; without a plan no depth.
  auto plain = client->BeginLoad(0, keys);
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->plan().has_value());
  LoadOptions bad;
  bad.wait_for_depth = true;
  EXPECT_EQ(client->BeginLoad(0, keys, bad).status().code(), StatusCode::kInvalidArgument);
}

TEST(LayerLoadTest, AMissingBlockFailsAloneAndEndsTheUsablePrefix) {
  TestDaemon daemon(NvmeOptions());
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  const auto all = PushToNvme(daemon, *client, 6);
  const std::vector<BlockKey> keys(all.begin(), all.begin() + 6);
  ASSERT_TRUE(daemon.nvme()->Erase(keys[2]).ok());  // lost from the drive
  auto load = client->BeginLoad(0, keys);
  ASSERT_TRUE(load.ok()) << load.status().ToString();
  ASSERT_TRUE(load->WaitAll().ok());
  EXPECT_TRUE(load->done());
  EXPECT_EQ(load->status(2).code(), StatusCode::kNotFound);
  EXPECT_EQ(load->usable_prefix(), 2u) << "the prefix is usable up to its first failed block";
  EXPECT_TRUE(load->LayerSpan(2, 0).empty()) << "a failed block serves no bytes";
  for (size_t i : {0u, 1u, 3u, 4u, 5u}) {
    EXPECT_TRUE(load->status(i).ok()) << i;
    for (uint32_t l = 0; l < kLayers; ++l) {
      EXPECT_TRUE(SameBytes(load->LayerSpan(i, l), ExpectedLayer(keys[i], l))) << i << "/" << l;
    }
  }
  EXPECT_EQ(load->status(6).code(), StatusCode::kInvalidArgument);
}

TEST(LayerLoadTest, AWaitTimesOutWhileTheDriveStallsAndSucceedsAfter) {
  TestDaemon daemon(NvmeOptions());
  auto connected = ConnectWithin(daemon, std::chrono::milliseconds(200));
  ASSERT_NE(connected, nullptr);
  Client& client = *connected;
  const auto all = PushToNvme(daemon, client, 4);
  const std::vector<BlockKey> keys(all.begin(), all.begin() + 4);
  daemon.nvme_device()->HoldReads();
  auto load = client.BeginLoad(0, keys);
  ASSERT_TRUE(load.ok()) << load.status().ToString();
  EXPECT_EQ(load->layers_ready(), 0u);
  EXPECT_EQ(load->WaitLayer(0).code(), StatusCode::kTimedOut);
  daemon.nvme_device()->ReleaseReads();
  ASSERT_TRUE(load->WaitAll().ok()) << "the load went on; so does the connection";
  EXPECT_EQ(load->usable_prefix(), keys.size());
  EXPECT_TRUE(client.Lookup(0, keys).ok());
}

// LoadOptions::deadline: past it a wait no longer waits; the blocks not
// whole then (those on the stalled drive) fail with TimedOut so the engine
// recomputes them, and the host blocks before them are served as usual.
// The call timeout is far longer: the deadline, not it, ends the wait.
TEST(LayerLoadTest, PastItsDeadlineALoadFailsTheBlocksOnAStalledDriveAndServesTheRest) {
  TestDaemon daemon(NvmeOptions());
  auto connected = ConnectWithin(daemon, std::chrono::seconds(60));
  ASSERT_NE(connected, nullptr);
  Client& client = *connected;
  const auto all = PushToNvme(daemon, client, 4);
  // Two host blocks (the newest), then two on NVMe.
  const std::vector<BlockKey> keys{all[148], all[149], all[0], all[1]};
  daemon.nvme_device()->HoldReads();
  LoadOptions load_options;
  load_options.deadline = std::chrono::milliseconds(300);
  auto load = client.BeginLoad(0, keys, load_options);
  ASSERT_TRUE(load.ok()) << load.status().ToString();
  ASSERT_TRUE(load->WaitLayer(0).ok());
  for (size_t b : {2, 3}) {
    const Status s = load->status(b);
    EXPECT_EQ(s.code(), StatusCode::kTimedOut) << b << ": " << s.ToString();
    EXPECT_NE(s.message().find("deadline"), std::string::npos) << s.ToString();
    EXPECT_TRUE(load->LayerSpan(b, 0).empty());
  }
  EXPECT_EQ(load->usable_prefix(), 2u);
  // Later waits do not wait; the host blocks' layers are all there, exact.
  ASSERT_TRUE(load->WaitAll().ok());
  for (size_t b : {0, 1}) {
    EXPECT_TRUE(load->status(b).ok());
    for (uint32_t l = 0; l < kLayers; ++l) EXPECT_TRUE(SameBytes(load->LayerSpan(b, l), ExpectedLayer(keys[b], l)));
  }
  daemon.nvme_device()->ReleaseReads();
  EXPECT_TRUE(load->End().ok());
  EXPECT_EQ(StatsCounter(client, "engine.loads_open"), 0);
}

// A block the daemon's estimate says cannot be in host memory by the
// deadline fails in BeginLoad's answer, before any wait, and is not read:
// here the deadline is shorter than one read's overhead (the model's
// floor), so no NVMe block can make it whatever the drive's rate, once
// the estimate has the reads it needs to judge (ReadyEstimator::Late).
TEST(LayerLoadTest, ABlockThatCannotArriveByTheDeadlineFailsAtOnceAndIsNotRead) {
  TestDaemon daemon(NvmeOptions());
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  const size_t warm = 16;  // ReadyEstimator::kLateMinSamples reads, one at a time
  const auto all = PushToNvme(daemon, *client, 2 + warm);
  std::vector<std::byte> bytes(kBlock);
  for (size_t i = 2; i < 2 + warm; ++i) {
    auto got = client->Get(0, all[i], bytes);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
  }
  const std::vector<BlockKey> keys{all[148], all[149], all[0], all[1]};
  const int64_t layer_reads = StatsCounter(*client, "engine.load_layer_reads");
  LoadOptions load_options;
  load_options.deadline = std::chrono::microseconds(10);
  auto load = client->BeginLoad(0, keys, load_options);
  ASSERT_TRUE(load.ok()) << load.status().ToString();
  for (size_t b : {2, 3}) {
    const Status s = load->status(b);  // no WaitLayer yet: from the answer
    EXPECT_EQ(s.code(), StatusCode::kTimedOut) << b << ": " << s.ToString();
    EXPECT_NE(s.message().find("estimate"), std::string::npos) << s.ToString();
  }
  EXPECT_TRUE(load->done()) << "nothing is left loading";
  ASSERT_TRUE(load->WaitAll().ok());
  EXPECT_EQ(load->usable_prefix(), 2u);
  for (size_t b : {0, 1}) {
    for (uint32_t l = 0; l < kLayers; ++l) EXPECT_TRUE(SameBytes(load->LayerSpan(b, l), ExpectedLayer(keys[b], l)));
  }
  EXPECT_TRUE(load->End().ok());
  EXPECT_EQ(StatsCounter(*client, "engine.load_late_blocks"), 2);
  EXPECT_EQ(StatsCounter(*client, "engine.load_layer_reads"), layer_reads) << "the late blocks were not read";
  // Still on NVMe, and a load with time to spare reads them.
  load_options.deadline = std::chrono::seconds(30);
  auto again = client->BeginLoad(0, keys, load_options);
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE(again->WaitAll().ok());
  EXPECT_EQ(again->usable_prefix(), keys.size());
  EXPECT_GT(StatsCounter(*client, "engine.load_layer_reads"), layer_reads);
  EXPECT_EQ(StatsCounter(*client, "engine.load_late_blocks"), 2);
}

// Without a deadline of its own, a load with recompute_us_per_layer set
// gives up once recomputing the prefix would have been done: layers x it.
TEST(LayerLoadTest, TheDefaultDeadlineIsTheRecomputeTime) {
  TestDaemon daemon(NvmeOptions());
  auto connected = ConnectWithin(daemon, std::chrono::seconds(60));
  ASSERT_NE(connected, nullptr);
  Client& client = *connected;
  const auto all = PushToNvme(daemon, client, 2);
  const std::vector<BlockKey> keys{all[0], all[1]};
  daemon.nvme_device()->HoldReads();
  LoadOptions load_options;
  load_options.recompute_us_per_layer = 50'000;  // kLayers x 50 ms
  auto load = client.BeginLoad(0, keys, load_options);
  ASSERT_TRUE(load.ok()) << load.status().ToString();
  ASSERT_TRUE(load->WaitAll().ok());
  EXPECT_EQ(load->status(0).code(), StatusCode::kTimedOut) << load->status(0).ToString();
  EXPECT_EQ(load->usable_prefix(), 0u);
  daemon.nvme_device()->ReleaseReads();
  EXPECT_TRUE(load->End().ok());
  // A load that is in place in time is not touched by its deadline.
  load_options.recompute_us_per_layer = 0;
  load_options.deadline = std::chrono::seconds(30);
  auto again = client.BeginLoad(0, keys, load_options);
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE(again->WaitAll().ok());
  EXPECT_EQ(again->usable_prefix(), keys.size());
  LoadOptions bad;
  bad.deadline = std::chrono::microseconds(-1);
  EXPECT_EQ(client.BeginLoad(0, keys, bad).status().code(), StatusCode::kInvalidArgument);
}

TEST(LayerLoadTest, BadLoadsAreRefusedAndADroppedLoadLeavesNothingPinned) {
  TestDaemon daemon;
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  const auto keys = TestKeys(TestNamespace(), 3, 9);
  for (const auto& k : keys) ASSERT_TRUE(client->Put(0, k, Block(k, kBlock)).ok());
  EXPECT_EQ(client->BeginLoad(0, {}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(client->BeginLoad(3, keys).status().code(), StatusCode::kInvalidArgument);
  std::vector<std::byte> small(kBlock - 1);
  LoadOptions too_small;
  too_small.dst.assign(keys.size(), std::span<std::byte>(small));
  EXPECT_EQ(client->BeginLoad(0, keys, too_small).status().code(), StatusCode::kInvalidArgument);
  LoadOptions wrong_count;
  wrong_count.dst.assign(1, std::span<std::byte>(small));
  EXPECT_EQ(client->BeginLoad(0, keys, wrong_count).status().code(), StatusCode::kInvalidArgument);
  {
    auto load = client->BeginLoad(0, keys);
    ASSERT_TRUE(load.ok());
    EXPECT_EQ(load->WaitLayer(kLayers).code(), StatusCode::kInvalidArgument);
  }  // dropped without End: ended without waiting
  EXPECT_EQ(StatsCounter(*client, "engine.loads_open"), 0);
  EXPECT_EQ(StatsCounter(*client, "engine.leases"), 0);
}

}  // namespace
}  // namespace kvtier::testing

// The two-tier data path through a real server and clients: blocks pushed
// out of the arena come back from NVMe byte-exact, Lookup names their tier,
// and they survive a restart of the daemon on the same files.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <random>
#include <thread>

#include "tests/testing/test_daemon.h"

namespace kvtier::testing {
namespace {

// TestNamespace(): 16 tokens x 4 layers x 1 KiB = 64 KiB per whole block.
constexpr size_t kBlockBytes = 64 << 10;

std::vector<std::byte> WholeBlock(const BlockKey& key, uint64_t salt = 0) {
  std::vector<std::byte> bytes(kBlockBytes);
  FillBlockBytes(key, salt, bytes);
  return bytes;
}

TestDaemonOptions TwoTiers(const std::string& dir) {
  TestDaemonOptions options;
  options.arena_bytes = 4 << 20;  // 64 blocks in DRAM
  options.nvme_path = dir + "/tier.dat";
  options.nvme_bytes = 48 << 20;
  options.nvme_region_bytes = 4 << 20;
  return options;
}

TEST(NvmeDaemon, BlocksBeyondTheArenaComeBackFromNvmeByteExact) {
  const std::string dir = MakeTempDir();
  {
    TestDaemon daemon(TwoTiers(dir));
    auto client = daemon.Connect();
    ASSERT_NE(client, nullptr);
    const auto keys = TestKeys(TestNamespace(), 300, 21);  // ~19 MiB: 4.7x the arena
    for (const auto& k : keys) ASSERT_TRUE(client->Put(0, k, WholeBlock(k)).ok());
    daemon.engine().WaitForIdle();  // demotions written
    auto found = client->Lookup(0, keys);
    ASSERT_TRUE(found.ok()) << found.status().ToString();
    ASSERT_EQ(found->prefix_blocks, keys.size());
    EXPECT_EQ(found->tiers.front(), Tier::kNvme);
    EXPECT_EQ(found->tiers.back(), Tier::kHost);
    std::vector<std::byte> dst(kBlockBytes);
    for (size_t i = 0; i < keys.size(); ++i) {
      auto got = client->Get(0, keys[i], dst);
      ASSERT_TRUE(got.ok()) << i << ": " << got.status().ToString();
      ASSERT_EQ(*got, kBlockBytes);
      ASSERT_TRUE(CheckBlockBytes(keys[i], 0, dst)) << "block " << i;
    }
    auto c = StatsCounters(*client);
    EXPECT_GT(c["engine.demotions"], 200);
    EXPECT_GT(c["engine.promotions"], 200);
    EXPECT_EQ(c["nvme.corrupt_reads"], 0);
  }
  RemoveTree(dir);
}

// Layer-wise loading through the client: GetLayers returns exactly the
// layers asked for, from the arena for host blocks (directory or pin) and
// by reading only those layers from NVMe (no promotion) for the others.
TEST(NvmeDaemon, GetLayersReturnsExactlyThoseLayersFromEveryTier) {
  const std::string dir = MakeTempDir();
  {
    TestDaemon daemon(TwoTiers(dir));
    auto client = daemon.Connect();
    auto socket_only = daemon.ConnectSocketOnly();
    ASSERT_NE(client, nullptr);
    ASSERT_NE(socket_only, nullptr);
    const auto keys = TestKeys(TestNamespace(), 100, 23);  // the first ~36 end up on NVMe only
    for (const auto& k : keys) ASSERT_TRUE(client->Put(0, k, WholeBlock(k)).ok());
    daemon.engine().WaitForIdle();
    auto before = client->Lookup(0, keys);
    ASSERT_TRUE(before.ok());
    ASSERT_EQ(before->tiers.front(), Tier::kNvme);
    ASSERT_EQ(before->tiers.back(), Tier::kHost);
    constexpr size_t kLayerBytes = kBlockBytes / 4;  // TestNamespace has 4 layers
    std::vector<std::vector<std::byte>> bufs(keys.size(), std::vector<std::byte>(2 * kLayerBytes));
    std::vector<std::span<std::byte>> dst(bufs.begin(), bufs.end());
    // In batches of 10: a batch is pinned at once (host blocks in place,
    // NVMe layers in transient space), and 100 do not fit the arena together.
    constexpr size_t kBatch = 10;
    for (Client* c : {client.get(), socket_only.get()}) {
      std::vector<Result<size_t>> got;
      for (size_t at = 0; at < keys.size(); at += kBatch) {
        auto part = c->GetLayers(0, std::span(keys).subspan(at, kBatch), 1, 3, std::span(dst).subspan(at, kBatch));
        for (auto& r : part) got.push_back(std::move(r));
      }
      ASSERT_EQ(got.size(), keys.size());
      for (size_t i = 0; i < keys.size(); ++i) {
        ASSERT_TRUE(got[i].ok()) << i << ": " << got[i].status().ToString();
        ASSERT_EQ(*got[i], 2 * kLayerBytes);
        const auto whole = WholeBlock(keys[i]);
        ASSERT_TRUE(std::equal(bufs[i].begin(), bufs[i].end(), whole.begin() + kLayerBytes)) << "block " << i;
      }
    }
    auto after = client->Lookup(0, keys);
    ASSERT_TRUE(after.ok());
    EXPECT_EQ(after->tiers.front(), Tier::kNvme) << "layer reads must not promote";
    auto bad = client->GetLayers(0, std::span(keys).first(1), 2, 5, std::span(dst).first(1));
    EXPECT_EQ(bad[0].status().code(), StatusCode::kInvalidArgument) << "layer 4 does not exist";
    auto c = StatsCounters(*client);
    EXPECT_GT(c["engine.layer_reads"], 0);
    EXPECT_EQ(c["engine.promotions"], 0);
    EXPECT_EQ(c["engine.zombie_blocks"], 0) << "every transient layer buffer was released";
  }
  RemoveTree(dir);
}

TEST(NvmeDaemon, NvmeBlocksSurviveADaemonRestart) {
  const std::string dir = MakeTempDir();
  const auto keys = TestKeys(TestNamespace(), 200, 22);
  size_t on_nvme = 0;
  {
    TestDaemon daemon(TwoTiers(dir));
    auto client = daemon.Connect();
    ASSERT_NE(client, nullptr);
    for (const auto& k : keys) ASSERT_TRUE(client->Put(0, k, WholeBlock(k, 5)).ok());
    daemon.engine().WaitForIdle();
    auto found = client->Lookup(0, keys);
    ASSERT_TRUE(found.ok());
    for (Tier t : found->tiers) on_nvme += t == Tier::kNvme;
    ASSERT_GT(on_nvme, 100u);
  }
  TestDaemon daemon(TwoTiers(dir));  // same files
  ASSERT_NE(daemon.nvme(), nullptr);
  EXPECT_EQ(daemon.nvme()->recovery().entries_loaded, static_cast<int64_t>(on_nvme));
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  auto found = client->Lookup(0, keys);
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(found->prefix_blocks, on_nvme) << "the demoted prefix is back; the DRAM-only tail is gone";
  std::vector<std::byte> dst(kBlockBytes);
  for (size_t i = 0; i < found->prefix_blocks; ++i) {
    auto got = client->Get(0, keys[i], dst);
    ASSERT_TRUE(got.ok()) << i << ": " << got.status().ToString();
    ASSERT_TRUE(CheckBlockBytes(keys[i], 5, dst)) << "block " << i;
  }
  RemoveTree(dir);
}

// Four clients write and read a working set ~6x the arena: blocks move
// between the tiers all the time; every byte read is checked.
TEST(NvmeDaemon, ConcurrentClientsUnderTierChurnNeverSeeWrongBytes) {
  const std::string dir = MakeTempDir();
  {
    TestDaemon daemon(TwoTiers(dir));
    const auto keys = TestKeys(TestNamespace(), 400, 23);
    std::atomic<int> wrong{0}, served{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        auto client = daemon.Connect();
        if (client == nullptr) return;
        std::mt19937_64 rng(1000 + t);
        std::vector<std::byte> dst(kBlockBytes);
        for (int op = 0; op < 600; ++op) {
          const auto& key = keys[rng() % keys.size()];
          if (rng() % 3 == 0) {
            Status s = client->Put(0, key, WholeBlock(key, 9));
            if (!s.ok() && s.code() != StatusCode::kAlreadyExists) ADD_FAILURE() << s.ToString();
            continue;
          }
          auto got = client->Get(0, key, dst);
          if (!got.ok()) continue;  // a miss (or NoSpace) is allowed
          served++;
          if (*got != kBlockBytes || !CheckBlockBytes(key, 9, dst)) wrong++;
        }
      });
    }
    for (auto& t : threads) t.join();
    EXPECT_EQ(wrong.load(), 0);
    EXPECT_GT(served.load(), 500);
  }
  RemoveTree(dir);
}

}  // namespace
}  // namespace kvtier::testing

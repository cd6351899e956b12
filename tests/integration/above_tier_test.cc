// The tier above the host through the wire: a daemon whose stack has a
// tier in the HBM tier's place (a MapTier here; the GPU one is
// tests/gpu/hbm_end_to_end_test.cc) answers Lookup with that tier, serves
// Gets and layer-wise loads into host memory of blocks held only there
// (read back into the host tier), and a client that maps no device pool
// never gets a block in place.
#include <gtest/gtest.h>

#include <vector>

#include "kvtier/block_key.h"
#include "tests/testing/map_tier.h"
#include "tests/testing/test_daemon.h"

namespace kvtier::testing {
namespace {

class AboveTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TestDaemonOptions options;
    options.above = &above_;
    daemon_ = std::make_unique<TestDaemon>(options);
    ClientOptions client_options;
    client_options.socket_path = daemon_->socket_path();
    client_options.namespaces = {descriptor_};
    auto client = Client::Connect(client_options);
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    client_ = std::move(*client);
  }
  void TearDown() override {
    client_.reset();
    daemon_.reset();
  }
  // Stores `key` in the tier above only, as a copy up would.
  void StoreAbove(const BlockKey& key) {
    std::vector<std::byte> bytes = Block(key, descriptor_.BlockBytes());
    ASSERT_TRUE(
        above_
            .Write(
                FingerprintNamespace(descriptor_), key, descriptor_.layer_count, bytes, [](Status) {}, std::nullopt)
            .ok());
  }

  NamespaceDescriptor descriptor_ = TestNamespace();
  MapTier above_{64ull << 20, "hbm"};  // outlives the daemon
  std::unique_ptr<TestDaemon> daemon_;
  std::unique_ptr<Client> client_;
};

TEST_F(AboveTierTest, LookupReportsItAndGetsReadBlocksHeldOnlyThere) {
  auto keys = TestKeys(descriptor_, 3, 7);
  std::vector<std::byte> host_block = Block(keys[0], descriptor_.BlockBytes());
  ASSERT_TRUE(client_->Put(0, keys[0], host_block).ok());
  StoreAbove(keys[1]);
  StoreAbove(keys[2]);

  auto hit = client_->Lookup(0, keys);
  ASSERT_TRUE(hit.ok()) << hit.status().ToString();
  ASSERT_EQ(hit->prefix_blocks, 3u);
  EXPECT_EQ(hit->tiers, (std::vector<Tier>{Tier::kHost, Tier::kHbm, Tier::kHbm}));

  std::vector<std::byte> got(descriptor_.BlockBytes());
  auto read = client_->Get(0, keys[1], got);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_TRUE(CheckBlockBytes(keys[1], 0, got));

  auto load = client_->BeginLoad(0, keys, LoadOptions{});
  ASSERT_TRUE(load.ok()) << load.status().ToString();
  ASSERT_TRUE(load->WaitAll().ok());
  for (size_t b = 0; b < keys.size(); ++b) {
    ASSERT_TRUE(load->status(b).ok()) << b;
    std::vector<std::byte> whole;
    for (uint32_t l = 0; l < descriptor_.layer_count; ++l) {
      auto span = load->TryLayerSpan(b, l);
      ASSERT_TRUE(span.ok()) << span.status().ToString();
      whole.insert(whole.end(), span->begin(), span->end());
    }
    EXPECT_TRUE(CheckBlockBytes(keys[b], 0, whole)) << b;
  }
  ASSERT_TRUE(load->End().ok());
  auto counters = StatsCounters(*client_);
  EXPECT_EQ(counters["engine.hbm_in_place_blocks"], 0);  // this client mapped no pool
  EXPECT_GE(counters["engine.hbm_lookup_hits"], 2);
}

}  // namespace
}  // namespace kvtier::testing

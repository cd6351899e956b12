// The oracle of `kvtier stress` (tools/stress/stress_values.h): exact bytes pass,
// and each way a read can be wrong is flagged and named, so the checker
// can fail. Also the key space and the latency histogram.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <unordered_set>

#include "tools/stress/stress_tally.h"
#include "tools/stress/stress_values.h"

namespace kvtier::tools {
namespace {

class StressValuesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto space = KeySpace::Build({/*seed=*/42, /*namespaces=*/2, /*chains=*/4, /*chain_blocks=*/4});
    ASSERT_TRUE(space.ok()) << space.status().ToString();
    space_ = std::move(*space);
  }
  const StressNamespace& ns(size_t i) const { return space_.namespaces()[i]; }
  std::vector<std::byte> Block(const StressNamespace& n, const BlockKey& key) const {
    std::vector<std::byte> bytes(n.shape.block_bytes());
    FillBlock(n.shape, key, bytes);
    return bytes;
  }

  KeySpace space_;
};

TEST_F(StressValuesTest, ExactBlockAndLayerRangesPass) {
  const StressNamespace& n = ns(0);
  const BlockKey key = n.keys[0];
  const auto block = Block(n, key);
  EXPECT_TRUE(CheckBlock(n.shape, key, block).ok());
  // Any layer range is the matching slice of the whole block.
  const uint32_t first = 1, last = n.shape.layer_count - 1;
  std::vector<std::byte> range((last - first) * n.shape.layer_bytes);
  FillLayers(n.shape, key, first, last, range);
  EXPECT_EQ(0, std::memcmp(range.data(), block.data() + first * n.shape.layer_bytes, range.size()));
  EXPECT_TRUE(CheckLayers(n.shape, key, first, last, range).ok());
}

TEST_F(StressValuesTest, AWrongByteIsFlagged) {
  const StressNamespace& n = ns(0);
  const BlockKey key = n.keys[1];
  auto block = Block(n, key);
  block[n.shape.layer_bytes * 2 + 1000] ^= std::byte{0x01};
  const ValueCheck check = CheckBlock(n.shape, key, block);
  EXPECT_EQ(check.mismatch, Mismatch::kBytes);
  EXPECT_NE(check.detail.find("layer 2"), std::string::npos) << check.detail;
  EXPECT_NE(check.detail.find("byte 1000"), std::string::npos) << check.detail;
  EXPECT_NE(check.detail.find("does not match"), std::string::npos) << check.detail;
}

TEST_F(StressValuesTest, ASwappedKeyIsFlaggedAsAnotherKeysBytes) {
  const StressNamespace& n = ns(0);
  const BlockKey asked = n.keys[2];
  const BlockKey other = n.keys[3];
  const auto block = Block(n, other);
  const ValueCheck check = CheckBlock(n.shape, asked, block);
  EXPECT_EQ(check.mismatch, Mismatch::kOtherKey);
  EXPECT_NE(check.detail.find(other.ToHex()), std::string::npos) << check.detail;
}

TEST_F(StressValuesTest, AShortOrLongReadIsFlagged) {
  const StressNamespace& n = ns(1);
  const BlockKey key = n.keys[0];
  auto block = Block(n, key);
  const auto shorter = std::span<const std::byte>(block).first(block.size() - 1);
  EXPECT_EQ(CheckBlock(n.shape, key, shorter).mismatch, Mismatch::kLength);
  EXPECT_EQ(CheckBlock(n.shape, key, std::span<const std::byte>()).mismatch, Mismatch::kLength);
  block.push_back(std::byte{0});
  EXPECT_EQ(CheckBlock(n.shape, key, block).mismatch, Mismatch::kLength);
}

TEST_F(StressValuesTest, AnotherLayerIsFlagged) {
  const StressNamespace& n = ns(0);
  const BlockKey key = n.keys[0];
  std::vector<std::byte> layer(n.shape.layer_bytes);
  FillLayers(n.shape, key, 3, 4, layer);
  const ValueCheck check = CheckLayers(n.shape, key, 2, 3, layer);  // asked for layer 2, got 3
  EXPECT_EQ(check.mismatch, Mismatch::kOtherLayer);
  EXPECT_NE(check.detail.find("holds layer 3"), std::string::npos) << check.detail;
}

TEST_F(StressValuesTest, TheSameKeyInAnotherNamespaceIsFlagged) {
  ValueShape other = ns(0).shape;
  other.ns_tag ^= 1;
  const BlockKey key = ns(0).keys[0];
  std::vector<std::byte> block(other.block_bytes());
  FillBlock(other, key, block);
  EXPECT_EQ(CheckBlock(ns(0).shape, key, block).mismatch, Mismatch::kOtherNamespace);
}

TEST_F(StressValuesTest, ZerosAreNobodysBytes) {
  const StressNamespace& n = ns(0);
  const std::vector<std::byte> zeros(n.shape.block_bytes());
  const ValueCheck check = CheckBlock(n.shape, n.keys[0], zeros);
  EXPECT_EQ(check.mismatch, Mismatch::kBytes);
  EXPECT_NE(check.detail.find("no stress header"), std::string::npos) << check.detail;
}

TEST_F(StressValuesTest, KeySpaceIsDeterministicAndChainsSharePrefixes) {
  auto again = KeySpace::Build({42, 2, 4, 4});
  ASSERT_TRUE(again.ok());
  auto other_seed = KeySpace::Build({43, 2, 4, 4});
  ASSERT_TRUE(other_seed.ok());
  EXPECT_EQ(again->namespaces()[0].chains, ns(0).chains);
  EXPECT_NE(other_seed->namespaces()[0].chains, ns(0).chains);
  // Chain 1 shares 3/4 of its blocks with chain 0 (chain c with chain c/2).
  EXPECT_EQ(ns(0).chains[1][0], ns(0).chains[0][0]);
  EXPECT_EQ(ns(0).chains[1][2], ns(0).chains[0][2]);
  EXPECT_NE(ns(0).chains[1][3], ns(0).chains[0][3]);
  // Every key listed once; different namespaces, different geometry.
  std::unordered_set<BlockKey> keys(ns(0).keys.begin(), ns(0).keys.end());
  EXPECT_EQ(keys.size(), ns(0).keys.size());
  EXPECT_LT(ns(0).keys.size(), size_t{4 * 4});
  EXPECT_NE(ns(0).shape.block_bytes(), ns(1).shape.block_bytes());
  EXPECT_EQ(ns(0).shape.block_bytes(), ns(0).descriptor.BlockBytes());
  EXPECT_FALSE(KeySpace::Build({1, 0, 4, 4}).ok());
  EXPECT_FALSE(KeySpace::Build({1, kMaxStressNamespaces + 1, 4, 4}).ok());
}

TEST(StressLatencyTest, PercentilesAreWithinTheBucketPrecision) {
  LatencyHistogramNs h;
  for (uint64_t v = 1; v <= 100000; ++v) h.Add(v * 1000);  // 1 us .. 100 ms
  EXPECT_EQ(h.count(), 100000u);
  EXPECT_EQ(h.max(), 100000u * 1000);
  EXPECT_NEAR(static_cast<double>(h.Percentile(0.5)), 50e6, 50e6 * 0.04);
  EXPECT_NEAR(static_cast<double>(h.Percentile(0.99)), 99e6, 99e6 * 0.04);
  EXPECT_EQ(h.Percentile(1.0), h.max());
  LatencyHistogramNs other;
  other.Add(7);
  other.Merge(h);
  EXPECT_EQ(other.count(), 100001u);
  EXPECT_EQ(other.Percentile(1e-9), 7u);
}

}  // namespace
}  // namespace kvtier::tools

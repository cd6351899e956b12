// The host tier's BlockTier face (daemon/engine/host_block_tier.h), beyond the
// contract every tier meets (tier_contract_test.cc): it reads only what the
// host tier holds (a read never promotes), its writes are blocks like any
// client's (visible to pins, evicted and demoted like them), and bytes
// that rotted in the arena are a Corruption that drops the block.
#include <gtest/gtest.h>

#include <future>
#include <memory>
#include <vector>

#include "common/checksum.h"
#include "daemon/engine/engine.h"
#include "tests/testing/engine_stack.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/test_daemon.h"
#include "tiers/nvme/nvme_tier.h"

namespace kvtier {
namespace {

using ::kvtier::testing::SlotBytes;

constexpr uint64_t kBlockBytes = 64 << 10;
constexpr uint64_t kHostBlocks = 4;
constexpr NamespaceFingerprint kNs{0x4057, 0xb10c};

BlockKey Key(uint64_t i) { return BlockKey{0x4057b, i}; }

class HostBlockTierTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_NE(engine_, nullptr); }

  Status Write(uint64_t i) {
    std::vector<std::byte> payload(kBlockBytes);
    ::kvtier::testing::FillBlockBytes(Key(i), 0, payload);
    clock_.AdvanceUs(1);
    std::promise<Status> done;
    Status accepted = tier_->Write(kNs, Key(i), 1, payload, [&done](Status s) { done.set_value(s); });
    if (!accepted.ok()) return accepted;
    return done.get_future().get();
  }
  Result<size_t> Read(uint64_t i, std::vector<std::byte>& out) {
    out.assign(kBlockBytes, std::byte{0});
    std::promise<Result<size_t>> done;
    Status accepted = tier_->Read(Key(i), 0, 1, out, [&done](Result<size_t> r) { done.set_value(std::move(r)); });
    if (!accepted.ok()) return accepted;
    return done.get_future().get();
  }
  std::map<std::string, int64_t> Counters() { return ::kvtier::testing::EngineCounters(*engine_); }

  ::kvtier::testing::EngineStack stack_{kHostBlocks * kBlockBytes};
  ::kvtier::testing::FakeClock& clock_ = stack_.clock;
  HostTier* host_ = stack_.host.get();
  NvmeTier* nvme_ = stack_.nvme.get();
  Engine* engine_ = stack_.engine.get();
  BlockTier* tier_ = engine_ != nullptr ? &engine_->host_tier() : nullptr;
};

TEST_F(HostBlockTierTest, WrittenBlocksAreClientBlocksEvictedAndDemotedLikeAnyOther) {
  for (uint64_t i = 0; i < kHostBlocks + 2; ++i) ASSERT_TRUE(Write(i).ok()) << i;
  engine_->WaitForIdle();
  // The first two made room for the last two: they went down to NVMe.
  for (uint64_t i = 0; i < 2; ++i) {
    EXPECT_FALSE(tier_->Find(Key(i)).has_value()) << i;
    EXPECT_TRUE(nvme_->Find(Key(i)).has_value()) << i;
  }
  // A client pins a block written through the interface and sees its bytes.
  const BlockKey key = Key(kHostBlocks + 1);
  EXPECT_EQ(engine_->Lookup(kNs, {&key, 1}).tiers.at(0), Tier::kHost);
  auto grants = engine_->Pin(1, kNs, {&key, 1});
  ASSERT_TRUE(grants[0].status.ok()) << grants[0].status.ToString();
  EXPECT_TRUE(::kvtier::testing::CheckBlockBytes(key, 0, SlotBytes(*host_, grants[0].offset, grants[0].length)));
  engine_->Release(1, {&grants[0].lease, 1});
  EXPECT_EQ(Counters()["host.tier_writes"], int64_t(kHostBlocks + 2));
}

TEST_F(HostBlockTierTest, AReadNeverPromotesFromTheTiersBelow) {
  for (uint64_t i = 0; i < kHostBlocks + 1; ++i) ASSERT_TRUE(Write(i).ok());
  engine_->WaitForIdle();
  ASSERT_TRUE(nvme_->Find(Key(0)).has_value());
  std::vector<std::byte> out;
  EXPECT_EQ(Read(0, out).status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(tier_->Find(Key(0)).has_value());
  EXPECT_EQ(Counters()["engine.promotions"], 0);
}

TEST_F(HostBlockTierTest, BytesThatRottedInTheArenaAreCorruptionAndTheBlockIsDropped) {
  ASSERT_TRUE(Write(1).ok());
  const BlockKey key = Key(1);
  auto grants = engine_->Pin(1, kNs, {&key, 1});
  ASSERT_TRUE(grants[0].status.ok());
  SlotBytes(*host_, grants[0].offset, grants[0].length)[1000] ^= std::byte{0x01};
  engine_->Release(1, {&grants[0].lease, 1});
  std::vector<std::byte> out;
  EXPECT_EQ(Read(1, out).status().code(), StatusCode::kCorruption);
  EXPECT_FALSE(tier_->Find(key).has_value()) << "a block that failed its checksum is still served";
  EXPECT_EQ(engine_->Lookup(kNs, {&key, 1}).prefix_blocks, 0u);
  EXPECT_EQ(Counters()["host.tier_corrupt_reads"], 1);
}

TEST_F(HostBlockTierTest, EraseLeavesTheTiersBelowAlone) {
  for (uint64_t i = 0; i < kHostBlocks + 1; ++i) ASSERT_TRUE(Write(i).ok());
  engine_->WaitForIdle();
  std::vector<std::byte> out;
  const BlockKey key = Key(0);
  // Promote block 0 back into the host tier: it is in both now.
  auto grants = engine_->Pin(1, kNs, {&key, 1});
  ASSERT_TRUE(grants[0].status.ok());
  engine_->Release(1, {&grants[0].lease, 1});
  ASSERT_TRUE(tier_->Find(key).has_value());
  EXPECT_TRUE(tier_->Erase(key).ok());
  EXPECT_FALSE(tier_->Find(key).has_value());
  EXPECT_TRUE(nvme_->Find(key).has_value());
  EXPECT_EQ(engine_->Lookup(kNs, {&key, 1}).tiers.at(0), Tier::kNvme);
}

}  // namespace
}  // namespace kvtier

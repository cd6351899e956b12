// The engine with the real HbmTier above the host tier, over the
// host-memory device double (runs without a GPU): a load into GPU memory
// copies its hit up, the next such load gets the block in place at its
// pool offset (the bytes there are the block's), a held range outlives
// the block's eviction until the load ends, and an evicted block no other
// tier holds is demoted into the host tier with its bytes.
#include <gtest/gtest.h>

#include <memory>

#include "common/load_board.h"
#include "daemon/engine/engine.h"
#include "tests/gpu/fake_hbm_device.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/test_daemon.h"
#include "tiers/hbm/hbm_tier.h"

namespace kvtier {
namespace {

using ::kvtier::testing::CheckBlockBytes;
using ::kvtier::testing::FakeHbmDevice;
using ::kvtier::testing::SlotBytes;

constexpr uint32_t kLayers = 4;
constexpr uint64_t kBlockBytes = kLayers * (4 << 10);  // a multiple of the pool's 256-byte alignment
constexpr NamespaceFingerprint kNs{0x4b3, 0x9a};
constexpr ConnectionId kConn = 5;

BlockKey Key(uint64_t i) { return BlockKey{0x4b, i}; }

class EngineHbmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto device = std::make_unique<FakeHbmDevice>(2 * kBlockBytes, 8 * kBlockBytes);
    device_ = device.get();
    auto tier = HbmTier::Create(std::move(device));
    ASSERT_TRUE(tier.ok()) << tier.status().ToString();
    hbm_ = std::move(*tier);
    host_ = ::kvtier::testing::OpenTestHostTier(64 * kBlockBytes);
    ASSERT_NE(host_, nullptr);
    auto engine = Engine::Create(EngineOptions{2, EvictionPolicyId::kLru}, *host_, clock_, {}, hbm_.get());
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    engine_ = std::move(*engine);
    engine_->RegisterNamespace(kNs, NamespaceLayout{kLayers, kBlockBytes});
  }
  void TearDown() override { engine_.reset(); }

  Result<Engine::LoadStart> Load(const BlockKey& key) {
    auto start = engine_->BeginLoad(kConn, kNs, {&key, 1}, {.in_place = true});
    engine_->WaitForIdle();
    return start;
  }
  LoadBoardReader Board(const Engine::LoadStart& start) {
    return LoadBoardReader(SlotBytes(*host_, start.board_offset, start.board_bytes).data(), 1);
  }
  void End(const Engine::LoadStart& start) {
    ASSERT_TRUE(engine_->EndLoad(kConn, start.load).ok());
    engine_->WaitForIdle();
  }
  std::span<const std::byte> DeviceBytes(uint64_t offset) { return device_->memory().subspan(offset, kBlockBytes); }
  int64_t Counter(const std::string& name) { return ::kvtier::testing::EngineCounters(*engine_)[name]; }

  ::kvtier::testing::FakeClock clock_;
  FakeHbmDevice* device_ = nullptr;  // owned by hbm_
  std::unique_ptr<HbmTier> hbm_;
  std::unique_ptr<HostTier> host_;
  std::unique_ptr<Engine> engine_;
};

TEST_F(EngineHbmTest, AHitGoesUpAndIsThenHandedOutInPlace) {
  ASSERT_TRUE(::kvtier::testing::PutFilledBlock(*engine_, *host_, kConn, kNs, Key(1), kBlockBytes).ok());
  auto first = Load(Key(1));
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(Board(*first).state(0), BoardBlockState::kLoaded);
  End(*first);
  ASSERT_TRUE(hbm_->Find(Key(1)).has_value());
  EXPECT_EQ(::kvtier::testing::LookupTier(*engine_, kNs, Key(1)), Tier::kHbm);

  auto second = Load(Key(1));
  ASSERT_TRUE(second.ok());
  LoadBoardReader board = Board(*second);
  ASSERT_EQ(board.state(0), BoardBlockState::kInDevice);
  EXPECT_EQ(board.layers_ready(), kLayers);
  EXPECT_TRUE(CheckBlockBytes(Key(1), 0, DeviceBytes(board.offset(0))));
  End(*second);
  EXPECT_EQ(Counter("engine.hbm_in_place_blocks"), 1);
}

TEST_F(EngineHbmTest, EvictionsDemoteToHostAndSpareHeldRanges) {
  for (uint64_t i = 1; i <= 3; ++i) {
    ASSERT_TRUE(::kvtier::testing::PutFilledBlock(*engine_, *host_, kConn, kNs, Key(i), kBlockBytes).ok());
  }
  for (uint64_t i = 1; i <= 2; ++i) {
    auto up = Load(Key(i));
    ASSERT_TRUE(up.ok());
    End(*up);
  }
  ASSERT_TRUE(hbm_->Find(Key(1)).has_value());
  ASSERT_TRUE(engine_->host_tier().Erase(Key(1)).ok());  // now only in HBM

  auto held = Load(Key(1));  // in place: holds its range
  ASSERT_TRUE(held.ok());
  ASSERT_EQ(Board(*held).state(0), BoardBlockState::kInDevice);
  const uint64_t offset = Board(*held).offset(0);
  // Key(2) is now the least recently used: Key(3) going up evicts it (a
  // copy is in the host tier: no write).
  auto third = Load(Key(3));
  ASSERT_TRUE(third.ok());
  End(*third);
  EXPECT_FALSE(hbm_->Find(Key(2)).has_value());
  EXPECT_EQ(Counter("engine.hbm_demotions_to_host"), 0);
  // Key(2) going up again evicts Key(1), held by the load: it is demoted
  // into the host tier, and its range keeps its bytes until the load ends.
  auto again = Load(Key(2));
  ASSERT_TRUE(again.ok());
  End(*again);
  EXPECT_FALSE(hbm_->Find(Key(1)).has_value());
  EXPECT_TRUE(hbm_->Find(Key(2)).has_value());
  EXPECT_EQ(Counter("engine.hbm_demotions_to_host"), 1);
  EXPECT_TRUE(engine_->host_tier().Find(Key(1)).has_value());
  EXPECT_TRUE(CheckBlockBytes(Key(1), 0, DeviceBytes(offset)));
  End(*held);
  // Key(1) reads back exactly from the host tier.
  const BlockKey key = Key(1);
  auto grants = engine_->Pin(kConn, kNs, {&key, 1});
  ASSERT_TRUE(grants[0].status.ok()) << grants[0].status.ToString();
  EXPECT_TRUE(CheckBlockBytes(key, 0, SlotBytes(*host_, grants[0].offset, grants[0].length)));
  engine_->Release(kConn, {&grants[0].lease, 1});
}

}  // namespace
}  // namespace kvtier

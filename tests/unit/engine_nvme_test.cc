// Engine over a host tier and an NVMe tier (memory device + RocksDB index):
// eviction demotes, Lookup reports the tier, Pin promotes byte-exact, one
// read serves concurrent pins, Erase reaches both tiers, a corrupt record
// is a miss.
#include <gtest/gtest.h>

#include <algorithm>
#include <future>
#include <map>
#include <memory>
#include <thread>

#include "common/checksum.h"
#include "daemon/engine/engine.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/fault_injecting_device.h"
#include "tests/testing/memory_device.h"
#include "tests/testing/memory_nvme.h"
#include "tests/testing/test_daemon.h"
#include "tiers/nvme/nvme_tier.h"

namespace kvtier {
namespace {

using ::kvtier::testing::CheckBlockBytes;
using ::kvtier::testing::FakeClock;
using ::kvtier::testing::FaultInjectingDevice;
using ::kvtier::testing::FillBlockBytes;
using ::kvtier::testing::MemoryDevice;
using ::kvtier::testing::SlotBytes;

constexpr uint64_t kBlockBytes = 64 << 10;  // 4 layers of 16 KiB
constexpr uint32_t kLayers = 4;
constexpr NamespaceFingerprint kNs{0x1234, 0x5678};

BlockKey Key(uint64_t i) { return BlockKey{0xe17e, i}; }

class EngineNvmeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::kvtier::testing::MakeTempDir();
    memory_ = std::make_unique<MemoryDevice>(16 << 20);
    host_ = ::kvtier::testing::OpenTestHostTier(8 * kBlockBytes);  // 8 blocks in DRAM
    ASSERT_NE(host_, nullptr);
    auto tier = ::kvtier::testing::OpenMemoryNvmeTier(*memory_, dir_, clock_);
    ASSERT_TRUE(tier.ok()) << tier.status().ToString();
    nvme_ = std::move(*tier);
    auto engine = Engine::Create(EngineOptions{4, EvictionPolicyId::kLru}, *host_, clock_, nvme_.get());
    ASSERT_TRUE(engine.ok());
    engine_ = std::move(*engine);
    engine_->RegisterNamespace(kNs, NamespaceLayout{kLayers, kBlockBytes});
  }
  void TearDown() override {
    engine_.reset();
    nvme_.reset();
    ::kvtier::testing::RemoveTree(dir_);
  }

  Status Put(uint64_t i) {
    clock_.AdvanceUs(1);
    return ::kvtier::testing::PutFilledBlock(*engine_, *host_, 1, kNs, Key(i), kBlockBytes);
  }

  std::map<std::string, int64_t> Counters() { return ::kvtier::testing::EngineCounters(*engine_); }

  std::string dir_;
  FakeClock clock_;
  std::unique_ptr<MemoryDevice> memory_;
  std::unique_ptr<HostTier> host_;
  std::unique_ptr<NvmeTier> nvme_;
  std::unique_ptr<Engine> engine_;
};

TEST_F(EngineNvmeTest, EvictedBlocksAreDemotedAndLookupReportsTheirTier) {
  for (uint64_t i = 0; i < 20; ++i) ASSERT_TRUE(Put(i).ok()) << i;
  engine_->WaitForIdle();
  std::vector<BlockKey> keys;
  for (uint64_t i = 0; i < 20; ++i) keys.push_back(Key(i));
  auto found = engine_->Lookup(kNs, keys);
  ASSERT_EQ(found.prefix_blocks, 20u) << "every block is on some tier";
  EXPECT_EQ(found.tiers[0], Tier::kNvme);
  EXPECT_EQ(found.tiers[19], Tier::kHost);
  auto c = Counters();
  EXPECT_EQ(c["engine.demotions"], 12);
  EXPECT_EQ(c["engine.evictions"], 12);
  EXPECT_EQ(c["nvme.blocks"], 12);
  // The namespace's layer split survived: a layer range reads alone.
  auto info = nvme_->Find(Key(0));
  ASSERT_TRUE(info);
  EXPECT_EQ(info->layer_count, kLayers);
  EXPECT_EQ(engine_->Lookup(BlockKey{9, 9}, keys).prefix_blocks, 0u) << "another namespace sees nothing";
}

TEST_F(EngineNvmeTest, PinPromotesByteExactAndKeepsTheNvmeCopy) {
  for (uint64_t i = 0; i < 20; ++i) ASSERT_TRUE(Put(i).ok());
  engine_->WaitForIdle();
  const BlockKey key = Key(3);
  auto grants = engine_->Pin(7, kNs, {&key, 1});
  ASSERT_TRUE(grants[0].status.ok()) << grants[0].status.ToString();
  auto bytes = SlotBytes(*host_, grants[0].offset, grants[0].length);
  EXPECT_EQ(grants[0].length, kBlockBytes);
  EXPECT_TRUE(CheckBlockBytes(key, 0, bytes));
  EXPECT_EQ(grants[0].checksum, BlockChecksum(bytes));
  EXPECT_EQ(engine_->Lookup(kNs, {&key, 1}).tiers[0], Tier::kHost);
  EXPECT_TRUE(nvme_->Find(key)) << "inclusive: the NVMe copy stays";
  EXPECT_EQ(Counters()["engine.promotions"], 1);
  EXPECT_TRUE(engine_->Release(7, {&grants[0].lease, 1})[0].ok());
}

// A layer range of an NVMe-resident block reads only those layers into
// transient arena space held by the lease: byte-exact, no promotion, and
// the space returns at Release.
TEST_F(EngineNvmeTest, LayerRangePinReadsOnlyThoseLayersAndDoesNotPromote) {
  for (uint64_t i = 0; i < 20; ++i) ASSERT_TRUE(Put(i).ok());
  engine_->WaitForIdle();
  const BlockKey key = Key(2);
  ASSERT_EQ(engine_->Lookup(kNs, {&key, 1}).tiers[0], Tier::kNvme);
  std::vector<std::byte> whole(kBlockBytes);
  FillBlockBytes(key, 0, whole);
  auto bytes_read = [this] {
    CounterCollector c;
    nvme_->VisitCounters(c);
    for (const auto& [name, value] : c.counters()) {
      if (name == "nvme.device.read_bytes") return value;
    }
    return int64_t{-1};
  };
  const int64_t read_before = bytes_read();
  ASSERT_GE(read_before, 0) << "no nvme.device.read_bytes counter";
  auto grants = engine_->Pin(7, kNs, {&key, 1}, LayerSpan{1, 3});
  ASSERT_TRUE(grants[0].status.ok()) << grants[0].status.ToString();
  constexpr uint64_t kLayerBytes = kBlockBytes / kLayers;
  ASSERT_EQ(grants[0].length, 2 * kLayerBytes);
  auto got = SlotBytes(*host_, grants[0].offset, grants[0].length);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), whole.begin() + kLayerBytes)) << "layers 1 and 2, byte-exact";
  EXPECT_EQ(grants[0].checksum, 0u);
  EXPECT_LE(bytes_read() - read_before, static_cast<int64_t>(2 * kLayerBytes + 2 * 4096))
      << "more than the two layers (plus header and alignment) was read";
  EXPECT_EQ(engine_->Lookup(kNs, {&key, 1}).tiers[0], Tier::kNvme) << "a layer read promotes nothing";
  auto c = Counters();
  EXPECT_EQ(c["engine.promotions"], 0);
  EXPECT_EQ(c["engine.layer_reads"], 1);
  EXPECT_EQ(Counters()["engine.zombie_blocks"], 1) << "the transient space is held by the lease";
  EXPECT_TRUE(engine_->Release(7, {&grants[0].lease, 1})[0].ok());
  // (Making room for it may have evicted a block: compare with what is stored.)
  EXPECT_EQ(host_->used_bytes(), static_cast<uint64_t>(Counters()["engine.stored_bytes"]))
      << "the transient space was not returned";
  EXPECT_EQ(Counters()["engine.zombie_blocks"], 0);

  // A connection that ends without releasing returns it too.
  grants = engine_->Pin(8, kNs, {&key, 1}, LayerSpan{0, 1});
  ASSERT_TRUE(grants[0].status.ok());
  engine_->CloseConnection(8);
  EXPECT_EQ(host_->used_bytes(), static_cast<uint64_t>(Counters()["engine.stored_bytes"]));
  EXPECT_EQ(Counters()["engine.leases"], 0);

  // Ranges outside the block, and misses.
  EXPECT_EQ(engine_->Pin(7, kNs, {&key, 1}, LayerSpan{2, 5})[0].status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(engine_->Pin(7, kNs, {&key, 1}, LayerSpan{3, 3})[0].status.code(), StatusCode::kInvalidArgument);
  const BlockKey absent = Key(99);
  EXPECT_EQ(engine_->Pin(7, kNs, {&absent, 1}, LayerSpan{0, 1})[0].status.code(), StatusCode::kNotFound);
}

// A layer range of a host block is a pin of those bytes in place.
TEST_F(EngineNvmeTest, LayerRangePinOfAHostBlockPointsIntoIt) {
  ASSERT_TRUE(Put(1).ok());
  const BlockKey key = Key(1);
  auto whole = engine_->Pin(7, kNs, {&key, 1});
  auto part = engine_->Pin(7, kNs, {&key, 1}, LayerSpan{3, 4});
  ASSERT_TRUE(whole[0].status.ok());
  ASSERT_TRUE(part[0].status.ok());
  EXPECT_EQ(part[0].offset, whole[0].offset + 3 * (kBlockBytes / kLayers));
  EXPECT_EQ(part[0].length, kBlockBytes / kLayers);
  EXPECT_EQ(Counters()["engine.layer_reads"], 0) << "no I/O for a host block";
  engine_->CloseConnection(7);
}

TEST_F(EngineNvmeTest, ConcurrentPinsOfOneNvmeBlockShareOneRead) {
  for (uint64_t i = 0; i < 20; ++i) ASSERT_TRUE(Put(i).ok());
  engine_->WaitForIdle();
  const BlockKey key = Key(5);
  std::vector<std::future<std::vector<PinGrant>>> pins;
  for (ConnectionId s = 10; s < 16; ++s) {
    pins.push_back(std::async(std::launch::async, [&, s] { return engine_->Pin(s, kNs, {&key, 1}); }));
  }
  uint64_t offset = 0;
  for (auto& p : pins) {
    auto g = p.get();
    ASSERT_TRUE(g[0].status.ok()) << g[0].status.ToString();
    if (offset == 0) offset = g[0].offset;
    EXPECT_EQ(g[0].offset, offset) << "every pin sees the one promoted copy";
  }
  EXPECT_EQ(Counters()["engine.promotions"], 1);
  EXPECT_EQ(Counters()["engine.pins"], 6);
  for (ConnectionId s = 10; s < 16; ++s) engine_->CloseConnection(s);
  EXPECT_EQ(Counters()["engine.leases"], 0);
}

TEST_F(EngineNvmeTest, EraseReachesBothTiers) {
  for (uint64_t i = 0; i < 20; ++i) ASSERT_TRUE(Put(i).ok());
  engine_->WaitForIdle();
  std::vector<BlockKey> both = {Key(1), Key(19)};  // one on NVMe, one in DRAM
  EXPECT_EQ(engine_->Erase(kNs, both), 2u);
  EXPECT_EQ(engine_->Lookup(kNs, {&both[0], 1}).prefix_blocks, 0u);
  EXPECT_FALSE(nvme_->Find(Key(1)));
  EXPECT_EQ(engine_->Pin(1, kNs, {&both[0], 1})[0].status.code(), StatusCode::kNotFound);
}

TEST_F(EngineNvmeTest, CorruptRecordIsAMissNeverWrongBytes) {
  for (uint64_t i = 0; i < 20; ++i) ASSERT_TRUE(Put(i).ok());
  engine_->WaitForIdle();
  std::vector<std::byte> expect(kBlockBytes);
  FillBlockBytes(Key(2), 0, expect);
  auto raw = memory_->raw();
  auto at = std::search(raw.begin(), raw.end(), expect.begin(), expect.begin() + 64);
  ASSERT_NE(at, raw.end());
  at[kBlockBytes / 2] ^= std::byte{0x10};
  const BlockKey key = Key(2);
  auto g = engine_->Pin(1, kNs, {&key, 1});
  EXPECT_EQ(g[0].status.code(), StatusCode::kNotFound) << g[0].status.ToString();
  EXPECT_EQ(Counters()["nvme.corrupt_reads"], 1);
  EXPECT_EQ(Counters()["engine.promotion_failures"], 1);
  EXPECT_EQ(engine_->Lookup(kNs, {&key, 1}).prefix_blocks, 0u) << "dropped from every tier";
  auto c = Counters();
  EXPECT_EQ(c["engine.reserved_blocks"], 0) << "the failed promotion left no claim behind";
}

}  // namespace
}  // namespace kvtier

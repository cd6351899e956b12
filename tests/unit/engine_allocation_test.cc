// One allocation never flushes the host tier (issue 12, item 4.7): the
// victims of one allocation are bounded, and layer-range reads of blocks
// below the host tier take their transient space from a bounded pool.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <vector>

#include "daemon/engine/engine.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/memory_device.h"
#include "tests/testing/memory_nvme.h"
#include "tests/testing/test_daemon.h"
#include "tiers/nvme/nvme_tier.h"

namespace kvtier {
namespace {

using ::kvtier::testing::FakeClock;

constexpr uint64_t kBlockBytes = 64 << 10;
constexpr NamespaceFingerprint kNs{0xa110c, 0x8};

BlockKey Key(uint64_t i) { return BlockKey{0xa1, i}; }

class EngineAllocationTest : public ::testing::Test {
 protected:
  void TearDown() override {
    engine_.reset();
    nvme_.reset();
    if (!dir_.empty()) ::kvtier::testing::RemoveTree(dir_);
  }
  void Open(uint64_t host_blocks, bool nvme, double layer_read_share = 0.125) {
    host_ = ::kvtier::testing::OpenTestHostTier(host_blocks * kBlockBytes);
    ASSERT_NE(host_, nullptr);
    if (nvme) {
      dir_ = ::kvtier::testing::MakeTempDir();
      memory_ = std::make_unique<::kvtier::testing::MemoryDevice>(16 << 20);
      auto tier = ::kvtier::testing::OpenMemoryNvmeTier(*memory_, dir_, clock_);
      ASSERT_TRUE(tier.ok()) << tier.status().ToString();
      nvme_ = std::move(*tier);
    }
    EngineOptions options{1, EvictionPolicyId::kLru};
    options.layer_read_share = layer_read_share;
    auto engine = Engine::Create(options, *host_, clock_, nvme_.get());
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    engine_ = std::move(*engine);
    engine_->RegisterNamespace(kNs, NamespaceLayout{4, kBlockBytes});
  }
  // Puts block i and returns its arena offset.
  uint64_t Put(uint64_t i) {
    clock_.AdvanceUs(1);
    const BlockKey key = Key(i);
    const uint64_t size = kBlockBytes;
    auto grants = engine_->Reserve(1, kNs, {&key, 1}, {&size, 1});
    EXPECT_TRUE(grants[0].status.ok()) << grants[0].status.ToString();
    EXPECT_TRUE(engine_->Commit(1, kNs, {&key, 1}, {&size, 1})[0].ok());
    return grants[0].offset;
  }
  void Use(uint64_t i) {
    clock_.AdvanceUs(1);
    ASSERT_TRUE(::kvtier::testing::PinAndRelease(*engine_, 2, kNs, Key(i)).ok()) << i;
  }
  bool Cached(uint64_t i) { return ::kvtier::testing::LookupTier(*engine_, kNs, Key(i)) != Tier::kNone; }
  std::map<std::string, int64_t> Counters() { return ::kvtier::testing::EngineCounters(*engine_); }

  std::string dir_;
  FakeClock clock_;
  std::unique_ptr<::kvtier::testing::MemoryDevice> memory_;
  std::unique_ptr<HostTier> host_;
  std::unique_ptr<NvmeTier> nvme_;
  std::unique_ptr<Engine> engine_;
};

// A fragmented arena: the least recently used blocks sit every other slot,
// so evicting them in order frees no range of two slots until the 9th
// victim. The allocation gives up after its bound instead of evicting on.
TEST_F(EngineAllocationTest, AnAllocationEvictsABoundedNumberOfBlocks) {
  Open(16, /*nvme=*/false);
  for (uint64_t i = 0; i < 16; ++i) ASSERT_EQ(Put(i), i * kBlockBytes) << "precondition: blocks in address order";
  for (uint64_t i = 0; i < 16; i += 2) Use(i);  // odd blocks are now the oldest
  const BlockKey big = Key(100);
  const uint64_t big_size = 2 * kBlockBytes;
  auto grants = engine_->Reserve(1, kNs, {&big, 1}, {&big_size, 1});
  EXPECT_EQ(grants[0].status.code(), StatusCode::kNoSpace) << grants[0].status.ToString();
  EXPECT_NE(grants[0].status.message().find("fragmented"), std::string::npos) << grants[0].status.message();
  auto c = Counters();
  EXPECT_EQ(c["engine.evictions"], 8) << "4 x 128 KiB of victims (8 blocks), then no more";
  EXPECT_EQ(c["engine.eviction_bound_hits"], 1);
  for (uint64_t i = 0; i < 16; i += 2) EXPECT_TRUE(Cached(i)) << "the recently used half stays: " << i;
  // A block of a size that fits a freed slot is served as usual.
  Put(101);
  EXPECT_TRUE(Cached(101));
}

// Layer reads from NVMe hold transient arena space; at most
// engine.layer_read_share of the host tier at once.
TEST_F(EngineAllocationTest, LayerReadsHoldAtMostTheirPool) {
  Open(8, /*nvme=*/true, 0.125);             // pool: 64 KiB, two 2-layer reads of 32 KiB
  for (uint64_t i = 0; i < 16; ++i) Put(i);  // 0..7 demoted to NVMe
  engine_->WaitForIdle();
  const int64_t evictions_before = Counters()["engine.evictions"];
  std::vector<LeaseId> held;
  for (uint64_t i = 0; i < 2; ++i) {
    const BlockKey key = Key(i);
    auto grants = engine_->Pin(3, kNs, {&key, 1}, LayerSpan{0, 2});
    ASSERT_TRUE(grants[0].status.ok()) << i << ": " << grants[0].status.ToString();
    held.push_back(grants[0].lease);
  }
  const BlockKey third = Key(2);
  auto busy = engine_->Pin(3, kNs, {&third, 1}, LayerSpan{0, 2});
  EXPECT_EQ(busy[0].status.code(), StatusCode::kBusy) << busy[0].status.ToString();
  auto c = Counters();
  EXPECT_EQ(c["engine.layer_reads_busy"], 1);
  EXPECT_EQ(c["engine.layer_read_pool_bytes"], int64_t(kBlockBytes));
  EXPECT_LE(c["engine.evictions"] - evictions_before, 1) << "64 KiB of layer reads pushed out at most one block";
  // A release gives the pool back.
  engine_->Release(3, {&held[0], 1});
  auto again = engine_->Pin(3, kNs, {&third, 1}, LayerSpan{0, 2});
  EXPECT_TRUE(again[0].status.ok()) << again[0].status.ToString();
  // The connection's end frees the rest.
  engine_->CloseConnection(3);
  EXPECT_EQ(Counters()["engine.layer_read_pool_bytes"], 0);
}

}  // namespace
}  // namespace kvtier

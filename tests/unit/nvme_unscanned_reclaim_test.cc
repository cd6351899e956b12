// A region is never reclaimed before its turn was taken: every block the
// NVMe tier held is either still readable or was handed to the tier below.
//
// Found by the tier-stack test under load (blocks gone from every tier,
// no drop counted). The scan of the next victim takes the oldest sealed
// region without writes in flight, and so does a reclaim, but at
// different times: while the oldest region (0) still had a write in
// flight, the scan took region 1 and handed its blocks down; the write
// ended, and the next allocation that needed a region reclaimed region 0,
// whose turn was never taken: its blocks left unoffered. The sequence
// below makes that deterministic with a device that holds region 0's
// writes. Now a tier that takes turns (it has an eviction sink, a
// reinsertion budget or shares) reclaims only a region whose turn was
// taken; the allocation that finds the oldest one unscanned is Busy and
// starts its turn.
#include <gtest/gtest.h>

#include <chrono>
#include <deque>
#include <future>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "tests/testing/fake_clock.h"
#include "tests/testing/memory_device.h"
#include "tests/testing/test_daemon.h"
#include "tests/testing/wait_for.h"
#include "tiers/nvme/nvme_tier.h"

namespace kvtier {
namespace {

using ::kvtier::testing::FakeClock;
using ::kvtier::testing::FillBlockBytes;
using ::kvtier::testing::MemoryDevice;
using ::kvtier::testing::WaitFor;

constexpr uint64_t kRegion = 1 << 20;
constexpr uint64_t kDevice = 4 * kRegion;  // 4 regions
constexpr size_t kBytes = 124 << 10;       // 128 KiB records: 8 a region
constexpr NamespaceFingerprint kNs{0xaaaa, 0xcccc};

BlockKey Key(uint64_t i) { return BlockKey{0x7e57, i}; }

// A memory device whose writes below `held_below` wait while held.
class RegionHoldingDevice final : public BlockDevice {
 public:
  explicit RegionHoldingDevice(BlockDevice& inner) : inner_(inner) {}
  uint64_t capacity_bytes() const override { return inner_.capacity_bytes(); }
  uint32_t alignment_bytes() const override { return inner_.alignment_bytes(); }
  std::string_view kind() const override { return "region-holding"; }
  void Read(uint64_t offset, std::span<std::byte> dst, IoDone done) override {
    inner_.Read(offset, dst, std::move(done));
  }
  void Write(uint64_t offset, std::span<const std::byte> src, IoDone done) override {
    {
      std::lock_guard lock(mu_);
      if (offset < held_below_) {
        held_.push_back(Held{offset, src, std::move(done)});
        return;
      }
    }
    inner_.Write(offset, src, std::move(done));
  }
  void Flush(IoDone done) override { inner_.Flush(std::move(done)); }

  void HoldBelow(uint64_t offset) {
    std::lock_guard lock(mu_);
    held_below_ = offset;
  }
  size_t held() const {
    std::lock_guard lock(mu_);
    return held_.size();
  }
  void Release() {
    std::vector<Held> held;
    {
      std::lock_guard lock(mu_);
      held_below_ = 0;
      held.swap(held_);
    }
    for (Held& h : held) inner_.Write(h.offset, h.src, std::move(h.done));
  }

 private:
  struct Held {
    uint64_t offset;
    std::span<const std::byte> src;
    IoDone done;
  };
  BlockDevice& inner_;
  mutable std::mutex mu_;
  uint64_t held_below_ = 0;
  std::vector<Held> held_;
};

class NvmeUnscannedReclaimTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::kvtier::testing::MakeTempDir();
    memory_ = std::make_unique<MemoryDevice>(kDevice);
    auto device = std::make_unique<RegionHoldingDevice>(*memory_);
    device_ = device.get();
    auto index = NvmeIndex::Open(dir_ + "/index", false);
    ASSERT_TRUE(index.ok()) << index.status().ToString();
    NvmeTierOptions options;
    options.region_bytes = kRegion;
    options.staging_bytes = 4 << 20;
    options.reinsert_share = 0;  // every block of a region's turn is offered below
    auto tier = NvmeTier::Open(std::move(device), std::move(*index), options, clock_);
    ASSERT_TRUE(tier.ok()) << tier.status().ToString();
    tier_ = std::move(*tier);
    tier_->SetEvictionSink([this](const BlockTier::Evicted& block, std::span<const std::byte>) {
      std::lock_guard lock(mu_);
      offered_.insert(block.key);
    });
  }
  void TearDown() override {
    device_->Release();
    tier_.reset();
    ::kvtier::testing::RemoveTree(dir_);
  }

  Status Submit(uint64_t i, std::promise<Status>* done = nullptr) {
    payloads_.emplace_back(kBytes);
    FillBlockBytes(Key(i), 0, payloads_.back());
    return tier_->Write(kNs, Key(i), 4, payloads_.back(), [done](Status s) {
      if (done != nullptr) done->set_value(s);
    });
  }
  Status WriteBlock(uint64_t i) {
    std::promise<Status> done;
    auto future = done.get_future();
    if (Status s = Submit(i, &done); !s.ok()) return s;
    return future.get();
  }
  size_t Offered() {
    std::lock_guard lock(mu_);
    return offered_.size();
  }
  bool WasOffered(uint64_t i) {
    std::lock_guard lock(mu_);
    return offered_.count(Key(i)) != 0;
  }

  std::string dir_;
  FakeClock clock_;
  std::unique_ptr<MemoryDevice> memory_;
  RegionHoldingDevice* device_ = nullptr;
  std::unique_ptr<NvmeTier> tier_;
  std::deque<std::vector<std::byte>> payloads_;  // each write's bytes, kept until the tier goes
  std::mutex mu_;
  std::set<BlockKey> offered_;
};

TEST_F(NvmeUnscannedReclaimTest, TheOldestRegionIsHandedDownBeforeItIsReclaimedThoughItsTurnCameLate) {
  for (uint64_t i = 0; i < 7; ++i) ASSERT_TRUE(WriteBlock(i).ok()) << i;
  // Block 7, region 0's last record, stays in flight.
  device_->HoldBelow(kRegion);
  std::promise<Status> seventh;
  ASSERT_TRUE(Submit(7, &seventh).ok());
  ASSERT_TRUE(WaitFor([&] { return device_->held() == 1; }));
  // Regions 1 and 2, then 24 opens region 3, the last free one: the turn
  // goes to region 1, the oldest without a write in flight.
  for (uint64_t i = 8; i < 25; ++i) ASSERT_TRUE(WriteBlock(i).ok()) << i;
  // (Not WaitForIdle: block 7's write is I/O in flight.)
  ASSERT_TRUE(WaitFor([&] { return Offered() == 8; })) << "region 1's blocks, offered " << Offered();
  for (uint64_t i = 8; i < 16; ++i) EXPECT_TRUE(WasOffered(i)) << i;
  // Region 3 fills while region 0's write is still in flight.
  for (uint64_t i = 25; i < 32; ++i) ASSERT_TRUE(WriteBlock(i).ok()) << i;
  device_->Release();
  ASSERT_TRUE(seventh.get_future().get().ok());

  // The next record needs a region: region 0, the oldest, whose turn was
  // never taken. It must be handed down before it goes.
  Status s = WriteBlock(32);
  if (!s.ok()) {
    EXPECT_EQ(s.code(), StatusCode::kBusy) << s.ToString();
    tier_->WaitForIdle();
    s = WriteBlock(32);
  }
  ASSERT_TRUE(s.ok()) << s.ToString();
  tier_->WaitForIdle();
  for (uint64_t i = 0; i <= 32; ++i) {
    EXPECT_TRUE(tier_->Find(Key(i)).has_value() || WasOffered(i)) << "block " << i << " left unoffered";
  }
  for (uint64_t i = 0; i < 8; ++i) EXPECT_TRUE(WasOffered(i)) << i;
}

}  // namespace
}  // namespace kvtier

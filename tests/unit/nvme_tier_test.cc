// NvmeTier over the memory device (optionally behind the fault injector) and
// a real RocksDB index: byte-exact round trips, layer ranges, reclaim,
// restart, torn and corrupted records, injected faults, a full device.
// Every value describes itself (FillBlockBytes), so every read is checked:
// a miss or an error is allowed, a wrong byte never.
#include "tiers/nvme/nvme_tier.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <map>
#include <random>
#include <thread>

#include "tests/testing/fake_clock.h"
#include "tests/testing/fault_injecting_device.h"
#include "tests/testing/memory_device.h"
#include "tests/testing/test_daemon.h"

namespace kvtier {
namespace {

using ::kvtier::testing::CheckBlockBytes;
using ::kvtier::testing::FakeClock;
using ::kvtier::testing::FaultInjectingDevice;
using ::kvtier::testing::FaultOptions;
using ::kvtier::testing::FillBlockBytes;
using ::kvtier::testing::MemoryDevice;

constexpr uint64_t kRegion = 1 << 20;
constexpr uint64_t kDevice = 8 * kRegion;
constexpr NamespaceFingerprint kNs{0xaaaa, 0xbbbb};

BlockKey Key(uint64_t i) { return BlockKey{0x5eed, i}; }

class NvmeTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::kvtier::testing::MakeTempDir();
    memory_ = std::make_unique<MemoryDevice>(kDevice);
  }
  void TearDown() override {
    tier_.reset();
    ::kvtier::testing::RemoveTree(dir_);
  }

  // (Re)opens the tier on the same medium and index, with `faults`.
  void Open(const FaultOptions& faults = {}, uint64_t region_bytes = kRegion, double reinsert_share = 0.1,
            ReclaimOrder reclaim = ReclaimOrder::kLru) {
    tier_.reset();
    auto device = std::make_unique<FaultInjectingDevice>(*memory_, faults);
    faulty_ = device.get();
    auto index = NvmeIndex::Open(dir_ + "/index", false);
    ASSERT_TRUE(index.ok()) << index.status().ToString();
    NvmeTierOptions options;
    options.region_bytes = region_bytes;
    options.staging_bytes = 4 << 20;
    options.reinsert_share = reinsert_share;
    options.reclaim = reclaim;
    auto tier = NvmeTier::Open(std::move(device), std::move(*index), options, clock_);
    ASSERT_TRUE(tier.ok()) << tier.status().ToString();
    tier_ = std::move(*tier);
  }

  Status WriteBlock(uint64_t i, size_t bytes, uint32_t layers = 4) {
    std::vector<std::byte> payload(bytes);
    FillBlockBytes(Key(i), 0, payload);
    std::promise<Status> done;
    auto future = done.get_future();
    Status accepted = tier_->Write(kNs, Key(i), layers, payload, [&done](Status s) { done.set_value(s); });
    if (!accepted.ok()) return accepted;
    return future.get();
  }

  // Reads layers [first, last); returns the bytes or the error.
  Result<std::vector<std::byte>> ReadBlock(uint64_t i, uint32_t first, uint32_t last) {
    auto info = tier_->Find(Key(i));
    if (!info) return NotFound("no such block");
    std::vector<std::byte> dst(info->payload_bytes);
    std::promise<Result<size_t>> done;
    auto future = done.get_future();
    Status accepted =
        tier_->Read(Key(i), first, last, dst, [&done](Result<size_t> r) { done.set_value(std::move(r)); });
    if (!accepted.ok()) return accepted;
    auto r = future.get();
    if (!r.ok()) return r.status();
    dst.resize(*r);
    return dst;
  }

  int64_t Counter(const std::string& name) {
    CounterCollector c;
    tier_->VisitCounters(c);
    for (const auto& [n, v] : c.counters()) {
      if (n == name) return v;
    }
    ADD_FAILURE() << "no counter " << name;
    return -1;
  }

  std::string dir_;
  FakeClock clock_;
  std::unique_ptr<MemoryDevice> memory_;
  FaultInjectingDevice* faulty_ = nullptr;
  std::unique_ptr<NvmeTier> tier_;
};

TEST_F(NvmeTierTest, WholeBlocksAndLayerRangesRoundTrip) {
  Open();
  for (uint64_t i = 0; i < 10; ++i) ASSERT_TRUE(WriteBlock(i, 40000 + i * 4, 4).ok()) << i;
  for (uint64_t i = 0; i < 10; ++i) {
    const size_t bytes = 40000 + i * 4;
    auto whole = ReadBlock(i, 0, 4);
    ASSERT_TRUE(whole.ok()) << whole.status().ToString();
    EXPECT_TRUE(CheckBlockBytes(Key(i), 0, *whole));
    std::vector<std::byte> expect(bytes);
    FillBlockBytes(Key(i), 0, expect);
    auto middle = ReadBlock(i, 1, 3);  // an unaligned sub-range of the payload
    ASSERT_TRUE(middle.ok()) << middle.status().ToString();
    const size_t layer = bytes / 4;
    ASSERT_EQ(middle->size(), 2 * layer);
    EXPECT_TRUE(std::equal(middle->begin(), middle->end(), expect.begin() + layer));
  }
  EXPECT_EQ(Counter("nvme.blocks"), 10);
  EXPECT_EQ(Counter("nvme.corrupt_reads"), 0);
}

TEST_F(NvmeTierTest, RejectsDuplicatesBadGeometryAndOversizedBlocks) {
  Open();
  ASSERT_TRUE(WriteBlock(1, 8192).ok());
  EXPECT_EQ(WriteBlock(1, 8192).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(WriteBlock(2, 8191, 4).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteBlock(3, kRegion, 1).code(), StatusCode::kInvalidArgument) << "record = header + region";
  EXPECT_EQ(ReadBlock(1, 2, 9).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadBlock(99, 0, 1).status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(tier_->Erase(Key(1)).ok());
  EXPECT_FALSE(tier_->Find(Key(1)));
  EXPECT_EQ(tier_->Erase(Key(1)).code(), StatusCode::kNotFound);
}

TEST_F(NvmeTierTest, ReclaimDropsTheOldestRegionsAndNeverServesStaleBytes) {
  Open();
  // 100 KiB records, ~10 per region, 8 regions: 200 blocks overflow twice.
  for (uint64_t i = 0; i < 200; ++i) ASSERT_TRUE(WriteBlock(i, 100 << 10).ok()) << i;
  EXPECT_GT(Counter("nvme.region_reclaims"), 0);
  EXPECT_FALSE(tier_->Find(Key(0))) << "the oldest block should be gone";
  EXPECT_TRUE(tier_->Find(Key(199)));
  int present = 0;
  for (uint64_t i = 0; i < 200; ++i) {
    auto r = ReadBlock(i, 0, 4);
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kNotFound) << i;
      continue;
    }
    ++present;
    EXPECT_TRUE(CheckBlockBytes(Key(i), 0, *r)) << "block " << i;
  }
  EXPECT_GT(present, 50);
  EXPECT_LT(present, 90);
  EXPECT_EQ(Counter("nvme.blocks"), present);
}

// 8 regions of 8 records (124 KiB payloads + 4 KiB header): region 0
// holds blocks 0..7. Block 56 opens the last free region, which makes
// region 0 the next victim; block 64 reclaims it.
TEST_F(NvmeTierTest, ReinsertionKeepsBlocksReadSinceTheyWereWrittenThroughReclaim) {
  Open({}, kRegion, /*reinsert_share=*/0.5);
  constexpr size_t kBytes = 124 << 10;
  auto write = [this](uint64_t i) { return WriteBlock(i, kBytes); };
  for (uint64_t i = 0; i < 8; ++i) ASSERT_TRUE(write(i).ok());
  ASSERT_TRUE(ReadBlock(0, 0, 4).ok());
  ASSERT_TRUE(ReadBlock(1, 0, 4).ok());
  ASSERT_TRUE(ReadBlock(1, 2, 3).ok());
  for (uint64_t i = 8; i < 57; ++i) ASSERT_TRUE(write(i).ok()) << i;
  // The reinsertion runs in the background: let it finish before the
  // writes that reclaim region 0 (a real workload simply races it).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (Counter("nvme.reinserted") < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(Counter("nvme.reinserted"), 2);
  for (uint64_t i = 57; i < 65; ++i) ASSERT_TRUE(write(i).ok()) << i;
  ASSERT_GT(Counter("nvme.region_reclaims"), 0);
  for (uint64_t i : {0, 1}) {
    auto r = ReadBlock(i, 0, 4);
    ASSERT_TRUE(r.ok()) << "read block " << i << " was not reinserted: " << r.status().ToString();
    EXPECT_TRUE(CheckBlockBytes(Key(i), 0, *r));
  }
  for (uint64_t i = 2; i < 8; ++i) EXPECT_FALSE(tier_->Find(Key(i))) << "unread block " << i << " kept";
  EXPECT_EQ(Counter("nvme.reinserted_bytes"), 2 * static_cast<int64_t>(kBytes));
  EXPECT_EQ(Counter("nvme.reinsert_failures"), 0);
  EXPECT_EQ(Counter("nvme.writes"), 65) << "reinsertions are not counted as writes";
  // The moved copies survive a restart like any other.
  Open({}, kRegion, 0.5);
  auto r = ReadBlock(1, 0, 4);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(CheckBlockBytes(Key(1), 0, *r));
}

// The reclaim order decides what reinsertion keeps: block 0 was read,
// block 5 never was but a queued request needs it.
TEST_F(NvmeTierTest, TheReclaimOrderChoosesWhatReinsertionKeeps) {
  struct Case {
    ReclaimOrder order;
    std::vector<uint64_t> kept;
  };
  for (const Case& c :
       {Case{ReclaimOrder::kFifo, {}}, Case{ReclaimOrder::kLru, {0}}, Case{ReclaimOrder::kQueueAware, {0, 5}}}) {
    SCOPED_TRACE(std::string(ReclaimOrderName(c.order)));
    tier_.reset();
    memory_ = std::make_unique<MemoryDevice>(kDevice);
    ::kvtier::testing::RemoveTree(dir_);
    dir_ = ::kvtier::testing::MakeTempDir();
    Open({}, kRegion, /*reinsert_share=*/0.5, c.order);
    std::atomic<int> asked{0};
    tier_->SetNeededHint([&asked](const BlockKey& key) {
      ++asked;
      return key == Key(5);
    });
    for (uint64_t i = 0; i < 8; ++i) ASSERT_TRUE(WriteBlock(i, 124 << 10).ok());
    ASSERT_TRUE(ReadBlock(0, 0, 4).ok());
    for (uint64_t i = 8; i < 57; ++i) ASSERT_TRUE(WriteBlock(i, 124 << 10).ok()) << i;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (Counter("nvme.reinserted") < static_cast<int64_t>(c.kept.size()) &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    for (uint64_t i = 57; i < 65; ++i) ASSERT_TRUE(WriteBlock(i, 124 << 10).ok()) << i;
    ASSERT_GT(Counter("nvme.region_reclaims"), 0);
    for (uint64_t i = 0; i < 8; ++i) {
      const bool kept = std::find(c.kept.begin(), c.kept.end(), i) != c.kept.end();
      EXPECT_EQ(tier_->Find(Key(i)).has_value(), kept) << "block " << i;
    }
    EXPECT_EQ(Counter("nvme.reinserted"), static_cast<int64_t>(c.kept.size()));
    EXPECT_EQ(Counter("nvme.reinsert_needed"), c.order == ReclaimOrder::kQueueAware ? 1 : 0);
    if (c.order != ReclaimOrder::kQueueAware) {
      EXPECT_EQ(asked.load(), 0) << "only queue_aware asks";
    }
    tier_->SetNeededHint(nullptr);
  }
}

// Every order over one history, region 0 (blocks 0..7) reclaimed: block 0
// read twice early, blocks 8..55 each read once just after their write,
// block 1 read once and block 2 twice late, block 5 needed by a queued
// request, 3..7 never read. The classic orders evict 8 blocks (region 0's
// count) from their policy, wherever they are, and keep region 0's others:
// - lru2: used once (written, never read) 3..7; then the oldest
//   second-to-last use: 1 (its write), 0 (its first read), 8 (its write).
//   Keeps 2.
// - s3fifo: the small queue in write order: 0 (2 reads) to main, 1 (1 read)
//   evicted, 2 to main, 3..7 evicted, 8 and 9 (1 read each) evicted. Keeps
//   0 and 2.
// - arc: T1 (never read) 3..7 goes (p = 0), then T2's least recently read:
//   0, 8, 9. Keeps 1 and 2.
TEST_F(NvmeTierTest, EachReclaimOrderKeepsWhatItsPolicyWould) {
  struct Case {
    ReclaimOrder order;
    std::vector<uint64_t> kept;
  };
  for (const Case& c : {Case{ReclaimOrder::kFifo, {}}, Case{ReclaimOrder::kLru, {0, 1, 2}},
                        Case{ReclaimOrder::kQueueAware, {0, 1, 2, 5}}, Case{ReclaimOrder::kLru2, {2}},
                        Case{ReclaimOrder::kS3Fifo, {0, 2}}, Case{ReclaimOrder::kArc, {1, 2}}}) {
    SCOPED_TRACE(std::string(ReclaimOrderName(c.order)));
    const bool classic =
        c.order == ReclaimOrder::kLru2 || c.order == ReclaimOrder::kS3Fifo || c.order == ReclaimOrder::kArc;
    tier_.reset();
    memory_ = std::make_unique<MemoryDevice>(kDevice);
    ::kvtier::testing::RemoveTree(dir_);
    dir_ = ::kvtier::testing::MakeTempDir();
    Open({}, kRegion, /*reinsert_share=*/0.5, c.order);
    tier_->SetNeededHint([](const BlockKey& key) { return key == Key(5); });
    auto write = [this](uint64_t i) {
      clock_.AdvanceUs(10);
      return WriteBlock(i, 124 << 10);
    };
    auto read = [this](uint64_t i) {
      clock_.AdvanceUs(10);
      return ReadBlock(i, 0, 4).ok();
    };
    for (uint64_t i = 0; i < 8; ++i) ASSERT_TRUE(write(i).ok());
    ASSERT_TRUE(read(0));
    ASSERT_TRUE(read(0));
    for (uint64_t i = 8; i < 56; ++i) {
      ASSERT_TRUE(write(i).ok()) << i;
      ASSERT_TRUE(read(i)) << i;
    }
    ASSERT_TRUE(read(1));
    ASSERT_TRUE(read(2));
    ASSERT_TRUE(read(2));
    EXPECT_EQ(Counter("nvme.policy_blocks"), classic ? 56 : 0);
    ASSERT_TRUE(write(56).ok());  // opens the last free region: region 0's turn
    // Region 0's turn runs on the tier's reclaim thread: wait until its
    // copies and its drops have both been counted.
    const int64_t tracked = classic ? 49 : 0;  // 56 tracked, 8 evicted, block 56 added
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while ((Counter("nvme.reinserted") < static_cast<int64_t>(c.kept.size()) ||
            Counter("nvme.policy_blocks") != tracked) &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_EQ(Counter("nvme.policy_blocks"), tracked);
    EXPECT_EQ(Counter("nvme.policy_spared"), classic ? static_cast<int64_t>(c.kept.size()) : 0);
    EXPECT_EQ(Counter("nvme.reinserted"), static_cast<int64_t>(c.kept.size()));
    EXPECT_EQ(Counter("nvme.reinsert_failures"), 0);
    // These writes reclaim region 0 (and start region 1's turn, which may
    // copy some of 8..15: not checked here).
    for (uint64_t i = 57; i < 65; ++i) ASSERT_TRUE(write(i).ok()) << i;
    ASSERT_GT(Counter("nvme.region_reclaims"), 0);
    for (uint64_t i = 0; i < 8; ++i) {
      const bool kept = std::find(c.kept.begin(), c.kept.end(), i) != c.kept.end();
      EXPECT_EQ(tier_->Find(Key(i)).has_value(), kept) << "block " << i;
      if (kept) {
        auto r = ReadBlock(i, 0, 4);
        ASSERT_TRUE(r.ok()) << r.status().ToString();
        EXPECT_TRUE(CheckBlockBytes(Key(i), 0, *r));
      }
    }
    tier_->SetNeededHint(nullptr);
  }
}

// The policy of a classic order learns the blocks a restart finds, forgets
// erased ones, and is empty for the other orders.
TEST_F(NvmeTierTest, TheReclaimPolicyTracksBlocksAcrossARestart) {
  Open({}, kRegion, 0.1, ReclaimOrder::kArc);
  for (uint64_t i = 0; i < 20; ++i) ASSERT_TRUE(WriteBlock(i, 50000).ok());
  EXPECT_EQ(Counter("nvme.policy_blocks"), 20);
  ASSERT_TRUE(tier_->Erase(Key(3)).ok());
  EXPECT_EQ(Counter("nvme.policy_blocks"), 19);
  ASSERT_TRUE(ReadBlock(4, 0, 4).ok());
  EXPECT_EQ(Counter("nvme.policy_blocks"), 19);
  Open({}, kRegion, 0.1, ReclaimOrder::kS3Fifo);
  EXPECT_EQ(tier_->recovery().entries_loaded, 19);
  EXPECT_EQ(Counter("nvme.policy_blocks"), 19);
  Open({}, kRegion, 0.1, ReclaimOrder::kLru);
  EXPECT_EQ(Counter("nvme.policy_blocks"), 0);
}

TEST_F(NvmeTierTest, ReinsertionIsOffAtZeroAndCappedByItsShareOfWrites) {
  for (double share : {0.0, 0.01}) {
    SCOPED_TRACE("share " + std::to_string(share));
    memory_ = std::make_unique<MemoryDevice>(kDevice);
    ::kvtier::testing::RemoveTree(dir_);
    dir_ = ::kvtier::testing::MakeTempDir();
    Open({}, kRegion, share);
    for (uint64_t i = 0; i < 8; ++i) ASSERT_TRUE(WriteBlock(i, 124 << 10).ok());
    ASSERT_TRUE(ReadBlock(0, 0, 4).ok());
    for (uint64_t i = 8; i < 65; ++i) ASSERT_TRUE(WriteBlock(i, 124 << 10).ok()) << i;
    // 0.01 of 57 writes of 128 KiB records is ~73 KiB: less than one record.
    EXPECT_EQ(Counter("nvme.reinserted"), 0);
    EXPECT_FALSE(tier_->Find(Key(0))) << "read, but nothing may be reinserted";
    EXPECT_EQ(Counter("nvme.reinsert_over_budget"), share > 0 ? 1 : 0);
  }
}

// Erasing a block whose reinsertion is in flight leaves nothing behind.
// A read is a use of its block even when a copy forward moves the block
// while the read runs, whichever ends first: 0 and 1, both read, are being
// copied out of region 0 (writes held); a read of 1 ends before the copy
// lands, one of 0 after. Each counts for the copy, so region 7's turn
// copies both forward again and they outlive its reclaim.
TEST_F(NvmeTierTest, AReadDuringItsBlocksCopyForwardCountsForTheCopy) {
  Open({}, kRegion, /*reinsert_share=*/0.5);
  constexpr size_t kBytes = 124 << 10;  // 128 KiB records: 8 a region, 8 regions
  for (uint64_t i = 0; i < 8; ++i) ASSERT_TRUE(WriteBlock(i, kBytes).ok());
  ASSERT_TRUE(ReadBlock(0, 0, 4).ok());
  ASSERT_TRUE(ReadBlock(1, 0, 4).ok());
  for (uint64_t i = 8; i < 56; ++i) ASSERT_TRUE(WriteBlock(i, kBytes).ok()) << i;
  // 56 opens the last free region: region 0's turn copies 0 and 1.
  faulty_->HoldWrites();
  std::vector<std::byte> payload(kBytes);
  FillBlockBytes(Key(56), 0, payload);
  std::promise<Status> written;
  ASSERT_TRUE(tier_->Write(kNs, Key(56), 4, payload, [&written](Status s) { written.set_value(s); }).ok());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (faulty_->held_writes() < 3 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(faulty_->held_writes(), 3u) << "56 and the two copies";
  ASSERT_TRUE(ReadBlock(1, 0, 4).ok());  // ends before its copy lands
  faulty_->HoldReads();
  std::vector<std::byte> dst(kBytes);
  std::promise<Result<size_t>> read;
  ASSERT_TRUE(tier_->Read(Key(0), 0, 4, dst, [&read](Result<size_t> r) { read.set_value(std::move(r)); }).ok());
  faulty_->ReleaseWrites();
  ASSERT_TRUE(written.get_future().get().ok());
  while (Counter("nvme.reinserted") < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(Counter("nvme.reinserted"), 2);
  faulty_->ReleaseReads();  // 0's read ends after its copy landed
  ASSERT_TRUE(read.get_future().get().ok());
  // Regions 1..6 go, then region 7 (56, 0, 1) has its turn and goes.
  for (uint64_t i = 57; i < 120; ++i) {
    ASSERT_TRUE(WriteBlock(i, kBytes).ok()) << i;
    tier_->WaitForIdle();
  }
  EXPECT_EQ(Counter("nvme.reinserted"), 4) << "0 and 1 copied forward a second time";
  EXPECT_TRUE(tier_->Find(Key(0)));
  EXPECT_TRUE(tier_->Find(Key(1)));
  EXPECT_FALSE(tier_->Find(Key(56))) << "never read";
}

TEST_F(NvmeTierTest, EraseDuringReinsertionLeavesNothing) {
  Open({}, kRegion, 0.5);
  for (uint64_t i = 0; i < 8; ++i) ASSERT_TRUE(WriteBlock(i, 124 << 10).ok());
  ASSERT_TRUE(ReadBlock(3, 0, 4).ok());
  for (uint64_t i = 8; i < 57; ++i) ASSERT_TRUE(WriteBlock(i, 124 << 10).ok()) << i;
  EXPECT_TRUE(tier_->Erase(Key(3)).ok());  // before, during or after its reinsertion
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (Counter("nvme.reinserted") + Counter("nvme.reinsert_failures") + Counter("nvme.write_failures") == 0 &&
         tier_->Find(Key(3)) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let an in-flight copy land
  EXPECT_FALSE(tier_->Find(Key(3))) << "an erased block came back through its reinsertion";
  for (uint64_t i = 57; i < 65; ++i) ASSERT_TRUE(WriteBlock(i, 124 << 10).ok()) << i;
  EXPECT_FALSE(tier_->Find(Key(3)));
}

TEST_F(NvmeTierTest, BlocksSurviveARestart) {
  Open();
  for (uint64_t i = 0; i < 30; ++i) ASSERT_TRUE(WriteBlock(i, 50000).ok());
  ASSERT_TRUE(tier_->Erase(Key(7)).ok());
  Open();  // same medium, same index
  EXPECT_EQ(tier_->recovery().entries_loaded, 29);
  EXPECT_EQ(tier_->recovery().dropped_corrupt, 0);
  EXPECT_EQ(tier_->recovery().regions_resealed, 1);
  EXPECT_FALSE(tier_->Find(Key(7)));
  for (uint64_t i = 0; i < 30; ++i) {
    if (i == 7) continue;
    auto r = ReadBlock(i, 0, 4);
    ASSERT_TRUE(r.ok()) << i << ": " << r.status().ToString();
    EXPECT_TRUE(CheckBlockBytes(Key(i), 0, *r));
  }
  // New writes go to a fresh region, never after the old open one's tail.
  ASSERT_TRUE(WriteBlock(100, 50000).ok());
  auto r = ReadBlock(100, 0, 4);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(CheckBlockBytes(Key(100), 0, *r));
}

TEST_F(NvmeTierTest, TornRecordInTheOpenRegionIsDroppedAtStartUp) {
  Open();
  for (uint64_t i = 0; i < 5; ++i) ASSERT_TRUE(WriteBlock(i, 50000).ok());
  tier_.reset();
  // Damage block 3's payload on the medium: like a write torn by a crash.
  auto bytes = memory_->raw();
  std::vector<std::byte> expect(50000);
  FillBlockBytes(Key(3), 0, expect);
  auto at = std::search(bytes.begin(), bytes.end(), expect.begin(), expect.begin() + 64);
  ASSERT_NE(at, bytes.end());
  at[30000] ^= std::byte{0xff};
  Open();
  EXPECT_EQ(tier_->recovery().dropped_corrupt, 1);
  EXPECT_EQ(tier_->recovery().entries_loaded, 4);
  EXPECT_FALSE(tier_->Find(Key(3)));
  for (uint64_t i : {0, 1, 2, 4}) EXPECT_TRUE(CheckBlockBytes(Key(i), 0, *ReadBlock(i, 0, 4)));
}

// A block read layer by layer (a layer-wise load) reads its record header
// once: the later layers verify against the cached per-layer checksums,
// one I/O each, and still catch a corrupt layer.
TEST_F(NvmeTierTest, LayerByLayerReadsReadTheHeaderOnceAndStillVerify) {
  Open();
  constexpr size_t kBytes = 4 * 12000;
  for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(WriteBlock(i, kBytes, 4).ok());
  std::vector<std::byte> expect(kBytes);
  FillBlockBytes(Key(1), 0, expect);
  for (uint32_t l = 0; l < 4; ++l) {
    auto layer = ReadBlock(1, l, l + 1);
    ASSERT_TRUE(layer.ok()) << l << ": " << layer.status().ToString();
    EXPECT_TRUE(std::equal(layer->begin(), layer->end(), expect.begin() + l * (kBytes / 4))) << l;
  }
  EXPECT_EQ(Counter("nvme.header_cache_hits"), 3) << "layers 1-3 needed no header read";
  auto whole = ReadBlock(1, 0, 4);
  ASSERT_TRUE(whole.ok());
  EXPECT_TRUE(CheckBlockBytes(Key(1), 0, *whole));
  // A layer that rots after its header was cached is still caught.
  FillBlockBytes(Key(2), 0, expect);
  ASSERT_TRUE(ReadBlock(2, 0, 1).ok());
  auto bytes = memory_->raw();  // the tier is idle: safe to poke
  auto at = std::search(bytes.begin(), bytes.end(), expect.begin(), expect.begin() + 64);
  ASSERT_NE(at, bytes.end());
  at[2 * (kBytes / 4) + 5] ^= std::byte{0x01};  // inside layer 2
  EXPECT_TRUE(ReadBlock(2, 1, 2).ok());
  auto rotten = ReadBlock(2, 2, 3);
  ASSERT_FALSE(rotten.ok());
  EXPECT_EQ(rotten.status().code(), StatusCode::kCorruption);
  EXPECT_FALSE(tier_->Find(Key(2))) << "dropped";
  // A key written again elsewhere does not use the old record's header.
  ASSERT_TRUE(WriteBlock(2, kBytes, 2).ok());
  auto rewritten = ReadBlock(2, 1, 2);
  ASSERT_TRUE(rewritten.ok()) << rewritten.status().ToString();
  EXPECT_EQ(rewritten->size(), kBytes / 2) << "the new record's two layers, not the old header's four";
}

TEST_F(NvmeTierTest, CorruptionFoundByAReadIsAMissAndDropsTheEntry) {
  Open();
  for (uint64_t i = 0; i < 5; ++i) ASSERT_TRUE(WriteBlock(i, 50000).ok());
  std::vector<std::byte> expect(50000);
  FillBlockBytes(Key(2), 0, expect);
  auto bytes = memory_->raw();  // the tier is idle: safe to poke
  auto at = std::search(bytes.begin(), bytes.end(), expect.begin(), expect.begin() + 64);
  ASSERT_NE(at, bytes.end());
  at[20000] ^= std::byte{0x01};  // inside layer 1
  auto layer0 = ReadBlock(2, 0, 1);
  ASSERT_TRUE(layer0.ok()) << "layer 0 is intact and verifies alone";
  auto r = ReadBlock(2, 0, 4);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCorruption);
  EXPECT_EQ(Counter("nvme.corrupt_reads"), 1);
  EXPECT_FALSE(tier_->Find(Key(2))) << "a corrupt entry is dropped";
  Open();
  EXPECT_FALSE(tier_->Find(Key(2))) << "and stays dropped after a restart";
}

// A whole-block read into aligned memory skips the staging copy; it is
// verified all the same.
TEST_F(NvmeTierTest, DirectReadsIntoAlignedMemoryAreVerifiedToo) {
  Open({}, kDevice / 2);                      // regions that hold a > 1 MiB record
  constexpr size_t kBig = (1 << 20) + 1000;   // at least the direct-read threshold
  constexpr size_t kRoom = (1 << 20) + 4096;  // kBig rounded up to 4 KiB
  ASSERT_TRUE(WriteBlock(1, kBig, 1).ok());
  ASSERT_TRUE(WriteBlock(2, kBig, 1).ok());
  auto* aligned = static_cast<std::byte*>(std::aligned_alloc(4096, kRoom));
  auto read = [&](uint64_t i) {
    std::promise<Result<size_t>> done;
    auto future = done.get_future();
    Status accepted = tier_->Read(Key(i), 0, 1, std::span<std::byte>(aligned, kRoom),
                                  [&done](Result<size_t> r) { done.set_value(std::move(r)); });
    return accepted.ok() ? future.get() : Result<size_t>(accepted);
  };
  auto r = read(1);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, kBig);
  EXPECT_TRUE(CheckBlockBytes(Key(1), 0, std::span<const std::byte>(aligned, kBig)));
  std::vector<std::byte> expect(kBig);
  FillBlockBytes(Key(2), 0, expect);
  auto raw = memory_->raw();
  auto at = std::search(raw.begin(), raw.end(), expect.begin(), expect.begin() + 64);
  ASSERT_NE(at, raw.end());
  at[kBig - 1] ^= std::byte{0x80};  // the last payload byte
  EXPECT_EQ(read(2).status().code(), StatusCode::kCorruption);
  std::free(aligned);
}

// 1-in-100 faults of every kind over thousands of operations: every write
// and read ends as success, an error or a miss; every byte served is right.
TEST_F(NvmeTierTest, InjectedFaultsNeverServeAWrongByte) {
  FaultOptions faults;
  faults.seed = 20261130;
  faults.eio_rate = 0.01;
  faults.short_read_rate = 0.01;
  faults.short_write_rate = 0.01;
  faults.torn_write_rate = 0.01;
  faults.corrupt_read_rate = 0.01;
  Open(faults);
  std::mt19937_64 rng(faults.seed);
  int served = 0, failed = 0;
  for (int op = 0; op < 6000; ++op) {
    const uint64_t i = rng() % 400;
    if (rng() % 2 == 0) {
      Status s = WriteBlock(i, 12288 + (i % 7) * 4096, 3);
      if (!s.ok()) {
        EXPECT_NE(s.code(), StatusCode::kInternal) << s.ToString();
      }
      continue;
    }
    const uint32_t first = static_cast<uint32_t>(rng() % 3);
    auto r = ReadBlock(i, first, 3);
    if (!r.ok()) {
      ++failed;
      continue;
    }
    std::vector<std::byte> expect(12288 + (i % 7) * 4096);
    FillBlockBytes(Key(i), 0, expect);
    const size_t layer = expect.size() / 3;
    ASSERT_EQ(r->size(), (3 - first) * layer);
    ASSERT_TRUE(std::equal(r->begin(), r->end(), expect.begin() + first * layer))
        << "wrong bytes served for block " << i << " at op " << op;
    ++served;
  }
  EXPECT_GT(faulty_->injected(), 30);
  EXPECT_GT(served, 1000);  // most reads hit: the checks above ran on real data
  EXPECT_GT(Counter("nvme.corrupt_reads"), 0) << "torn writes and flipped bytes must have been caught";
  RecordProperty("served", served);
  RecordProperty("failed", failed);
}

TEST_F(NvmeTierTest, NoSpaceMarksTheTierFullUntilAProbeSucceeds) {
  FaultOptions faults;
  faults.no_space_rate = 1;
  Open(faults);
  EXPECT_EQ(WriteBlock(1, 8192).code(), StatusCode::kNoSpace);
  EXPECT_TRUE(tier_->full());
  faulty_->SetOptions(FaultOptions{});  // space came back
  EXPECT_EQ(WriteBlock(2, 8192).code(), StatusCode::kNoSpace) << "fails fast until the retry time";
  EXPECT_FALSE(tier_->Find(Key(1)));
  clock_.AdvanceUs(2'000'000);
  EXPECT_TRUE(WriteBlock(3, 8192).ok());
  EXPECT_FALSE(tier_->full());
  EXPECT_TRUE(CheckBlockBytes(Key(3), 0, *ReadBlock(3, 0, 4)));
  EXPECT_EQ(Counter("nvme.enospc"), 1);
}

// The tier's health (nvme_health.cc): full is a problem while it lasts,
// and I/O errors its device counted are a warning.
TEST_F(NvmeTierTest, ItsHealthSaysWhileItIsFullAndOnceItsDeviceFailed) {
  FaultOptions faults;
  faults.no_space_rate = 1;
  Open(faults);
  HealthFindings fresh;
  tier_->CheckHealth(fresh);
  EXPECT_TRUE(fresh.problems.empty());
  EXPECT_TRUE(fresh.warnings.empty());

  ASSERT_EQ(WriteBlock(1, 8192).code(), StatusCode::kNoSpace);
  std::vector<std::byte> misaligned(100);
  ASSERT_FALSE(ReadSync(*memory_, 1, misaligned).ok()) << "the device refuses it, and counts an error";
  HealthFindings failing;
  tier_->CheckHealth(failing);
  EXPECT_EQ(failing.problems,
            std::vector<std::string>{"the nvme tier is full: its file system has no room (nvme.enospc 1); the host "
                                     "tier keeps serving, nothing more is written to NVMe until space is freed"});
  EXPECT_EQ(failing.warnings, std::vector<std::string>{"the nvme device reported 1 I/O errors"});

  faulty_->SetOptions(FaultOptions{});  // space came back
  clock_.AdvanceUs(2'000'000);
  ASSERT_TRUE(WriteBlock(2, 8192).ok());
  HealthFindings recovered;
  tier_->CheckHealth(recovered);
  EXPECT_TRUE(recovered.problems.empty()) << "no longer full";
  EXPECT_EQ(recovered.warnings.size(), 1u) << "the device's errors stay counted";
}

}  // namespace
}  // namespace kvtier

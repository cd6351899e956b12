// A block copied forward by reinsertion, whose source region is reclaimed
// while the copy's index entry waits in the index writer's queue, must
// survive a restart: the tier keeps serving it, so its index must keep it.
//
// Found by `kvtier stress --crash-loop` (tools/stress/stress_crash.h): after a
// kill -9 that followed a quiet checkpoint, the NVMe tier loaded one entry
// fewer than it held, and a block it had shown in the NVMe tier was gone.
// The sequence below makes that interleaving deterministic:
//   1. block 0 (read once) is copied forward out of region 0 into region 7;
//   2. the copy's write completes, and its index Put is queued (OnWritten)
//      but not yet applied (the index writer is held here);
//   3. region 7 fills and region 0 is reclaimed: its blocks, block 0 with
//      its old entry still in memory, are dropped, and ResetRegion(0, their
//      keys) is queued behind the copy's Put;
//   4. the index writer runs: the Put indexes block 0's copy and the
//      in-memory entry comes back (the copy "takes over" from a reclaimed
//      record), then ResetRegion deletes block 0's index entry: the one of
//      the copy, since the index is keyed by block.
// Memory and index disagreed from then on, and a restart lost block 0. The
// index's ResetRegion now deletes only entries still in the reclaimed
// region's old generation (nvme_index.h), so the copy's entry stays.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>

#include "tests/testing/fake_clock.h"
#include "tests/testing/fault_injecting_device.h"
#include "tests/testing/memory_device.h"
#include "tests/testing/test_daemon.h"
#include "tests/testing/wait_for.h"
#include "tiers/nvme/nvme_tier.h"

namespace kvtier {
namespace {

using ::kvtier::testing::CheckBlockBytes;
using ::kvtier::testing::FakeClock;
using ::kvtier::testing::FaultInjectingDevice;
using ::kvtier::testing::FillBlockBytes;
using ::kvtier::testing::MemoryDevice;
using ::kvtier::testing::WaitFor;

constexpr uint64_t kRegion = 1 << 20;
constexpr uint64_t kDevice = 8 * kRegion;  // 8 regions
constexpr size_t kBytes = 124 << 10;       // 128 KiB records: 8 a region
constexpr NamespaceFingerprint kNs{0xaaaa, 0xbbbb};

BlockKey Key(uint64_t i) { return BlockKey{0x5eed, i}; }

// Holds the index writer before each mutation while closed.
class Gate {
 public:
  void Close() {
    std::lock_guard lock(mu_);
    open_ = false;
  }
  void Open() {
    {
      std::lock_guard lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  void Pass() {
    std::unique_lock lock(mu_);
    ++waiting_;
    cv_.wait(lock, [this] { return open_; });
    --waiting_;
  }
  int waiting() const {
    std::lock_guard lock(mu_);
    return waiting_;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = true;
  int waiting_ = 0;
};

class NvmeReinsertReclaimRaceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::kvtier::testing::MakeTempDir();
    memory_ = std::make_unique<MemoryDevice>(kDevice);
  }
  void TearDown() override {
    gate_.Open();
    tier_.reset();
    ::kvtier::testing::RemoveTree(dir_);
  }

  void Open() {
    tier_.reset();
    auto device = std::make_unique<FaultInjectingDevice>(*memory_, ::kvtier::testing::FaultOptions{});
    faulty_ = device.get();
    auto index = NvmeIndex::Open(dir_ + "/index", false);
    ASSERT_TRUE(index.ok()) << index.status().ToString();
    (*index)->SetMutationHook([this] { gate_.Pass(); });
    NvmeTierOptions options;
    options.region_bytes = kRegion;
    options.staging_bytes = 4 << 20;
    options.reinsert_share = 0.5;
    options.reclaim = ReclaimOrder::kLru;
    auto tier = NvmeTier::Open(std::move(device), std::move(*index), options, clock_);
    ASSERT_TRUE(tier.ok()) << tier.status().ToString();
    tier_ = std::move(*tier);
  }

  // Submits a write of block i; `done` (if given) gets its outcome.
  Status Submit(uint64_t i, std::promise<Status>* done = nullptr) {
    std::vector<std::byte> payload(kBytes);
    FillBlockBytes(Key(i), 0, payload);
    return tier_->Write(kNs, Key(i), 4, payload, [done](Status s) {
      if (done != nullptr) done->set_value(s);
    });
  }
  Status WriteBlock(uint64_t i) {
    std::promise<Status> done;
    auto future = done.get_future();
    if (Status s = Submit(i, &done); !s.ok()) return s;
    return future.get();
  }
  Status ReadBlock(uint64_t i) {
    std::vector<std::byte> dst(kBytes);
    std::promise<Result<size_t>> done;
    auto future = done.get_future();
    Status accepted = tier_->Read(Key(i), 0, 4, dst, [&done](Result<size_t> r) { done.set_value(std::move(r)); });
    if (!accepted.ok()) return accepted;
    auto r = future.get();
    if (!r.ok()) return r.status();
    return CheckBlockBytes(Key(i), 0, dst) ? Status::Ok() : Corruption("wrong bytes");
  }
  int64_t Counter(const std::string& name) {
    CounterCollector c;
    tier_->VisitCounters(c);
    for (const auto& [n, v] : c.counters()) {
      if (n == name) return v;
    }
    return -1;
  }

  std::string dir_;
  FakeClock clock_;
  Gate gate_;
  std::unique_ptr<MemoryDevice> memory_;
  FaultInjectingDevice* faulty_ = nullptr;
  std::unique_ptr<NvmeTier> tier_;
};

TEST_F(NvmeReinsertReclaimRaceTest, ACopyWhoseSourceRegionIsReclaimedBeforeItIsIndexedSurvivesARestart) {
  Open();
  for (uint64_t i = 0; i < 8; ++i) ASSERT_TRUE(WriteBlock(i).ok()) << i;   // region 0
  ASSERT_TRUE(ReadBlock(0).ok());                                          // a hit: reinsertion will copy it forward
  for (uint64_t i = 8; i < 56; ++i) ASSERT_TRUE(WriteBlock(i).ok()) << i;  // regions 1..6
  // 56 opens region 7, the last free one: region 0's turn copies block 0.
  faulty_->HoldWrites();
  ASSERT_TRUE(Submit(56).ok());
  ASSERT_TRUE(WaitFor([&] { return faulty_->held_writes() == 2; })) << "56 and block 0's copy";
  // Both writes complete; their index entries wait in the writer's queue.
  gate_.Close();
  faulty_->ReleaseWrites();
  // One entry is held at the gate, the other queued behind it: both writes
  // completed (OnWritten frees their staging first, then queues the entry).
  ASSERT_TRUE(WaitFor([&] { return gate_.waiting() == 1 && Counter("nvme.staging_used_bytes") == 0; }));
  // Fill region 7 (56, the copy, 57..62), then 63 reclaims region 0.
  for (uint64_t i = 57; i < 64; ++i) ASSERT_TRUE(Submit(i).ok()) << i;
  ASSERT_TRUE(WaitFor([&] { return Counter("nvme.region_reclaims") == 1; }));
  gate_.Open();
  tier_->WaitForIdle();
  ASSERT_EQ(Counter("nvme.reinserted"), 1);
  ASSERT_TRUE(tier_->Find(Key(0))) << "the copy took over from the reclaimed record";
  ASSERT_TRUE(ReadBlock(0).ok());
  const int64_t held = Counter("nvme.blocks");

  Open();  // a restart (a crash now would find the same index)
  EXPECT_EQ(tier_->recovery().entries_loaded, held) << "the index lost entries the tier held";
  EXPECT_TRUE(tier_->Find(Key(0))) << "block 0, served before the restart, is gone after it";
}

// The same race with a read instead of a reclaim: a read of the source
// record fails verification while the copy's index entry waits, so the
// tier drops the block's old entry (DropIfCurrent) and queues its index
// delete behind the copy's Put. The copy, made from a verified read, takes
// over in memory; the delete must not take its index entry with it.
TEST_F(NvmeReinsertReclaimRaceTest, ACopyWhoseSourceIsDroppedAsCorruptBeforeItIsIndexedSurvivesARestart) {
  Open();
  for (uint64_t i = 0; i < 8; ++i) ASSERT_TRUE(WriteBlock(i).ok()) << i;   // region 0
  ASSERT_TRUE(ReadBlock(0).ok());                                          // a hit: reinsertion will copy it forward
  for (uint64_t i = 8; i < 56; ++i) ASSERT_TRUE(WriteBlock(i).ok()) << i;  // regions 1..6
  faulty_->HoldWrites();
  ASSERT_TRUE(Submit(56).ok());
  ASSERT_TRUE(WaitFor([&] { return faulty_->held_writes() == 2; })) << "56 and block 0's copy";
  gate_.Close();
  faulty_->ReleaseWrites();
  ASSERT_TRUE(WaitFor([&] { return gate_.waiting() == 1 && Counter("nvme.staging_used_bytes") == 0; }));
  // Block 0's entry in memory is still the source's: this read fails
  // verification and drops it.
  ::kvtier::testing::FaultOptions corrupt;
  corrupt.corrupt_read_rate = 1;
  faulty_->SetOptions(corrupt);
  EXPECT_EQ(ReadBlock(0).code(), StatusCode::kCorruption);
  faulty_->SetOptions(::kvtier::testing::FaultOptions{});
  ASSERT_EQ(Counter("nvme.corrupt_reads"), 1);
  gate_.Open();
  tier_->WaitForIdle();
  ASSERT_EQ(Counter("nvme.reinserted"), 1);
  ASSERT_TRUE(tier_->Find(Key(0))) << "the copy took over from the dropped record";
  ASSERT_TRUE(ReadBlock(0).ok());
  const int64_t held = Counter("nvme.blocks");

  Open();  // a restart (a crash now would find the same index)
  EXPECT_EQ(tier_->recovery().entries_loaded, held) << "the index lost entries the tier held";
  EXPECT_TRUE(tier_->Find(Key(0))) << "block 0, served before the restart, is gone after it";
}

}  // namespace
}  // namespace kvtier

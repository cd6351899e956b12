// Engine queue hints with the queue_aware policy: a block a queued request
// needs survives host pressure that evicts everything else (and does not
// under LRU); a needed victim inside the look-ahead window is demoted even
// when admission would refuse it; dequeue, connection close, the queue's
// bound.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <chrono>
#include <future>
#include <thread>
#include <vector>

#include "daemon/engine/engine.h"
#include "daemon/engine/queued_keys.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/fault_injecting_device.h"
#include "tests/testing/memory_device.h"
#include "tests/testing/memory_nvme.h"
#include "tests/testing/test_daemon.h"
#include "tiers/nvme/nvme_tier.h"

namespace kvtier {
namespace {

using ::kvtier::testing::FakeClock;

constexpr uint64_t kBlockBytes = 64 << 10;
constexpr NamespaceFingerprint kNs{0x9e9e, 0x0001};
constexpr ConnectionId kScheduler = 9;

BlockKey Key(uint64_t i) { return BlockKey{0x9e, i}; }

class EngineQueueTest : public ::testing::Test {
 protected:
  void TearDown() override {
    engine_.reset();
    nvme_.reset();
    if (!dir_.empty()) ::kvtier::testing::RemoveTree(dir_);
  }

  // 8 host blocks; with `nvme`, a memory-backed NVMe tier under `admission`.
  void Open(EvictionPolicyId eviction, bool nvme = false, AdmissionPolicyId admission = AdmissionPolicyId::kAll,
            ReclaimOrder reclaim = ReclaimOrder::kLru, double prefetch_share = 0.5) {
    host_ = ::kvtier::testing::OpenTestHostTier(8 * kBlockBytes);
    ASSERT_NE(host_, nullptr);
    if (nvme) {
      dir_ = ::kvtier::testing::MakeTempDir();
      memory_ = std::make_unique<::kvtier::testing::MemoryDevice>(16 << 20);
      NvmeTierOptions options = ::kvtier::testing::SmallNvmeOptions();
      options.reinsert_share = 0.5;
      options.reclaim = reclaim;
      auto tier = ::kvtier::testing::OpenMemoryNvmeTier(*memory_, dir_, clock_, options, {}, &device_);
      ASSERT_TRUE(tier.ok()) << tier.status().ToString();
      nvme_ = std::move(*tier);
    }
    EngineOptions options{2, eviction};
    options.admission = admission;
    options.lookahead_us = 2'000'000;
    options.prefetch_share = prefetch_share;  // 0.5: 4 of the 8 host blocks per plan
    auto engine = Engine::Create(options, *host_, clock_, nvme_.get());
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    engine_ = std::move(*engine);
  }

  void Put(uint64_t i) {
    clock_.AdvanceUs(1);
    Status s = ::kvtier::testing::PutFilledBlock(*engine_, *host_, 1, kNs, Key(i), kBlockBytes);
    ASSERT_TRUE(s.ok()) << i << ": " << s.ToString();
  }

  Status Enqueue(uint64_t request, const std::vector<uint64_t>& blocks, uint64_t start_in_us) {
    std::vector<BlockKey> chain;
    for (uint64_t i : blocks) chain.push_back(Key(i));
    return engine_->Enqueue(kScheduler, kNs, request, chain, start_in_us, 0);
  }

  Tier Where(uint64_t i) { return ::kvtier::testing::LookupTier(*engine_, kNs, Key(i)); }
  bool InHost(uint64_t i) { return Where(i) == Tier::kHost; }

  std::map<std::string, int64_t> Counters() { return ::kvtier::testing::EngineCounters(*engine_); }

  std::string dir_;
  FakeClock clock_;
  std::unique_ptr<::kvtier::testing::MemoryDevice> memory_;
  std::unique_ptr<HostTier> host_;
  std::unique_ptr<NvmeTier> nvme_;
  ::kvtier::testing::FaultInjectingDevice* device_ = nullptr;  // owned by nvme_
  std::unique_ptr<Engine> engine_;
};

TEST_F(EngineQueueTest, ANeededBlockSurvivesPressureThatEvictsEverythingElse) {
  Open(EvictionPolicyId::kQueueAware);
  for (uint64_t i = 0; i < 8; ++i) Put(i);
  ASSERT_TRUE(Enqueue(1, {2, 5}, 1'000'000).ok());
  for (uint64_t i = 8; i < 24; ++i) Put(i);  // two arenas' worth of new blocks
  EXPECT_TRUE(InHost(2));
  EXPECT_TRUE(InHost(5));
  for (uint64_t i : {0, 1, 3, 4, 6, 7}) EXPECT_FALSE(InHost(i)) << i;
  EXPECT_EQ(Counters()["engine.evictions"], 16);
  // Once the request has started, they are ordinary blocks again.
  ASSERT_TRUE(engine_->Dequeue(kScheduler, 1).ok());
  for (uint64_t i = 24; i < 32; ++i) Put(i);
  EXPECT_FALSE(InHost(2));
  EXPECT_FALSE(InHost(5));
  EXPECT_EQ(Counters()["engine.enqueues"], 1);
  EXPECT_EQ(Counters()["engine.dequeues"], 1);
}

TEST_F(EngineQueueTest, LruIgnoresTheQueue) {
  Open(EvictionPolicyId::kLru);
  for (uint64_t i = 0; i < 8; ++i) Put(i);
  ASSERT_TRUE(Enqueue(1, {2, 5}, 1'000'000).ok()) << "accepted, and ignored";
  for (uint64_t i = 8; i < 24; ++i) Put(i);
  EXPECT_FALSE(InHost(2));
  EXPECT_FALSE(InHost(5));
}

TEST_F(EngineQueueTest, ANeededVictimInsideTheWindowIsDemotedWhateverAdmissionSays) {
  // No prefetch: a plan on the reader thread would read 0..3 back as soon
  // as they reach NVMe and evict more needed blocks, racing the counts.
  Open(EvictionPolicyId::kQueueAware, /*nvme=*/true, AdmissionPolicyId::kSecondHit, ReclaimOrder::kLru,
       /*prefetch_share=*/0);
  for (uint64_t i = 0; i < 8; ++i) Put(i);
  // Every cached block is needed: 0..3 within the window, 4..7 long after it.
  ASSERT_TRUE(Enqueue(1, {0, 1, 2, 3}, 1'000'000).ok());
  ASSERT_TRUE(Enqueue(2, {4, 5, 6, 7}, 60'000'000).ok());
  // The new blocks are needed soonest, so they are never the victims here.
  ASSERT_TRUE(Enqueue(3, {8, 9, 10, 11, 12, 13, 14, 15}, 500'000).ok());
  for (uint64_t i = 8; i < 16; ++i) Put(i);  // evicts the furthest-needed first: 4..7, then 0..3
  engine_->WaitForIdle();
  for (uint64_t i = 0; i < 4; ++i) EXPECT_TRUE(nvme_->Find(Key(i))) << "needed soon: demoted " << i;
  for (uint64_t i = 4; i < 8; ++i) EXPECT_FALSE(nvme_->Find(Key(i))) << "needed late: admission said no " << i;
  auto c = Counters();
  EXPECT_EQ(c["engine.needed_evictions"], 4) << "needed within the window";
  EXPECT_EQ(c["engine.forced_demotions"], 4);
  EXPECT_EQ(c["engine.admission_drops"], 4);
  EXPECT_EQ(c["nvme.admission.rejected_first_sighting"], 4);
}

TEST_F(EngineQueueTest, AQueuedRequestsNvmePrefixIsInTheHostTierBeforeItStarts) {
  Open(EvictionPolicyId::kQueueAware, /*nvme=*/true, AdmissionPolicyId::kAll);
  for (uint64_t i = 0; i < 16; ++i) Put(i);  // 0..7 demoted to NVMe
  engine_->WaitForIdle();
  for (uint64_t i = 0; i < 8; ++i) ASSERT_EQ(Where(i), Tier::kNvme) << i;
  const uint64_t before = clock_.NowUs();
  ASSERT_TRUE(Enqueue(1, {0, 1, 2}, 1'000'000).ok());
  engine_->WaitForIdle();
  ASSERT_LT(clock_.NowUs(), before + 1'000'000) << "still before the request's start";
  for (uint64_t i = 0; i < 3; ++i) EXPECT_EQ(Where(i), Tier::kHost) << "prefetched " << i;
  EXPECT_EQ(Where(3), Tier::kNvme) << "not asked for";
  auto c = Counters();
  EXPECT_EQ(c["engine.prefetches"], 3);
  EXPECT_EQ(c["engine.prefetch_bytes"], int64_t(3 * kBlockBytes));
  EXPECT_EQ(c["engine.promotions"], 3);
  // The prefetched prefix is what the request needs: pressure evicts others.
  for (uint64_t i = 16; i < 24; ++i) Put(i);
  for (uint64_t i = 0; i < 3; ++i) EXPECT_EQ(Where(i), Tier::kHost) << i;
}

TEST_F(EngineQueueTest, PrefetchSkipsShortHitsLateBlocksAndWhatTheBudgetCannotHold) {
  Open(EvictionPolicyId::kQueueAware, /*nvme=*/true, AdmissionPolicyId::kAll);
  for (uint64_t i = 0; i < 16; ++i) Put(i);
  engine_->WaitForIdle();
  // One usable block (99 is cached nowhere): below prefetch_min_blocks (2).
  ASSERT_TRUE(Enqueue(1, {0, 99, 1}, 1'000'000).ok());
  engine_->WaitForIdle();
  EXPECT_EQ(Where(0), Tier::kNvme);
  EXPECT_EQ(Counters()["engine.prefetch_skipped_short"], 1);
  // Due in 10 us: a 64 KiB read at the 1 GB/s seed takes 66 us.
  ASSERT_TRUE(Enqueue(2, {2, 3}, 10).ok());
  engine_->WaitForIdle();
  EXPECT_EQ(Where(2), Tier::kNvme);
  // Six blocks due in 1 s: the plan holds half the host tier, four blocks.
  ASSERT_TRUE(Enqueue(3, {2, 3, 4, 5, 6, 7}, 1'000'000).ok());
  engine_->WaitForIdle();
  for (uint64_t i = 2; i < 6; ++i) EXPECT_EQ(Where(i), Tier::kHost) << i;
  for (uint64_t i = 6; i < 8; ++i) EXPECT_EQ(Where(i), Tier::kNvme) << i;
  EXPECT_EQ(Counters()["engine.prefetches"], 4);
}

// The prefetch budget (half the host tier: 4 blocks) counts what earlier
// plans read in and nobody used: a second request gets nothing until the
// first one's blocks are used; each use plans again.
TEST_F(EngineQueueTest, PrefetchedBlocksHoldTheBudgetUntilUsed) {
  Open(EvictionPolicyId::kQueueAware, /*nvme=*/true, AdmissionPolicyId::kAll);
  for (uint64_t i = 0; i < 16; ++i) Put(i);
  engine_->WaitForIdle();
  ASSERT_TRUE(Enqueue(1, {0, 1, 2, 3}, 1'000'000).ok());
  engine_->WaitForIdle();
  for (uint64_t i = 0; i < 4; ++i) ASSERT_EQ(Where(i), Tier::kHost) << i;
  ASSERT_TRUE(Enqueue(2, {4, 5}, 2'000'000).ok());
  engine_->WaitForIdle();
  EXPECT_EQ(Where(4), Tier::kNvme) << "the budget is held by request 1's unused blocks";
  // Request 1 starts: nothing used yet, the budget is still held.
  ASSERT_TRUE(engine_->Dequeue(kScheduler, 1).ok());
  engine_->WaitForIdle();
  EXPECT_EQ(Where(4), Tier::kNvme);
  EXPECT_EQ(Counters()["engine.prefetches"], 4);
  // It pins its first two blocks: room for request 2's two.
  for (uint64_t i = 0; i < 2; ++i) {
    const BlockKey key = Key(i);
    auto grants = engine_->Pin(2, kNs, {&key, 1});
    ASSERT_TRUE(grants[0].status.ok()) << grants[0].status.ToString();
    ASSERT_TRUE(engine_->Release(2, {&grants[0].lease, 1})[0].ok());
  }
  engine_->WaitForIdle();
  EXPECT_EQ(Where(4), Tier::kHost);
  EXPECT_EQ(Where(5), Tier::kHost);
  EXPECT_EQ(Counters()["engine.prefetches"], 6);
}

// Whether prefetches pay off, for the operator: a prefetched block first
// used after its read ended was on time; one asked for while its read was
// still running was late (the request waited on it); one evicted before
// any use was read for nothing.
TEST_F(EngineQueueTest, PrefetchesAreCountedOnTimeLateOrUnused) {
  Open(EvictionPolicyId::kQueueAware, /*nvme=*/true, AdmissionPolicyId::kAll);
  for (uint64_t i = 0; i < 16; ++i) Put(i);  // 0..7 demoted to NVMe
  engine_->WaitForIdle();
  ASSERT_NE(device_, nullptr);
  device_->HoldReads();
  ASSERT_TRUE(Enqueue(1, {0, 1, 2}, 1'000'000).ok());
  for (int spin = 0; spin < 10'000 && device_->held_reads() < 3; ++spin) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(device_->held_reads(), 3u) << "three prefetch reads in flight";
  // Block 0 is asked for while its read is held: late.
  std::promise<std::vector<PinGrant>> pinned;
  engine_->PinAsync(2, kNs, {Key(0)}, [&pinned](std::vector<PinGrant> g) { pinned.set_value(std::move(g)); });
  EXPECT_EQ(Counters()["engine.prefetches_late"], 1);
  device_->ReleaseReads();
  auto late = pinned.get_future().get();
  ASSERT_TRUE(late[0].status.ok()) << late[0].status.ToString();
  ASSERT_TRUE(engine_->Release(2, {&late[0].lease, 1})[0].ok());
  engine_->WaitForIdle();
  // Block 1 is asked for after its read ended: on time.
  const BlockKey one = Key(1);
  auto grants = engine_->Pin(2, kNs, {&one, 1});
  ASSERT_TRUE(grants[0].status.ok());
  ASSERT_TRUE(engine_->Release(2, {&grants[0].lease, 1})[0].ok());
  auto c = Counters();
  EXPECT_EQ(c["engine.prefetches"], 3);
  EXPECT_EQ(c["engine.prefetches_late"], 1);
  EXPECT_EQ(c["engine.prefetches_on_time"], 1) << "the late one is not counted again when its read lands";
  // The request goes away; pressure evicts block 2, never used.
  ASSERT_TRUE(engine_->Dequeue(kScheduler, 1).ok());
  for (uint64_t i = 16; i < 32; ++i) Put(i);
  engine_->WaitForIdle();
  ASSERT_NE(Where(2), Tier::kHost);
  c = Counters();
  EXPECT_EQ(c["engine.prefetches_unused"], 1);
  EXPECT_EQ(c["engine.prefetches_on_time"], 1);
}

TEST_F(EngineQueueTest, DequeueAndConnectionClose) {
  Open(EvictionPolicyId::kQueueAware);
  for (uint64_t i = 0; i < 8; ++i) Put(i);
  EXPECT_EQ(engine_->Dequeue(kScheduler, 77).code(), StatusCode::kNotFound);
  ASSERT_TRUE(Enqueue(1, {3}, 1'000'000).ok());
  EXPECT_EQ(engine_->Dequeue(kScheduler + 1, 1).code(), StatusCode::kNotFound) << "ids are per connection";
  // Re-enqueueing replaces: block 3 is no longer needed, block 4 is.
  ASSERT_TRUE(Enqueue(1, {4}, 1'000'000).ok());
  for (uint64_t i = 8; i < 15; ++i) Put(i);  // 7 evictions: all old blocks but one
  EXPECT_FALSE(InHost(3));
  EXPECT_TRUE(InHost(4));
  // The scheduler's connection closes: its requests go with it.
  engine_->CloseConnection(kScheduler);
  EXPECT_EQ(engine_->Dequeue(kScheduler, 1).code(), StatusCode::kNotFound);
  for (uint64_t i = 15; i < 23; ++i) Put(i);
  EXPECT_FALSE(InHost(4));
}

TEST_F(EngineQueueTest, TheQueueIsBounded) {
  Open(EvictionPolicyId::kQueueAware);
  // The whole queue is bounded across connections (each within its share).
  const size_t per_connection = EngineOptions{}.max_queued_requests_per_connection;
  const auto enqueue = [&](uint64_t r) {
    const BlockKey key = Key(r % 100);
    return engine_->Enqueue(100 + r / per_connection, kNs, r, {&key, 1}, 1000, 0);
  };
  for (uint64_t r = 0; r < Engine::kMaxQueuedRequests; ++r) ASSERT_TRUE(enqueue(r).ok()) << r;
  Status full = enqueue(Engine::kMaxQueuedRequests);
  EXPECT_EQ(full.code(), StatusCode::kBusy);
  EXPECT_NE(full.message().find("Started/Finished"), std::string::npos) << full.message();
  EXPECT_TRUE(enqueue(5).ok()) << "replacing a queued request is not a new one";
  ASSERT_TRUE(engine_->Dequeue(100, 0).ok());
  EXPECT_TRUE(enqueue(Engine::kMaxQueuedRequests).ok());
}

// A flood from one connection gets Busy for that connection only.
TEST_F(EngineQueueTest, EachConnectionHasItsOwnShareOfTheQueue) {
  host_ = ::kvtier::testing::OpenTestHostTier(8 * kBlockBytes);
  ASSERT_NE(host_, nullptr);
  EngineOptions options{2, EvictionPolicyId::kQueueAware};
  options.max_queued_requests_per_connection = 10;
  options.max_queued_keys_per_connection = 25;
  auto engine = Engine::Create(options, *host_, clock_);
  ASSERT_TRUE(engine.ok());
  engine_ = std::move(*engine);
  constexpr ConnectionId kFlood = 1, kOther = 2;
  const BlockKey one[] = {Key(1)};
  for (uint64_t r = 0; r < 10; ++r) ASSERT_TRUE(engine_->Enqueue(kFlood, kNs, r, one, 1000, 0).ok()) << r;
  Status over = engine_->Enqueue(kFlood, kNs, 10, one, 1000, 0);
  EXPECT_EQ(over.code(), StatusCode::kBusy) << over.ToString();
  EXPECT_TRUE(engine_->Enqueue(kOther, kNs, 10, one, 1000, 0).ok()) << "another connection still enqueues";
  EXPECT_TRUE(engine_->Enqueue(kFlood, kNs, 3, one, 1000, 0).ok()) << "replacing is not a new request";
  // Keys: 10 requests of 1 key; one of them may grow to 16 keys (25 in
  // all), not to 17.
  std::vector<BlockKey> chain;
  for (uint64_t i = 0; i < 17; ++i) chain.push_back(Key(i));
  EXPECT_EQ(engine_->Enqueue(kFlood, kNs, 0, chain, 1000, 0).code(), StatusCode::kBusy);
  EXPECT_TRUE(engine_->Enqueue(kFlood, kNs, 0, std::span(chain).first(16), 1000, 0).ok());
  // Leaving the queue gives the share back.
  ASSERT_TRUE(engine_->Dequeue(kFlood, 0).ok());
  EXPECT_TRUE(engine_->Enqueue(kFlood, kNs, 11, one, 1000, 0).ok());
  EXPECT_EQ(engine_->Enqueue(kFlood, kNs, 12, one, 1000, 0).code(), StatusCode::kBusy);
  engine_->CloseConnection(kFlood);
  for (uint64_t r = 0; r < 10; ++r) EXPECT_TRUE(engine_->Enqueue(kFlood, kNs, r, one, 1000, 0).ok()) << r;
}

// A start far off (or a wrapped-around value) is clamped, not overflowed
// into "needed now": among blocks all needed, it is the furthest next use
// and goes first.
TEST_F(EngineQueueTest, AFarStartIsClampedNotWrapped) {
  Open(EvictionPolicyId::kQueueAware);
  for (uint64_t i = 0; i < 8; ++i) Put(i);
  ASSERT_TRUE(Enqueue(1, {0}, UINT64_MAX).ok());
  ASSERT_TRUE(Enqueue(2, {1, 2, 3, 4, 5, 6, 7}, 1'000'000).ok());
  Put(8);  // one of the eight needed blocks must go
  EXPECT_FALSE(InHost(0)) << "block 0's start wrapped around to 'now'";
  for (uint64_t i = 1; i < 8; ++i) EXPECT_TRUE(InHost(i)) << i;
}

TEST(QueuedKeysTest, CountsEachNamingUntilItIsRemoved) {
  QueuedKeys q;
  const BlockKey a[] = {Key(1), Key(2)};
  const BlockKey b[] = {Key(2), Key(2), Key(3)};
  q.Add(a);
  q.Add(b);
  EXPECT_EQ(q.size(), 3u);
  q.Remove(a);
  EXPECT_FALSE(q.Contains(Key(1)));
  EXPECT_TRUE(q.Contains(Key(2))) << "b still names it";
  q.Remove(b);
  EXPECT_FALSE(q.Contains(Key(2)));
  EXPECT_EQ(q.size(), 0u);
  q.Remove(b);  // more than added: nothing breaks
  EXPECT_EQ(q.size(), 0u);
}

// The NVMe tier's queue_aware reclaim asks the engine's queue: a block on
// NVMe that a queued request names, never read, is copied forward when its
// region is reclaimed; under lru it goes with the region.
TEST_F(EngineQueueTest, NvmeReclaimKeepsWhatAQueuedRequestNeeds) {
  for (ReclaimOrder order : {ReclaimOrder::kQueueAware, ReclaimOrder::kLru}) {
    SCOPED_TRACE(std::string(ReclaimOrderName(order)));
    engine_.reset();
    nvme_.reset();
    if (!dir_.empty()) ::kvtier::testing::RemoveTree(dir_);
    // No prefetch: Key(0) stays on NVMe.
    Open(EvictionPolicyId::kLru, /*nvme=*/true, AdmissionPolicyId::kAll, order, /*prefetch_share=*/0);
    for (uint64_t i = 0; i < 16; ++i) Put(i);  // 0..7 demoted
    engine_->WaitForIdle();
    ASSERT_EQ(Where(0), Tier::kNvme);
    ASSERT_TRUE(Enqueue(1, {0}, 3'600'000'000).ok());
    // 16 regions of 1 MiB hold ~15 records each: 700 more blocks reclaim
    // every region at least once after the first 16 are full (Key(0)'s
    // copy too). Each reinsertion is let finish before the next write (a
    // real workload races it).
    for (uint64_t i = 16; i < 716; ++i) {
      Put(i);
      engine_->WaitForIdle();
      for (int spin = 0; spin < 10'000; ++spin) {
        auto c = Counters();
        if (c["nvme.reinsert_needed"] <= c["nvme.reinserted"] + c["nvme.reinsert_failures"]) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    auto c = Counters();
    ASSERT_GT(c["nvme.region_reclaims"], 16);
    if (order == ReclaimOrder::kQueueAware) {
      EXPECT_EQ(Where(0), Tier::kNvme);
      EXPECT_GT(c["nvme.reinsert_needed"], 0);
      EXPECT_FALSE(Where(1) == Tier::kNvme) << "an unneeded, unread block is not kept";
    } else {
      EXPECT_EQ(Where(0), Tier::kNone);
      EXPECT_EQ(c["nvme.reinsert_needed"], 0);
    }
    ASSERT_TRUE(engine_->Dequeue(kScheduler, 1).ok());
  }
}

}  // namespace
}  // namespace kvtier

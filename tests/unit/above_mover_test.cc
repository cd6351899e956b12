// Tests of the AboveMover (daemon/engine/above_mover.h) without an Engine:
// MapTiers stand for the tier above (an HBM-sized one) and for the host
// tier's BlockTier face, the hooks are the test's own and the retries wait
// on a FakeClock the test moves. An offered block is copied up once and
// held in place; a full tier above evicts its least recently used block,
// demoting it into the host tier unless another tier holds it; a Busy
// tier above is tried again at its time until the deadline; an Erase
// cancels a copy up in flight; a full mover queue drops the offer.
#include "daemon/engine/above_mover.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "common/retry_scheduler.h"
#include "tests/testing/counter_of.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/map_tier.h"
#include "tests/testing/test_daemon.h"
#include "tiers/forwarding_tier.h"

namespace kvtier {
namespace {

using ::kvtier::testing::CheckBlockBytes;
using ::kvtier::testing::CounterOf;
using ::kvtier::testing::FakeClock;
using ::kvtier::testing::MapTier;

constexpr uint32_t kLayers = 4;
constexpr uint64_t kBlockBytes = kLayers * (4 << 10);
constexpr NamespaceFingerprint kNs{0xab0e, 0x3001};
constexpr NamespaceFingerprint kOtherNs{0xab0e, 0x3002};

BlockKey Key(uint64_t i) { return BlockKey{0xab0e, i}; }

// The host tier's face: a MapTier whose reads the test can hold at the
// door (the mover's thread waits inside Read until they open).
class GatedTier final : public ForwardingTier {
 public:
  using ForwardingTier::ForwardingTier;
  void CloseReads() {
    std::lock_guard lock(mu_);
    closed_ = true;
  }
  void OpenReads() {
    std::lock_guard lock(mu_);
    closed_ = false;
    changed_.notify_all();
  }
  // Waits until `n` reads have come in (held or not).
  void AwaitReads(int n) {
    std::unique_lock lock(mu_);
    changed_.wait(lock, [&] { return reads_ >= n; });
  }
  Status Read(const BlockKey& key, uint32_t first_layer, uint32_t last_layer, std::span<std::byte> dst,
              ReadDone done) override {
    {
      std::unique_lock lock(mu_);
      ++reads_;
      changed_.notify_all();
      changed_.wait(lock, [&] { return !closed_; });
    }
    return ForwardingTier::Read(key, first_layer, last_layer, dst, std::move(done));
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  bool closed_ = false;
  int reads_ = 0;
};

// The tier above: refuses writes as Busy while `busy`, and while
// `park_writes` keeps each write's completion until ReleaseWrites.
class AboveTier final : public ForwardingTier {
 public:
  using ForwardingTier::ForwardingTier;
  Status Write(const NamespaceFingerprint& ns, const BlockKey& key, uint32_t layer_count,
               std::span<const std::byte> payload, WriteDone done,
               std::optional<uint64_t> payload_checksum = std::nullopt) override {
    if (busy.load()) {
      refused.fetch_add(1);
      return Busy("scripted: no staging free");
    }
    if (!park_writes.load()) {
      return ForwardingTier::Write(ns, key, layer_count, payload, std::move(done), payload_checksum);
    }
    auto shared = std::make_shared<WriteDone>(std::move(done));
    return ForwardingTier::Write(
        ns, key, layer_count, payload,
        [this, shared](Status s) {
          std::lock_guard lock(mu_);
          parked_.push_back([shared, s] { (*shared)(s); });
          changed_.notify_all();
        },
        payload_checksum);
  }
  // Waits until a write's completion is parked.
  void AwaitParked() {
    std::unique_lock lock(mu_);
    changed_.wait(lock, [&] { return !parked_.empty(); });
  }
  // Runs every parked completion here.
  void ReleaseWrites() {
    std::vector<std::function<void()>> run;
    {
      std::lock_guard lock(mu_);
      run.swap(parked_);
    }
    for (auto& r : run) r();
  }
  std::atomic<bool> busy{false}, park_writes{false};
  std::atomic<int> refused{0};

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  std::vector<std::function<void()>> parked_;
};

class AboveMoverTest : public ::testing::Test {
 protected:
  // A tier above of `above_blocks` blocks and a mover queue of `max_jobs`.
  void Make(uint64_t above_blocks, size_t max_jobs = 64) {
    above_map_ = std::make_unique<MapTier>(above_blocks * kBlockBytes, "hbm");
    above_ = std::make_unique<AboveTier>(*above_map_);
    AboveMover::Hooks hooks;
    hooks.io_started = [this] {
      std::lock_guard lock(mu_);
      ++io_in_flight_;
    };
    hooks.io_finished = [this] {
      std::lock_guard lock(mu_);
      if (--io_in_flight_ == 0) idle_.notify_all();
    };
    hooks.held_below = [this](const BlockKey& key, const NamespaceFingerprint& ns) {
      std::lock_guard lock(mu_);
      return ns == kNs && held_below_.count(key) != 0;
    };
    mover_ = std::make_unique<AboveMover>(*above_, host_, clock_, retries_, max_jobs, std::move(hooks));
  }
  void TearDown() override {
    host_.OpenReads();
    if (above_ != nullptr) {
      above_->park_writes = false;
      above_->ReleaseWrites();
    }
    retries_.Stop();  // a retry still waiting runs now (and fails)
    WaitIdle();
    mover_.reset();
  }

  // Waits until nothing the mover started is in flight (an event, not a
  // time), and its queue has taken back the room of the jobs that ran
  // (the mover does that just after a job's last hook call).
  void WaitIdle() {
    {
      std::unique_lock lock(mu_);
      idle_.wait(lock, [this] { return io_in_flight_ == 0; });
    }
    while (CounterOf(*mover_, "engine.above_io.jobs_queued") != 0) std::this_thread::yield();
  }
  // Waits until the retry scheduler ran `runs` jobs in all, then until a
  // retry of the copy up waits for its time (true) or the copy up ended
  // without one (false).
  bool AwaitRetry(int64_t runs) {
    while (CounterOf(retries_, "test.retries.run") < runs) std::this_thread::yield();
    for (;;) {
      if (CounterOf(retries_, "test.retries.waiting") > 0) return true;
      {
        std::lock_guard lock(mu_);
        if (io_in_flight_ == 0) return false;
      }
      std::this_thread::yield();
    }
  }
  // `key` of `ns` committed in the host tier (its bytes: Block(key)).
  void PutHost(const BlockKey& key, const NamespaceFingerprint& ns = kNs) {
    const std::vector<std::byte> bytes = ::kvtier::testing::Block(key, kBlockBytes);
    ASSERT_TRUE(host_map_
                    .Write(
                        ns, key, kLayers, bytes, [](Status) {}, std::nullopt)
                    .ok());
  }
  void HeldBelow(const BlockKey& key) {
    std::lock_guard lock(mu_);
    held_below_.insert(key);
  }
  // Offers `key` and waits for the copy up to end.
  void OfferAndWait(const BlockKey& key) {
    mover_->Offer(kNs, key);
    WaitIdle();
  }
  // `key` is above with its exact bytes, held in place as a load would.
  bool AboveExact(const BlockKey& key) {
    std::optional<BlockTier::InPlace> held = mover_->Hold(kNs, key, kLayers, kBlockBytes);
    if (!held) return false;
    const bool exact = CheckBlockBytes(key, 0, above_map_->InPlaceBytes(held->offset));
    mover_->ReleaseHold(key, held->offset);
    return exact;
  }
  // `key` is in the host tier with its exact bytes.
  bool HostExact(const BlockKey& key) {
    std::optional<BlockTier::BlockInfo> info = host_map_.Find(key);
    if (!info) return false;
    std::vector<std::byte> bytes(info->payload_bytes);
    std::promise<Result<size_t>> done;
    auto read = done.get_future();
    if (!host_map_.Read(key, 0, info->layer_count, bytes, [&](Result<size_t> r) { done.set_value(r); }).ok()) {
      return false;
    }
    return read.get().ok() && CheckBlockBytes(key, 0, bytes);
  }
  int64_t Counter(const std::string& name) { return CounterOf(*mover_, name); }

  FakeClock clock_;
  MapTier host_map_;
  GatedTier host_{host_map_};
  std::unique_ptr<MapTier> above_map_;
  std::unique_ptr<AboveTier> above_;
  RetryScheduler retries_{"test.retries", clock_, 64};
  std::mutex mu_;
  std::condition_variable idle_;
  int64_t io_in_flight_ = 0;           // guarded by mu_
  std::set<BlockKey> held_below_;      // guarded by mu_
  std::unique_ptr<AboveMover> mover_;  // last: joined first
};

TEST_F(AboveMoverTest, AnOfferedBlockIsCopiedUpAndHeldThereInPlace) {
  Make(/*above_blocks=*/4);
  PutHost(Key(1));
  EXPECT_FALSE(mover_->Hold(kNs, Key(1), kLayers, kBlockBytes).has_value()) << "not above before the offer";
  OfferAndWait(Key(1));
  ASSERT_TRUE(mover_->source().tier->Find(Key(1)).has_value());
  EXPECT_EQ(mover_->source().tier->Find(Key(1))->ns, kNs);
  EXPECT_TRUE(AboveExact(Key(1)));
  EXPECT_EQ(Counter("engine.hbm_copies_up"), 1);
  EXPECT_EQ(Counter("engine.hbm_in_place_blocks"), 1);
  EXPECT_TRUE(host_map_.Find(Key(1)).has_value()) << "the host tier keeps its copy";
  // Held only as asked: under its namespace, with the load's layout.
  EXPECT_FALSE(mover_->Hold(kOtherNs, Key(1), kLayers, kBlockBytes).has_value());
  EXPECT_FALSE(mover_->Hold(kNs, Key(1), 1, kBlockBytes).has_value());
  EXPECT_EQ(above_map_->holds(), 0) << "a hold not handed out was released";
  EXPECT_EQ(Counter("engine.hbm_in_place_blocks"), 1);
  // A block of another namespace, or gone from the host tier, is skipped.
  PutHost(Key(2), kOtherNs);
  OfferAndWait(Key(2));
  OfferAndWait(Key(3));
  EXPECT_FALSE(above_map_->Find(Key(2)).has_value());
  EXPECT_FALSE(above_map_->Find(Key(3)).has_value());
  EXPECT_EQ(Counter("engine.hbm_copy_up_skips"), 2);
}

TEST_F(AboveMoverTest, OfferingAKeyTwiceCopiesItOnce) {
  Make(/*above_blocks=*/4);
  PutHost(Key(1));
  host_.CloseReads();
  mover_->Offer(kNs, Key(1));
  host_.AwaitReads(1);         // the copy up runs, held in its read
  mover_->Offer(kNs, Key(1));  // offered and not ended: nothing more
  host_.OpenReads();
  WaitIdle();
  mover_->Offer(kNs, Key(1));  // above now: nothing more
  WaitIdle();
  EXPECT_TRUE(AboveExact(Key(1)));
  EXPECT_EQ(Counter("engine.above_io.jobs_run"), 1) << "one copy up queued for three offers";
  EXPECT_EQ(CounterOf(*above_map_, "maptier.writes"), 1);
  EXPECT_EQ(CounterOf(host_map_, "maptier.reads"), 1);
  EXPECT_EQ(Counter("engine.hbm_copies_up"), 1);
  EXPECT_EQ(Counter("engine.hbm_offers_dropped"), 0);
}

TEST_F(AboveMoverTest, AFullTierEvictsItsLeastRecentlyUsedBlockDemotingOnlyWhatNoOtherTierHolds) {
  Make(/*above_blocks=*/2);
  PutHost(Key(1));
  PutHost(Key(2));
  OfferAndWait(Key(1));
  OfferAndWait(Key(2));
  // Both leave the host tier; a tier below holds Key(2).
  ASSERT_TRUE(host_map_.Erase(Key(1)).ok());
  ASSERT_TRUE(host_map_.Erase(Key(2)).ok());
  HeldBelow(Key(2));
  ASSERT_TRUE(AboveExact(Key(1)));  // a use: Key(2) is now the least recently used

  PutHost(Key(3));
  OfferAndWait(Key(3));
  EXPECT_TRUE(AboveExact(Key(3)));
  EXPECT_FALSE(above_map_->Find(Key(2)).has_value()) << "the least recently used block went";
  EXPECT_TRUE(above_map_->Find(Key(1)).has_value());
  EXPECT_FALSE(host_map_.Find(Key(2)).has_value()) << "a tier below holds it: not demoted";
  EXPECT_EQ(Counter("engine.hbm_evictions"), 1);
  EXPECT_EQ(Counter("engine.hbm_demotions_to_host"), 0);

  PutHost(Key(4));
  OfferAndWait(Key(4));  // Key(1) is the least recently used now, and no other tier holds it
  EXPECT_FALSE(above_map_->Find(Key(1)).has_value());
  EXPECT_TRUE(HostExact(Key(1))) << "demoted into the host tier with its bytes";
  EXPECT_EQ(Counter("engine.hbm_evictions"), 2);
  EXPECT_EQ(Counter("engine.hbm_demotions_to_host"), 1);

  PutHost(Key(5));
  OfferAndWait(Key(5));  // Key(3) goes; the host tier still holds it
  EXPECT_FALSE(above_map_->Find(Key(3)).has_value());
  EXPECT_TRUE(above_map_->Find(Key(4)).has_value());
  EXPECT_TRUE(AboveExact(Key(5)));
  EXPECT_EQ(Counter("engine.hbm_evictions"), 3);
  EXPECT_EQ(Counter("engine.hbm_demotions_to_host"), 1) << "held by the host tier: not written again";
  EXPECT_EQ(Counter("engine.hbm_demotion_failures"), 0);
  EXPECT_EQ(Counter("engine.hbm_copy_up_failures"), 0);
}

TEST_F(AboveMoverTest, ABusyTierAboveIsRetriedOnTheClockUntilItsDeadline) {
  Make(/*above_blocks=*/4);
  PutHost(Key(1));
  PutHost(Key(2));
  const uint64_t t0 = clock_.NowUs();
  above_->busy = true;
  mover_->Offer(kNs, Key(1));
  ASSERT_TRUE(AwaitRetry(0)) << "the copy up waits for its retry";
  EXPECT_EQ(clock_.AwaitWaiter(), t0 + AboveMover::kBusyPauseUs) << "a pause later on the clock";
  EXPECT_FALSE(above_map_->Find(Key(1)).has_value());
  ASSERT_TRUE(host_map_.Erase(Key(1)).ok());  // the retry writes the bytes it read, not the host tier's
  above_->busy = false;
  clock_.SetUs(t0 + AboveMover::kBusyPauseUs);
  WaitIdle();
  EXPECT_TRUE(AboveExact(Key(1)));
  EXPECT_EQ(Counter("engine.hbm_copies_up"), 1);
  EXPECT_EQ(above_->refused.load(), 1);

  const uint64_t t1 = clock_.NowUs();
  above_->busy = true;
  mover_->Offer(kNs, Key(2));
  ASSERT_TRUE(AwaitRetry(1));
  EXPECT_EQ(clock_.AwaitWaiter(), t1 + AboveMover::kBusyPauseUs);
  clock_.SetUs(t1 + AboveMover::kBusyPauseUs);
  ASSERT_TRUE(AwaitRetry(2)) << "refused again, short of the deadline: tried again";
  EXPECT_EQ(clock_.AwaitWaiter(), t1 + 2 * AboveMover::kBusyPauseUs) << "a pause later";
  EXPECT_EQ(Counter("engine.hbm_copy_up_failures"), 0);
  clock_.SetUs(t1 + AboveMover::kBusyWaitUs);  // the deadline
  ASSERT_FALSE(AwaitRetry(3)) << "refused at its deadline: not tried again";
  WaitIdle();
  EXPECT_EQ(above_->refused.load(), 4);
  EXPECT_EQ(Counter("engine.hbm_copy_up_failures"), 1) << "refused past its deadline";
  EXPECT_FALSE(above_map_->Find(Key(2)).has_value());
  EXPECT_EQ(CounterOf(retries_, "test.retries.waiting"), 0);
  above_->busy = false;
  OfferAndWait(Key(2));  // the failed offer ended: this one copies it up
  EXPECT_TRUE(AboveExact(Key(2)));
  EXPECT_EQ(Counter("engine.hbm_copies_up"), 2);
}

TEST_F(AboveMoverTest, AnEraseCancelsACopyUpInFlight) {
  Make(/*above_blocks=*/4);
  PutHost(Key(1));
  // Erased while the copy up reads it from the host tier.
  host_.CloseReads();
  mover_->Offer(kNs, Key(1));
  host_.AwaitReads(1);
  EXPECT_FALSE(mover_->Erase(kNs, Key(1), /*moving=*/false)) << "nothing stored above yet";
  host_.OpenReads();
  WaitIdle();
  ASSERT_FALSE(above_map_->Find(Key(1)).has_value()) << "the cancelled copy up did not write it";
  EXPECT_EQ(Counter("engine.hbm_copies_up"), 0);

  // Erased while its write above is in flight: the block written goes,
  // and its completion does not bring it back.
  above_->park_writes = true;
  mover_->Offer(kNs, Key(1));  // the cancelled offer ended: this one runs
  above_->AwaitParked();
  EXPECT_TRUE(mover_->Erase(kNs, Key(1), /*moving=*/false)) << "the block written meanwhile";
  above_->ReleaseWrites();
  WaitIdle();
  EXPECT_FALSE(above_map_->Find(Key(1)).has_value());
  // Not left in the eviction order either: a later offer copies it up.
  above_->park_writes = false;
  OfferAndWait(Key(1));
  EXPECT_TRUE(AboveExact(Key(1)));
}

TEST_F(AboveMoverTest, AFullMoverQueueDropsTheOffer) {
  Make(/*above_blocks=*/4, /*max_jobs=*/1);
  PutHost(Key(1));
  PutHost(Key(2));
  host_.CloseReads();
  mover_->Offer(kNs, Key(1));
  host_.AwaitReads(1);         // its one job runs
  mover_->Offer(kNs, Key(2));  // no room in the queue
  EXPECT_EQ(Counter("engine.hbm_offers_dropped"), 1);
  EXPECT_EQ(Counter("engine.above_io.refused"), 1);
  host_.OpenReads();
  WaitIdle();
  EXPECT_TRUE(AboveExact(Key(1)));
  EXPECT_FALSE(above_map_->Find(Key(2)).has_value()) << "the dropped offer copied nothing";
  OfferAndWait(Key(2));  // the dropped offer ended: this one copies it up
  EXPECT_TRUE(AboveExact(Key(2)));
  EXPECT_EQ(Counter("engine.hbm_offers_dropped"), 1);
}

}  // namespace
}  // namespace kvtier

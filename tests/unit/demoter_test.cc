// Tests of the Demoter, which writes blocks down the stack: a victim goes
// to the level chosen for it and is counted; a busy tier gets a copy that
// waits in the demoter until the tier has room (the caller's bytes are
// free at once), looking again on the fake clock's time, is not written
// once its block was erased, and is dropped when the demoter is full too,
// when its wait ends on that clock or once the demoter stops; a block a tier below evicts goes to the
// first tier under it that holds or admits it; failures count by cause.
#include "daemon/engine/demoter.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <future>
#include <memory>
#include <set>
#include <vector>

#include "common/checksum.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/map_tier.h"
#include "tiers/forwarding_tier.h"

namespace kvtier {
namespace {

using ::kvtier::testing::MapTier;

constexpr uint64_t kBlockBytes = 16 << 10;
constexpr NamespaceFingerprint kNs{0xde, 0x70};

BlockKey Key(uint64_t i) { return BlockKey{0xde70, i}; }

std::vector<std::byte> Bytes(uint8_t fill) { return std::vector<std::byte>(kBlockBytes, std::byte{fill}); }

// A tier that refuses writes as Busy while `busy` is set.
class BusyTier final : public ForwardingTier {
 public:
  explicit BusyTier(BlockTier& inner) : ForwardingTier(inner) {}
  Status Write(const NamespaceFingerprint& ns, const BlockKey& key, uint32_t layer_count,
               std::span<const std::byte> payload, WriteDone done,
               std::optional<uint64_t> payload_checksum = std::nullopt) override {
    if (busy.load()) return Busy("no staging");
    return ForwardingTier::Write(ns, key, layer_count, payload, std::move(done), payload_checksum);
  }
  std::atomic<bool> busy{false};
};

class DemoterTest : public ::testing::Test {
 protected:
  // Adds a level under the host admitting by `admission`, busy-able.
  void AddLevel(AdmissionPolicyId admission) {
    maps_.push_back(std::make_unique<MapTier>());
    busy_.push_back(std::make_unique<BusyTier>(*maps_.back()));
    auto level = std::make_unique<TierLevel>();
    level->tier = busy_.back().get();
    auto made = TierAdmission::Create(admission, DwpdOptions{}, 0, *level->tier, clock_);
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    level->admission = std::move(made).value();
    below_.push_back(std::move(level));
  }

  // A write's completion runs on its tier's thread and then calls the
  // demoter's hooks (a test's promise is set from the first of them): the
  // demoter stops writing, then the tiers' completions finish, before the
  // demoter is destroyed, as the engine waits for its I/O before it goes.
  void TearDown() override {
    if (demoter_ != nullptr) demoter_->Stop();
    for (auto& map : maps_) map->WaitForCompletions();
  }

  Demoter& Make(uint64_t buffer_bytes = 4 * kBlockBytes) {
    Demoter::Hooks hooks;
    hooks.io_started = [this] { ++io_started_; };
    hooks.io_finished = [this] {
      std::lock_guard lock(mu_);
      ++io_finished_;
      idle_.notify_all();
    };
    hooks.erased = [this](const BlockKey& key) { return erased_.count(key) != 0; };
    hooks.finished = [this](const BlockKey& key, const Status& written) {
      std::lock_guard lock(mu_);
      auto it = outcomes_.find(key);
      if (it != outcomes_.end()) it->second.set_value(written);
    };
    hooks.facts = [](const BlockKey&, uint64_t uses) {
      TierAdmission::Facts facts;
      facts.uses = uses;
      return facts;
    };
    demoter_ = std::make_unique<Demoter>(below_, buffer_bytes, counters_, std::move(hooks), clock_);
    return *demoter_;
  }

  // Waits until every write started has completed (an event, not a time).
  void WaitIdle() {
    std::unique_lock lock(mu_);
    idle_.wait(lock, [this] { return io_finished_.load() == io_started_.load(); });
  }
  // The outcome Demote reports for `key`, once it does.
  std::future<Status> Expect(const BlockKey& key) {
    std::lock_guard lock(mu_);
    return outcomes_[key].get_future();
  }
  // One level that answers Busy, and a demotion of Key(1) to it queued in
  // the demoter for room: its outcome, once it has one.
  std::future<Status> QueueForABusyLevel() {
    AddLevel(AdmissionPolicyId::kAll);
    Make();
    busy_[0]->busy = true;
    std::future<Status> done = Expect(Key(1));
    Demote(0, Key(1), Bytes(1));
    return done;
  }
  // Moves the clock to the time a queued demotion waits for, once one
  // does: it looks at the tier again.
  void NextLook() { clock_.SetUs(clock_.AwaitWaiter()); }
  void Demote(size_t level, const BlockKey& key, std::span<const std::byte> bytes,
              std::optional<uint64_t> checksum = std::nullopt) {
    demoter_->Demote(level, kNs, key, 1, bytes, checksum.value_or(BlockChecksum(bytes)));
  }

  ::kvtier::testing::FakeClock clock_;
  EngineCounters counters_;
  std::vector<std::unique_ptr<MapTier>> maps_;
  std::vector<std::unique_ptr<BusyTier>> busy_;
  std::vector<std::unique_ptr<TierLevel>> below_;
  std::set<BlockKey> erased_;
  std::atomic<int> io_started_{0}, io_finished_{0};
  std::mutex mu_;
  std::condition_variable idle_;
  std::map<BlockKey, std::promise<Status>> outcomes_;
  std::unique_ptr<Demoter> demoter_;  // last: joined first
};

TEST_F(DemoterTest, AVictimIsWrittenToTheLevelChosenForIt) {
  AddLevel(AdmissionPolicyId::kAll);
  AddLevel(AdmissionPolicyId::kAll);
  Make();
  std::future<Status> done = Expect(Key(1));
  const std::vector<std::byte> bytes = Bytes(1);
  Demote(1, Key(1), bytes);
  ASSERT_TRUE(done.get().ok());
  EXPECT_FALSE(maps_[0]->Find(Key(1)).has_value());
  ASSERT_TRUE(maps_[1]->Find(Key(1)).has_value());
  EXPECT_EQ(maps_[1]->Find(Key(1))->payload_checksum, BlockChecksum(bytes));
  EXPECT_EQ(counters_.demotions.load(), 1);
  WaitIdle();
  EXPECT_EQ(io_started_.load(), 1) << "one write, counted as I/O in flight until it completed";
}

TEST_F(DemoterTest, ABusyTierGetsACopyThatWaitsForRoom) {
  AddLevel(AdmissionPolicyId::kAll);
  Make();
  busy_[0]->busy = true;
  std::future<Status> done = Expect(Key(1));
  std::vector<std::byte> bytes = Bytes(7);
  const uint64_t checksum = BlockChecksum(bytes);
  Demote(0, Key(1), bytes);
  std::fill(bytes.begin(), bytes.end(), std::byte{0});  // the caller's bytes are free once Demote returns
  EXPECT_EQ(counters_.demotions_queued.load(), 1);
  const uint64_t look_us = clock_.AwaitWaiter();
  EXPECT_EQ(look_us, clock_.NowUs() + Demoter::kQueuedDemotionPollUs) << "it looks again a poll later";
  EXPECT_EQ(done.wait_for(std::chrono::seconds(0)), std::future_status::timeout) << "it waits for room";
  busy_[0]->busy = false;  // room, which the tier does not signal: the next look finds it
  clock_.SetUs(look_us);
  ASSERT_TRUE(done.get().ok());
  ASSERT_TRUE(maps_[0]->Find(Key(1)).has_value());
  EXPECT_EQ(maps_[0]->Find(Key(1))->payload_checksum, checksum) << "the copy, not the caller's reused buffer";
  EXPECT_GE(counters_.demotion_waits.load(), 1);
  EXPECT_EQ(counters_.demotions.load(), 1);
}

TEST_F(DemoterTest, AQueuedDemotionOfAnErasedBlockIsNotWritten) {
  std::future<Status> done = QueueForABusyLevel();
  clock_.AwaitWaiter();
  erased_.insert(Key(1));  // an Erase while it waited
  busy_[0]->busy = false;
  NextLook();
  EXPECT_EQ(done.get().code(), StatusCode::kCancelled);
  EXPECT_FALSE(maps_[0]->Find(Key(1)).has_value());
  EXPECT_EQ(counters_.demotions.load(), 0);
}

TEST_F(DemoterTest, WithTheDemoterFullTooTheBlockIsDropped) {
  AddLevel(AdmissionPolicyId::kAll);
  Make(/*buffer_bytes=*/kBlockBytes);
  busy_[0]->busy = true;
  std::future<Status> first = Expect(Key(1));
  std::future<Status> second = Expect(Key(2));
  Demote(0, Key(1), Bytes(1));
  Demote(0, Key(2), Bytes(2));
  EXPECT_EQ(second.get().code(), StatusCode::kBusy) << "no room in the demoter for a second copy";
  EXPECT_EQ(counters_.demotion_busy_drops.load(), 1);
  const uint64_t look_us = clock_.AwaitWaiter();  // the first waits for room
  busy_[0]->busy = false;
  clock_.SetUs(look_us);
  EXPECT_TRUE(first.get().ok());
  EXPECT_TRUE(maps_[0]->Find(Key(1)).has_value());
  EXPECT_FALSE(maps_[0]->Find(Key(2)).has_value());
}

TEST_F(DemoterTest, AQueuedDemotionIsDroppedWhenItsWaitOnTheClockEnds) {
  std::future<Status> done = QueueForABusyLevel();
  const uint64_t queued_us = clock_.AwaitWaiter() - Demoter::kQueuedDemotionPollUs;
  clock_.SetUs(queued_us + Demoter::kQueuedDemotionWaitUs - 1);
  EXPECT_EQ(clock_.AwaitWaiter(), queued_us + Demoter::kQueuedDemotionWaitUs)
      << "a moment before its wait ends it still waits, and looks last at its end";
  EXPECT_EQ(done.wait_for(std::chrono::seconds(0)), std::future_status::timeout);
  EXPECT_EQ(counters_.demotion_busy_drops.load(), 0);
  clock_.AdvanceUs(1);
  EXPECT_EQ(done.get().code(), StatusCode::kBusy) << "given up once the tier stayed busy for its wait";
  EXPECT_EQ(counters_.demotion_busy_drops.load(), 1);
  EXPECT_FALSE(maps_[0]->Find(Key(1)).has_value());
}

TEST_F(DemoterTest, StopGivesUpAQueuedDemotionOnAClockNobodyMoves) {
  std::future<Status> done = QueueForABusyLevel();
  clock_.AwaitWaiter();
  demoter_->Stop();
  EXPECT_EQ(done.get().code(), StatusCode::kBusy);
  EXPECT_EQ(counters_.demotion_busy_drops.load(), 1);
  std::future<Status> later = Expect(Key(2));
  Demote(0, Key(2), Bytes(2));
  EXPECT_EQ(later.get().code(), StatusCode::kBusy) << "one queued after Stop does not wait either";
}

TEST_F(DemoterTest, AWriteThatFailsIsCountedByItsCause) {
  AddLevel(AdmissionPolicyId::kAll);
  Make();
  std::future<Status> done = Expect(Key(1));
  Demote(0, Key(1), Bytes(1), /*checksum=*/12345);  // the bytes changed after their checksum was taken
  EXPECT_EQ(done.get().code(), StatusCode::kCorruption);
  EXPECT_EQ(counters_.demotion_corrupt.load(), 1);
  EXPECT_EQ(counters_.demotion_rejections.load(), 1);
  EXPECT_EQ(counters_.demotions.load(), 0);
}

TEST_F(DemoterTest, ABlockATierBelowEvictsGoesToTheFirstTierUnderItThatTakesIt) {
  AddLevel(AdmissionPolicyId::kAll);        // 0: the tier that evicts
  AddLevel(AdmissionPolicyId::kSecondHit);  // 1
  AddLevel(AdmissionPolicyId::kAll);        // 2
  Demoter& demoter = Make();
  const std::vector<std::byte> bytes = Bytes(5);
  auto evicted = [&](uint64_t i, uint64_t hits) {
    return BlockTier::Evicted{kNs, Key(i), 1, BlockChecksum(bytes), hits};
  };
  demoter.DemoteBelow(0, evicted(1, /*hits=*/0), bytes);  // level 1 refuses a block never read
  demoter.DemoteBelow(0, evicted(2, /*hits=*/1), bytes);
  WaitIdle();
  EXPECT_FALSE(maps_[1]->Find(Key(1)).has_value());
  EXPECT_TRUE(maps_[2]->Find(Key(1)).has_value());
  EXPECT_TRUE(maps_[1]->Find(Key(2)).has_value());
  EXPECT_EQ(below_[2]->demotions_in.load(), 1);
  EXPECT_EQ(below_[1]->demotions_in.load(), 1);
  // Held below already: no second write.
  demoter.DemoteBelow(0, evicted(2, 1), bytes);
  WaitIdle();
  EXPECT_EQ(below_[1]->demotions_in.load(), 1);
  EXPECT_EQ(below_[2]->demotions_in.load(), 1);
  // A block level 1 evicts can only go to level 2.
  demoter.DemoteBelow(1, evicted(3, 0), bytes);
  WaitIdle();
  EXPECT_TRUE(maps_[2]->Find(Key(3)).has_value());
  EXPECT_EQ(below_[2]->demotions_in.load(), 2);
}

TEST_F(DemoterTest, ABlockNoTierUnderItTakesIsDroppedAndCounted) {
  AddLevel(AdmissionPolicyId::kAll);
  AddLevel(AdmissionPolicyId::kSecondHit);
  Demoter& demoter = Make();
  const std::vector<std::byte> bytes = Bytes(9);
  demoter.DemoteBelow(0, BlockTier::Evicted{kNs, Key(1), 1, BlockChecksum(bytes), 0}, bytes);
  EXPECT_FALSE(maps_[1]->Find(Key(1)).has_value());
  EXPECT_EQ(below_[0]->demotion_drops.load(), 1);
  EXPECT_EQ(io_started_.load(), 0) << "nothing was written";
}

}  // namespace
}  // namespace kvtier

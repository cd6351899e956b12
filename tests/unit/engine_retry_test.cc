// What the engine does when a tier answers Busy (daemon/engine/
// promoter.cc, layer_streamer.cc, above_mover.cc): it tries again a moment later on its
// retry scheduler, on its own clock, until a deadline on that clock. The
// clock here is a FakeClock the test moves: FakeClock::AwaitWaiter says a
// retry waits for its time (and when), so each step is taken in order and
// nothing sleeps.
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/load_board.h"
#include "common/mutex.h"
#include "daemon/engine/engine.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/map_tier.h"
#include "tests/testing/test_daemon.h"
#include "tiers/forwarding_tier.h"

namespace kvtier {
namespace {

using ::kvtier::testing::CheckBlockBytes;
using ::kvtier::testing::FakeClock;
using ::kvtier::testing::MapTier;
using ::kvtier::testing::SlotBytes;

constexpr uint32_t kLayers = 4;
constexpr uint64_t kBlockBytes = kLayers * (4 << 10);
constexpr NamespaceFingerprint kNs{0x7e7, 0x2e7};
constexpr ConnectionId kConn = 5;
// The engine's pause between tries and how long it keeps trying.
constexpr uint64_t kPauseUs = 1'000;
constexpr uint64_t kBusyWaitUs = 2'000'000;

BlockKey Key(uint64_t i) { return BlockKey{0x7e7, i}; }

// A tier that answers Busy to every read and write while the test says so.
class BusyTier final : public ForwardingTier {
 public:
  using ForwardingTier::ForwardingTier;
  void SetBusy(bool busy) { busy_.store(busy); }
  int64_t refused() const { return refused_.load(); }

  Status Write(const NamespaceFingerprint& ns, const BlockKey& key, uint32_t layer_count,
               std::span<const std::byte> payload, WriteDone done,
               std::optional<uint64_t> payload_checksum = std::nullopt) override {
    if (Refuse()) return Busy("scripted: no staging free");
    return ForwardingTier::Write(ns, key, layer_count, payload, std::move(done), payload_checksum);
  }
  Status Read(const BlockKey& key, uint32_t first_layer, uint32_t last_layer, std::span<std::byte> dst,
              ReadDone done) override {
    if (Refuse()) return Busy("scripted: no staging free");
    return ForwardingTier::Read(key, first_layer, last_layer, dst, std::move(done));
  }
  Status ReadWithLayerChecksums(const BlockKey& key, uint32_t first_layer, uint32_t last_layer,
                                std::span<std::byte> dst, LayerReadDone done) override {
    if (Refuse()) return Busy("scripted: no staging free");
    return ForwardingTier::ReadWithLayerChecksums(key, first_layer, last_layer, dst, std::move(done));
  }

 private:
  bool Refuse() {
    if (!busy_.load()) return false;
    refused_.fetch_add(1);
    return true;
  }
  std::atomic<bool> busy_{false};
  std::atomic<int64_t> refused_{0};
};

// The answer of one PinAsync, once it comes (on a tier's or the
// scheduler's thread).
class Answer {
 public:
  Engine::PinDone Callback() {
    return [this](std::vector<PinGrant> grants) {
      MutexLock lock(mu_);
      grant_ = std::move(grants.at(0));
      done_ = true;
      cv_.NotifyAll();
    };
  }
  bool done() {
    MutexLock lock(mu_);
    return done_;
  }
  PinGrant Wait() {
    MutexLock lock(mu_);
    while (!done_) cv_.Wait(mu_);
    return grant_;
  }

 private:
  Mutex mu_;
  CondVar cv_;
  bool done_ GUARDED_BY(mu_) = false;
  PinGrant grant_ GUARDED_BY(mu_);
};

class EngineRetryTest : public ::testing::Test {
 protected:
  // An engine over a busy-able tier below (and, with `above`, one above).
  void Open(bool above) {
    host_ = ::kvtier::testing::OpenTestHostTier(64 * kBlockBytes);
    ASSERT_NE(host_, nullptr);
    std::vector<LowerTier> stack{LowerTier{&below_, AdmissionPolicyId::kAll, {}, 0, Tier::kRemote}};
    auto engine = Engine::Create(EngineOptions{4, EvictionPolicyId::kLru}, *host_, clock_, std::move(stack),
                                 above ? &above_ : nullptr);
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    engine_ = std::move(*engine);
    engine_->RegisterNamespace(kNs, NamespaceLayout{kLayers, kBlockBytes});
  }
  void TearDown() override { engine_.reset(); }

  // `key` stored in the tier below only.
  void StoreBelow(const BlockKey& key) {
    const std::vector<std::byte> bytes = ::kvtier::testing::Block(key, kBlockBytes);
    ASSERT_TRUE(below_map_
                    .Write(
                        kNs, key, kLayers, bytes, [](Status) {}, std::nullopt)
                    .ok());
  }
  // A load of `key` into GPU memory, ended at once: a host hit, offered up.
  void LoadInPlace(const BlockKey& key) {
    auto start = engine_->BeginLoad(kConn, kNs, {&key, 1}, {.in_place = true});
    ASSERT_TRUE(start.ok()) << start.status().ToString();
    ASSERT_TRUE(engine_->EndLoad(kConn, start->load).ok());
  }
  int64_t Counter(const std::string& name) { return ::kvtier::testing::EngineCounters(*engine_)[name]; }

  FakeClock clock_;
  MapTier below_map_;
  BusyTier below_{below_map_};
  MapTier above_map_{4 * kBlockBytes, "hbm"};
  BusyTier above_{above_map_};
  std::unique_ptr<HostTier> host_;
  std::unique_ptr<Engine> engine_;
};

// A promotion the tier below refuses is tried again each pause, on the
// engine's clock, and fails with Busy once that clock passed its deadline,
// not before; the block stays below and a later pin promotes it.
TEST_F(EngineRetryTest, APromotionIsRetriedUntilItsDeadlineOnTheEnginesClock) {
  Open(/*above=*/false);
  StoreBelow(Key(1));
  const uint64_t t0 = clock_.NowUs();
  below_.SetBusy(true);
  Answer answer;
  const BlockKey key = Key(1);
  engine_->PinAsync(kConn, kNs, {key}, answer.Callback());
  EXPECT_EQ(clock_.AwaitWaiter(), t0 + kPauseUs) << "the retry waits one pause";
  EXPECT_EQ(Counter("engine.retries.waiting"), 1);
  EXPECT_EQ(Counter("engine.promotion_retries"), 0);

  clock_.SetUs(t0 + kBusyWaitUs - 1);  // past the first retry's time, short of the deadline
  EXPECT_EQ(clock_.AwaitWaiter(), t0 + kBusyWaitUs - 1 + kPauseUs) << "busy again: tried again a pause later";
  EXPECT_EQ(Counter("engine.promotion_retries"), 1);
  EXPECT_FALSE(answer.done()) << "the pin waits while the deadline is ahead";

  clock_.SetUs(t0 + kBusyWaitUs - 1 + kPauseUs);
  const PinGrant refused = answer.Wait();
  EXPECT_EQ(refused.status.code(), StatusCode::kBusy) << refused.status.ToString();
  EXPECT_EQ(Counter("engine.promotion_retries"), 2);
  EXPECT_EQ(below_.refused(), 3);
  engine_->WaitForIdle();
  EXPECT_EQ(Counter("engine.retries.waiting"), 0);
  EXPECT_EQ(Counter("engine.promotion_failures"), 1);
  EXPECT_EQ(::kvtier::testing::LookupTier(*engine_, kNs, key), Tier::kRemote) << "still below";

  below_.SetBusy(false);
  auto grants = engine_->Pin(kConn, kNs, {&key, 1});
  ASSERT_TRUE(grants[0].status.ok()) << grants[0].status.ToString();
  EXPECT_TRUE(CheckBlockBytes(key, 0, SlotBytes(*host_, grants[0].offset, grants[0].length)));
  engine_->Release(kConn, {&grants[0].lease, 1});
}

// ~Engine does not wait for a retry's time: a clock nobody moves never
// gets there. The retry runs at once, its tier is still busy, and its pin
// is answered Busy before the engine is gone.
TEST_F(EngineRetryTest, AnEngineGoingAwayEndsTheRetriesThatWait) {
  Open(/*above=*/false);
  StoreBelow(Key(2));
  const uint64_t t0 = clock_.NowUs();
  below_.SetBusy(true);
  Answer answer;
  engine_->PinAsync(kConn, kNs, {Key(2)}, answer.Callback());
  EXPECT_EQ(clock_.AwaitWaiter(), t0 + kPauseUs);
  engine_.reset();
  ASSERT_TRUE(answer.done());
  EXPECT_EQ(answer.Wait().status.code(), StatusCode::kBusy);
  EXPECT_EQ(clock_.NowUs(), t0);
}

// Stop does what ~Engine does without freeing (a takeover abandons the
// engine after it): the waiting retry runs at once and its pin is
// answered; nothing is left waiting; a second Stop and the destruction
// after it are no-ops.
TEST_F(EngineRetryTest, StopEndsTheRetriesThatWaitAndLeavesNothingInFlight) {
  Open(/*above=*/false);
  StoreBelow(Key(3));
  below_.SetBusy(true);
  Answer answer;
  engine_->PinAsync(kConn, kNs, {Key(3)}, answer.Callback());
  clock_.AwaitWaiter();
  engine_->Stop();
  ASSERT_TRUE(answer.done()) << "answered before Stop returned";
  EXPECT_EQ(answer.Wait().status.code(), StatusCode::kBusy);
  EXPECT_EQ(Counter("engine.retries.waiting"), 0);
  engine_->Stop();
  engine_.reset();
}

// A copy up the tier above refuses as Busy waits for its time on the
// engine's clock, then writes the bytes it read; one that stays refused
// past the deadline fails (counted), and a later offer copies it up.
TEST_F(EngineRetryTest, ACopyUpTheTierAboveRefusesIsRetriedAtItsTime) {
  Open(/*above=*/true);
  ASSERT_TRUE(::kvtier::testing::PutFilledBlock(*engine_, *host_, kConn, kNs, Key(3), kBlockBytes).ok());
  ASSERT_TRUE(::kvtier::testing::PutFilledBlock(*engine_, *host_, kConn, kNs, Key(4), kBlockBytes).ok());
  const uint64_t t0 = clock_.NowUs();

  above_.SetBusy(true);
  LoadInPlace(Key(3));
  EXPECT_EQ(clock_.AwaitWaiter(), t0 + kPauseUs) << "the copy up waits for its retry";
  EXPECT_FALSE(above_map_.Find(Key(3)).has_value());
  above_.SetBusy(false);
  clock_.SetUs(t0 + kPauseUs);
  engine_->WaitForIdle();  // the retry ran and its write completed
  ASSERT_TRUE(above_map_.Find(Key(3)).has_value());
  EXPECT_EQ(Counter("engine.hbm_copies_up"), 1);
  EXPECT_EQ(Counter("engine.hbm_copy_up_failures"), 0);
  EXPECT_EQ(above_.refused(), 1);
  const BlockKey held = Key(3);
  auto start = engine_->BeginLoad(kConn, kNs, {&held, 1}, {.in_place = true});
  ASSERT_TRUE(start.ok());
  LoadBoardReader board(SlotBytes(*host_, start->board_offset, start->board_bytes).data(), 1);
  ASSERT_EQ(board.state(0), BoardBlockState::kInDevice);
  EXPECT_TRUE(CheckBlockBytes(held, 0, above_map_.InPlaceBytes(board.offset(0)))) << "the bytes read, written late";
  ASSERT_TRUE(engine_->EndLoad(kConn, start->load).ok());

  const uint64_t t1 = clock_.NowUs();
  above_.SetBusy(true);
  LoadInPlace(Key(4));
  EXPECT_EQ(clock_.AwaitWaiter(), t1 + kPauseUs);
  clock_.SetUs(t1 + kBusyWaitUs);  // the retry's time, and the deadline
  engine_->WaitForIdle();
  EXPECT_EQ(Counter("engine.hbm_copy_up_failures"), 1) << "refused past its deadline";
  EXPECT_EQ(Counter("engine.retries.waiting"), 0);
  EXPECT_FALSE(above_map_.Find(Key(4)).has_value());
  above_.SetBusy(false);
  LoadInPlace(Key(4));  // the offer ended: this one copies it up
  engine_->WaitForIdle();
  EXPECT_TRUE(above_map_.Find(Key(4)).has_value());
  EXPECT_EQ(Counter("engine.hbm_copies_up"), 2);
}

}  // namespace
}  // namespace kvtier

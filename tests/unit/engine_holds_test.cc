// Operator holds (Engine::Hold / Unhold, `kvtier pin` / `unpin`): a held
// block stays in the host tier under pressure that evicts the others,
// until its TTL passes on the (fake) clock, it is unheld, its namespace is
// dropped or it is erased; holding it again renews its expiry with one
// pin; a block found only on NVMe is read back into the host tier and held.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "daemon/engine/engine.h"
#include "tests/testing/engine_stack.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/test_daemon.h"
#include "tiers/nvme/nvme_tier.h"

namespace kvtier {
namespace {

using ::kvtier::testing::FakeClock;
using ::kvtier::testing::ModelNamespace;

constexpr uint64_t kBlockBytes = 64 << 10;
constexpr uint64_t kSecondUs = 1'000'000;
constexpr int kHostBlocks = 8;

class EngineHoldsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(engine_, nullptr);
    engine_->RegisterNamespace(a_, ModelNamespace("org/model", "rev-1"));
    engine_->RegisterNamespace(b_, ModelNamespace("org/model", "rev-2"));
  }
  static BlockKey Key(const NamespaceFingerprint& ns, uint64_t i) { return BlockKey{ns.lo, i}; }
  void Put(const NamespaceFingerprint& ns, uint64_t i) {
    clock_.AdvanceUs(1);
    Status s = ::kvtier::testing::PutFilledBlock(*engine_, *host_, 1, ns, Key(ns, i), kBlockBytes);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  // Fills the host tier with a's blocks 0..7, a's 0 the least recent.
  void FillWithA() {
    for (uint64_t i = 0; i < kHostBlocks; ++i) Put(a_, i);
  }
  // More of b's blocks than the host tier holds: every unheld block before
  // them leaves it (demoted or dropped).
  void Pressure() {
    for (int i = 0; i < kHostBlocks + 4; ++i) Put(b_, next_b_++);
    engine_->WaitForIdle();
  }
  Tier Where(const BlockKey& key) { return ::kvtier::testing::LookupTier(*engine_, a_, key); }
  int64_t Counter(const std::string& name) { return ::kvtier::testing::EngineCounters(*engine_)[name]; }
  Engine::HoldResult HoldOne(uint64_t i, uint64_t ttl_us) {
    const BlockKey key = Key(a_, i);
    return engine_->Hold(a_, {&key, 1}, ttl_us)[0];
  }
  // The block's bytes are the ones written: a use through a client's pin.
  void ExpectIntact(uint64_t i) {
    const BlockKey key = Key(a_, i);
    auto grants = engine_->Pin(7, a_, {&key, 1});
    ASSERT_TRUE(grants[0].status.ok()) << grants[0].status.ToString();
    EXPECT_TRUE(::kvtier::testing::CheckBlockBytes(
        key, 0, ::kvtier::testing::SlotBytes(*host_, grants[0].offset, grants[0].length)));
    EXPECT_TRUE(engine_->Release(7, {&grants[0].lease, 1})[0].ok());
  }

  ::kvtier::testing::EngineStack stack_{kHostBlocks * kBlockBytes};
  FakeClock& clock_ = stack_.clock;
  HostTier* host_ = stack_.host.get();
  NvmeTier* nvme_ = stack_.nvme.get();
  Engine* engine_ = stack_.engine.get();
  const NamespaceFingerprint a_ = FingerprintNamespace(ModelNamespace("org/model", "rev-1"));
  const NamespaceFingerprint b_ = FingerprintNamespace(ModelNamespace("org/model", "rev-2"));
  uint64_t next_b_ = 0;
};

TEST_F(EngineHoldsTest, AHeldBlockSurvivesPressureThatEvictsTheOthersUntilItsTtlPasses) {
  FillWithA();
  const Engine::HoldResult held = HoldOne(0, 60 * kSecondUs);
  ASSERT_TRUE(held.status.ok()) << held.status.ToString();
  EXPECT_FALSE(held.pending) << "a host block is held at once";
  EXPECT_EQ(Counter("engine.holds"), 1);
  EXPECT_EQ(Counter("engine.held_bytes"), static_cast<int64_t>(kBlockBytes));
  Pressure();
  EXPECT_EQ(Where(Key(a_, 0)), Tier::kHost) << "held: never evicted";
  for (uint64_t i = 1; i < kHostBlocks; ++i) EXPECT_NE(Where(Key(a_, i)), Tier::kHost) << "unheld block " << i;
  ExpectIntact(0);

  // 59 s on: still held.
  clock_.AdvanceUs(59 * kSecondUs);
  Pressure();
  EXPECT_EQ(Where(Key(a_, 0)), Tier::kHost);
  // Past its TTL nothing calls Hold or Unhold: the allocation that finds no
  // room releases it before it evicts, and it goes like any other block.
  clock_.AdvanceUs(2 * kSecondUs);
  EXPECT_EQ(Counter("engine.holds"), 0) << "an expired hold is not in force";
  Pressure();
  EXPECT_NE(Where(Key(a_, 0)), Tier::kHost) << "evictable again after its TTL";
  EXPECT_EQ(Counter("engine.holds_expired"), 1);
  EXPECT_EQ(Counter("engine.leases"), 0);
  EXPECT_EQ(Counter("engine.pinned_blocks"), 0);
}

TEST_F(EngineHoldsTest, UnholdReleasesAtOnce) {
  FillWithA();
  ASSERT_TRUE(HoldOne(0, 3600 * kSecondUs).status.ok());
  const BlockKey key = Key(a_, 0);
  EXPECT_EQ(engine_->Unhold(b_, {&key, 1})[0].code(), StatusCode::kNotFound) << "another namespace's key";
  EXPECT_TRUE(engine_->Unhold(a_, {&key, 1})[0].ok());
  EXPECT_EQ(engine_->Unhold(a_, {&key, 1})[0].code(), StatusCode::kNotFound) << "held no longer";
  EXPECT_EQ(Counter("engine.holds"), 0);
  EXPECT_EQ(Counter("engine.holds_ended"), 1);
  EXPECT_EQ(Counter("engine.leases"), 0);
  Pressure();
  EXPECT_NE(Where(key), Tier::kHost);
}

TEST_F(EngineHoldsTest, HoldingAHeldKeyAgainRenewsItsExpiryWithOnePin) {
  FillWithA();
  ASSERT_TRUE(HoldOne(0, 10 * kSecondUs).status.ok());
  clock_.AdvanceUs(8 * kSecondUs);
  const Engine::HoldResult again = HoldOne(0, 10 * kSecondUs);  // now until 18 s
  ASSERT_TRUE(again.status.ok()) << again.status.ToString();
  EXPECT_FALSE(again.pending);
  EXPECT_EQ(Counter("engine.leases"), 1) << "one pin, not two";
  EXPECT_EQ(Counter("engine.holds"), 1);
  // Twice in one call is one hold too.
  const BlockKey twice[] = {Key(a_, 1), Key(a_, 1)};
  for (const auto& r : engine_->Hold(a_, twice, 10 * kSecondUs)) EXPECT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(Counter("engine.leases"), 2);
  EXPECT_EQ(Counter("engine.holds"), 2);
  const BlockKey one = Key(a_, 1);
  EXPECT_TRUE(engine_->Unhold(a_, {&one, 1})[0].ok());
  EXPECT_EQ(Counter("engine.leases"), 1);

  clock_.AdvanceUs(8 * kSecondUs);  // 16 s: past the first expiry, not the renewed one
  Pressure();
  EXPECT_EQ(Where(Key(a_, 0)), Tier::kHost) << "the renewed hold still holds it";
  clock_.AdvanceUs(3 * kSecondUs);  // 19 s
  Pressure();
  EXPECT_NE(Where(Key(a_, 0)), Tier::kHost);
  EXPECT_EQ(Counter("engine.leases"), 0);
}

TEST_F(EngineHoldsTest, DroppingTheNamespaceEndsItsHoldsAndFreesTheBlocks) {
  FillWithA();
  const BlockKey keys[] = {Key(a_, 0), Key(a_, 1), Key(a_, 2)};
  for (const auto& r : engine_->Hold(a_, keys, 3600 * kSecondUs)) ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(Counter("engine.holds"), 3);
  engine_->DropNamespace(a_);
  engine_->WaitForIdle();
  EXPECT_EQ(Counter("engine.holds"), 0);
  EXPECT_EQ(Counter("engine.holds_ended"), 3);
  EXPECT_EQ(Counter("engine.leases"), 0);
  EXPECT_EQ(Counter("engine.zombie_blocks"), 0) << "no erased block kept alive by a hold";
  for (const BlockKey& key : keys) EXPECT_EQ(Where(key), Tier::kNone);
  EXPECT_EQ(engine_->Unhold(a_, {keys, 1})[0].code(), StatusCode::kNotFound);
  EXPECT_EQ(HoldOne(0, kSecondUs).status.code(), StatusCode::kNotFound) << "dropped: nothing to hold";
}

TEST_F(EngineHoldsTest, ErasingAHeldBlockEndsItsHold) {
  FillWithA();
  ASSERT_TRUE(HoldOne(0, 3600 * kSecondUs).status.ok());
  const BlockKey key = Key(a_, 0);
  EXPECT_EQ(engine_->Erase(a_, {&key, 1}), 1u);
  EXPECT_EQ(Counter("engine.holds"), 0);
  EXPECT_EQ(Counter("engine.zombie_blocks"), 0);
  EXPECT_EQ(Counter("engine.leases"), 0);
}

TEST_F(EngineHoldsTest, ABlockOnlyOnNvmeIsReadIntoTheHostTierAndHeld) {
  FillWithA();
  Pressure();  // a's blocks are on NVMe now
  ASSERT_EQ(Where(Key(a_, 3)), Tier::kNvme);
  const Engine::HoldResult held = HoldOne(3, 60 * kSecondUs);
  ASSERT_TRUE(held.status.ok()) << held.status.ToString();
  engine_->WaitForIdle();  // the promotion's read lands
  EXPECT_EQ(Where(Key(a_, 3)), Tier::kHost);
  EXPECT_EQ(Counter("engine.holds"), 1) << (held.pending ? "held once its read landed" : "held at once");
  EXPECT_EQ(Counter("engine.hold_failures"), 0);
  Pressure();
  EXPECT_EQ(Where(Key(a_, 3)), Tier::kHost);
  ExpectIntact(3);
  // Asking again while held renews it: one pin.
  EXPECT_FALSE(HoldOne(3, 60 * kSecondUs).pending);
  EXPECT_EQ(Counter("engine.leases"), 1);
}

TEST_F(EngineHoldsTest, UncachedKeysAndBadTtlsAreRefusedPerKey) {
  FillWithA();
  EXPECT_EQ(HoldOne(99, kSecondUs).status.code(), StatusCode::kNotFound);
  const BlockKey key = Key(a_, 0);
  EXPECT_EQ(engine_->Hold(b_, {&key, 1}, kSecondUs)[0].status.code(), StatusCode::kNotFound)
      << "the key is another namespace's";
  EXPECT_EQ(HoldOne(0, 0).status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(HoldOne(0, Engine::kMaxHoldTtlUs + 1).status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Counter("engine.holds"), 0);
  EXPECT_EQ(Counter("engine.leases"), 0);
}

}  // namespace
}  // namespace kvtier

// Tests of the Holder, operator holds over the Pinner, driven without an
// Engine (tests/testing/pin_parts.h: real shards, arena, Promoter and
// Pinner, a MapTier below, a FakeClock). A host block is held with one pin
// under kHoldConnection until its TTL passes; holding it again renews the
// expiry with no second pin; a block found only below is pending until
// its read lands; Unhold, EndHolds and EndNamespaceHolds end holds of
// their namespace only; a hold pending when its namespace is dropped
// fails when it lands and leaves no pin behind.
#include "daemon/engine/holder.h"

#include <gtest/gtest.h>

#include <vector>

#include "daemon/engine/block_index.h"
#include "tests/testing/pin_parts.h"

namespace kvtier {
namespace {

constexpr NamespaceFingerprint kNs{0x914, 0x50};
constexpr NamespaceFingerprint kOtherNs{0x914, 0x51};
constexpr uint64_t kSecondUs = 1'000'000;

class HolderTest : public ::testing::Test, protected ::kvtier::testing::PinParts {
 protected:
  HolderTest() : holder_(clock_, *pinner_, *promoter_, counters_) {}

  EngineHoldResult HoldOne(uint64_t i, uint64_t ttl_us, const NamespaceFingerprint& ns = kNs) {
    const BlockKey key = Key(i);
    return holder_.Hold(ns, {&key, 1}, ttl_us).at(0);
  }
  uint32_t Pins(uint64_t i) {
    std::optional<BlockEntry> entry = Entry(Key(i));
    return entry ? entry->pins : 0;
  }

  Holder holder_;
};

TEST_F(HolderTest, AHostBlockIsHeldWithOnePinUntilItsTtlPasses) {
  Commit(1, kNs);
  const uint64_t start = clock_.NowUs();
  const EngineHoldResult r = HoldOne(1, 10 * kSecondUs);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_FALSE(r.pending) << "a host block is held at once";
  EXPECT_EQ(Entry(Key(1))->state(), BlockState::kPinned);
  EXPECT_EQ(holder_.InForce().holds, 1);
  EXPECT_EQ(holder_.InForce().bytes, static_cast<int64_t>(kBlockBytes));
  clock_.SetUs(start + 10 * kSecondUs - 1);
  EXPECT_EQ(holder_.ReleaseExpired(), 0u);
  EXPECT_EQ(Pins(1), 1u);
  clock_.SetUs(start + 10 * kSecondUs);
  EXPECT_EQ(holder_.ReleaseExpired(), 1u);
  EXPECT_EQ(Entry(Key(1))->state(), BlockState::kCommitted) << "its pin went with its hold";
  EXPECT_EQ(holder_.InForce().holds, 0);
  EXPECT_EQ(counters_.holds_expired.load(), 1);
}

TEST_F(HolderTest, HoldingAgainRenewsTheExpiryWithNoSecondPin) {
  Commit(2, kNs);
  const uint64_t start = clock_.NowUs();
  ASSERT_TRUE(HoldOne(2, 10 * kSecondUs).status.ok());
  clock_.SetUs(start + 5 * kSecondUs);
  ASSERT_TRUE(HoldOne(2, 10 * kSecondUs).status.ok());
  EXPECT_EQ(Pins(2), 1u);
  clock_.SetUs(start + 10 * kSecondUs);
  EXPECT_EQ(holder_.ReleaseExpired(), 0u) << "the first expiry no longer stands";
  clock_.SetUs(start + 15 * kSecondUs);
  EXPECT_EQ(holder_.ReleaseExpired(), 1u);
  EXPECT_EQ(Pins(2), 0u);
}

TEST_F(HolderTest, ABlockFoundOnlyBelowIsPendingUntilItsReadLands) {
  Store(3, kNs);
  below_.Close();
  const EngineHoldResult r = HoldOne(3, 10 * kSecondUs);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_TRUE(r.pending);
  EXPECT_EQ(holder_.InForce().holds, 0) << "not held before it lands";
  const BlockKey key = Key(3);
  EXPECT_EQ(holder_.Unhold(kNs, {&key, 1})[0].code(), StatusCode::kNotFound) << "a pending hold is not held yet";
  below_.Open();
  WaitIdle();
  EXPECT_EQ(holder_.InForce().holds, 1);
  EXPECT_EQ(Pins(3), 1u);
  EXPECT_EQ(counters_.promotions.load(), 1);
  EXPECT_TRUE(holder_.Unhold(kNs, {&key, 1})[0].ok());
  EXPECT_EQ(Pins(3), 0u);
  EXPECT_EQ(counters_.holds_ended.load(), 1);
  EXPECT_EQ(counters_.hold_failures.load(), 0);
}

TEST_F(HolderTest, ABadTtlOrAMissIsRefused) {
  Commit(4, kNs);
  for (uint64_t ttl : {uint64_t{0}, Holder::kMaxHoldTtlUs + 1}) {
    const EngineHoldResult r = HoldOne(4, ttl);
    EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument) << ttl;
  }
  EXPECT_EQ(Pins(4), 0u) << "nothing pinned for a bad TTL";
  EXPECT_EQ(HoldOne(5, kSecondUs).status.code(), StatusCode::kNotFound) << "cached in no tier";
  EXPECT_EQ(holder_.InForce().holds, 0);
}

TEST_F(HolderTest, EndHoldsAndEndNamespaceHoldsEndOnlyTheirNamespacesHolds) {
  Commit(4, kNs);
  Commit(5, kNs);
  Commit(6, kOtherNs);
  ASSERT_TRUE(HoldOne(4, kSecondUs).status.ok());
  ASSERT_TRUE(HoldOne(5, kSecondUs).status.ok());
  ASSERT_TRUE(HoldOne(6, kSecondUs, kOtherNs).status.ok());
  const std::vector<BlockKey> erased{Key(4), Key(6)};
  EXPECT_EQ(holder_.EndHolds(kNs, erased), 1u) << "block 6 is another namespace's";
  EXPECT_EQ(Pins(4), 0u);
  EXPECT_EQ(Pins(6), 1u);
  holder_.EndNamespaceHolds(kNs);
  EXPECT_EQ(Pins(5), 0u);
  EXPECT_EQ(Pins(6), 1u);
  EXPECT_EQ(holder_.InForce().holds, 1);
  EXPECT_EQ(counters_.holds_ended.load(), 2);
}

TEST_F(HolderTest, AHoldPendingWhenItsNamespaceIsDroppedFailsWhenItLands) {
  Commit(7, kNs);
  BeginDemotion(7);  // its write below is in flight: the hold waits for it
  const EngineHoldResult r = HoldOne(7, 10 * kSecondUs);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_TRUE(r.pending);
  holder_.EndNamespaceHolds(kNs);  // dropped meanwhile
  Store(7, kNs);
  ASSERT_EQ(EndDemotion(7), 1u);
  WaitIdle();
  EXPECT_EQ(counters_.promotions.load(), 1) << "the pin landed";
  EXPECT_EQ(counters_.hold_failures.load(), 1);
  EXPECT_EQ(Pins(7), 0u) << "and its pin went";
  EXPECT_EQ(holder_.InForce().holds, 0);
}

}  // namespace
}  // namespace kvtier

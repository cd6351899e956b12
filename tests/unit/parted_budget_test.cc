#include "daemon/server/parted_budget.h"

#include <gtest/gtest.h>

namespace kvtier {
namespace {

TEST(PartedBudget, OnePartyGetsTheWholeLimit) {
  PartedBudget slots(4, 1, 50);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(slots.TryTake(0, 1));
  EXPECT_FALSE(slots.TryTake(0, 1));
  slots.Give(0, 1);
  EXPECT_TRUE(slots.TryTake(0, 1));
  EXPECT_EQ(slots.used(), 4u);
}

TEST(PartedBudget, APartyAtItsLimitLeavesTheOthersTheirParts) {
  // 16 slots, half reserved among 3 parties: parts of 2, 10 shared.
  PartedBudget slots(16, 3, 50);
  EXPECT_EQ(slots.part(), 2u);
  int taken = 0;
  while (slots.TryTake(0, 1)) ++taken;
  EXPECT_EQ(taken, 12) << "its part and every shared slot";
  EXPECT_FALSE(slots.TryTake(0, 1));
  EXPECT_TRUE(slots.TryTake(1, 1));
  EXPECT_TRUE(slots.TryTake(1, 1));
  EXPECT_FALSE(slots.TryTake(1, 1)) << "past its part, and nothing is shared any more";
  EXPECT_TRUE(slots.TryTake(2, 1));
  EXPECT_TRUE(slots.TryTake(2, 1));
  EXPECT_EQ(slots.used(), 16u);
  // A shared slot given back is anyone's again.
  slots.Give(0, 1);
  EXPECT_TRUE(slots.TryTake(1, 1));
  EXPECT_FALSE(slots.TryTake(0, 1));
  EXPECT_EQ(slots.used_of(1), 3u);
}

TEST(PartedBudget, ZeroPercentSharesEverythingAndAHundredSharesNothing) {
  PartedBudget shared(6, 2, 0);
  for (int i = 0; i < 6; ++i) EXPECT_TRUE(shared.TryTake(0, 1));
  EXPECT_FALSE(shared.TryTake(1, 1));
  PartedBudget split(6, 2, 100);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(split.TryTake(0, 1));
  EXPECT_FALSE(split.TryTake(0, 1));
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(split.TryTake(1, 1));
  split.Give(1, 1);
  split.Give(1, 1);
  EXPECT_FALSE(split.TryTake(0, 1)) << "party 1's free slots stay party 1's";
}

TEST(PartedBudget, GivingBackWhatWasNotTakenChangesNothing) {
  PartedBudget slots(2, 2, 100);
  slots.Give(0, 1);
  EXPECT_EQ(slots.used(), 0u);
  EXPECT_TRUE(slots.TryTake(0, 1));
  EXPECT_FALSE(slots.TryTake(0, 1));
}

TEST(PartedBudget, AmountsTakeFromThePartFirstThenTheSharedRest) {
  // 1000 bytes, 60% among 3 parties: parts of 200, 400 shared.
  PartedBudget bytes(1000, 3, 60);
  EXPECT_EQ(bytes.part(), 200u);
  EXPECT_TRUE(bytes.TryTake(0, 150));
  EXPECT_TRUE(bytes.TryTake(0, 450)) << "50 of its part and 400 shared";
  EXPECT_FALSE(bytes.TryTake(0, 1));
  EXPECT_FALSE(bytes.TryTake(1, 201)) << "past its part with nothing shared left";
  EXPECT_TRUE(bytes.TryTake(1, 200));
  bytes.Give(0, 100);  // back to the shared rest
  EXPECT_TRUE(bytes.TryTake(2, 300));
  EXPECT_EQ(bytes.used(), 1000u);
}

TEST(PartedBudget, WhatIsTakenRegardlessCountsAgainstLaterTakes) {
  PartedBudget bytes(100, 2, 100);
  bytes.Take(0, 80);
  EXPECT_FALSE(bytes.TryTake(0, 1)) << "80 of its 50 already";
  EXPECT_TRUE(bytes.TryTake(1, 50)) << "the other party's part is untouched";
  bytes.Give(0, 80);
  EXPECT_TRUE(bytes.TryTake(0, 50));
  EXPECT_EQ(bytes.used(), 100u);
}

TEST(PartedBudget, AHugeLimitDoesNotOverflow) {
  PartedBudget bytes(UINT64_MAX, 4, 50);
  EXPECT_GT(bytes.part(), UINT64_MAX / 10);
  EXPECT_TRUE(bytes.TryTake(3, UINT64_MAX / 2));
}

}  // namespace
}  // namespace kvtier

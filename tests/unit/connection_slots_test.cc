#include "daemon/connection_slots.h"

#include <gtest/gtest.h>

namespace kvtier {
namespace {

TEST(ConnectionSlots, OnePartyGetsEverySlot) {
  ConnectionSlots slots(4, 1, 50);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(slots.TryTake(0));
  EXPECT_FALSE(slots.TryTake(0));
  slots.Give(0);
  EXPECT_TRUE(slots.TryTake(0));
  EXPECT_EQ(slots.open(), 4u);
}

TEST(ConnectionSlots, APartyAtItsLimitLeavesTheOthersTheirParts) {
  // 16 slots, half reserved among 3 parties: parts of 2, 10 shared.
  ConnectionSlots slots(16, 3, 50);
  EXPECT_EQ(slots.part(), 2u);
  int taken = 0;
  while (slots.TryTake(0)) ++taken;
  EXPECT_EQ(taken, 12) << "its part and every shared slot";
  EXPECT_FALSE(slots.TryTake(0));
  EXPECT_TRUE(slots.TryTake(1));
  EXPECT_TRUE(slots.TryTake(1));
  EXPECT_FALSE(slots.TryTake(1)) << "past its part, and nothing is shared any more";
  EXPECT_TRUE(slots.TryTake(2));
  EXPECT_TRUE(slots.TryTake(2));
  EXPECT_EQ(slots.open(), 16u);
  // A shared slot given back is anyone's again.
  slots.Give(0);
  EXPECT_TRUE(slots.TryTake(1));
  EXPECT_FALSE(slots.TryTake(0));
  EXPECT_EQ(slots.open_of(1), 3u);
}

TEST(ConnectionSlots, ZeroPercentSharesEverythingAndAHundredSharesNothing) {
  ConnectionSlots shared(6, 2, 0);
  for (int i = 0; i < 6; ++i) EXPECT_TRUE(shared.TryTake(0));
  EXPECT_FALSE(shared.TryTake(1));
  ConnectionSlots split(6, 2, 100);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(split.TryTake(0));
  EXPECT_FALSE(split.TryTake(0));
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(split.TryTake(1));
  split.Give(1);
  split.Give(1);
  EXPECT_FALSE(split.TryTake(0)) << "party 1's free slots stay party 1's";
}

TEST(ConnectionSlots, GivingBackWhatWasNotTakenChangesNothing) {
  ConnectionSlots slots(2, 2, 100);
  slots.Give(0);
  EXPECT_EQ(slots.open(), 0u);
  EXPECT_TRUE(slots.TryTake(0));
  EXPECT_FALSE(slots.TryTake(0));
}

}  // namespace
}  // namespace kvtier

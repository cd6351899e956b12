// Tests of HoldTable, the operator holds' records: expiry order and its
// one-load fast path, extending held keys, a pin landing after its
// namespace was dropped or after another hold of the key, and the gauge.
#include "daemon/engine/hold_table.h"

#include <gtest/gtest.h>

#include <vector>

namespace kvtier {
namespace {

BlockKey Key(uint64_t i) { return BlockKey{0x401d, i}; }
const NamespaceFingerprint kNs{1, 2};
const NamespaceFingerprint kOtherNs{3, 4};

using Landing = HoldTable::Landing;

TEST(HoldTableTest, ExpiredHoldsComeBackInExpiryOrderAndOnlyOnce) {
  HoldTable table;
  ASSERT_EQ(table.Record(kNs, Key(1), 11, 100, 300, 0), Landing::kRecorded);
  ASSERT_EQ(table.Record(kNs, Key(2), 12, 100, 100, 0), Landing::kRecorded);
  ASSERT_EQ(table.Record(kNs, Key(3), 13, 100, 200, 0), Landing::kRecorded);
  EXPECT_TRUE(table.TakeExpired(99).empty());
  EXPECT_EQ(table.TakeExpired(200), (std::vector<uint64_t>{12, 13})) << "an expiry at now has come";
  EXPECT_TRUE(table.TakeExpired(200).empty()) << "a lease is handed back once";
  EXPECT_EQ(table.TakeExpired(1000), (std::vector<uint64_t>{11}));
}

TEST(HoldTableTest, ExtendingSetsTheNewExpiryAndNamesTheKeysToPin) {
  HoldTable table;
  ASSERT_EQ(table.Record(kNs, Key(1), 11, 100, 100, 0), Landing::kRecorded);
  ASSERT_EQ(table.Record(kOtherNs, Key(2), 12, 100, 100, 0), Landing::kRecorded);
  const std::vector<BlockKey> keys{Key(1), Key(2), Key(3)};
  // Key(2) is held, but under another namespace: it is to pin as well.
  EXPECT_EQ(table.ExtendHeld(kNs, keys, 500), (std::vector<size_t>{1, 2}));
  EXPECT_EQ(table.TakeExpired(100), (std::vector<uint64_t>{12})) << "Key(1) was extended, Key(2) was not";
  EXPECT_EQ(table.TakeExpired(500), (std::vector<uint64_t>{11}));
}

TEST(HoldTableTest, ALandingOnAHeldKeyKeepsTheLaterExpiryAndOnePin) {
  HoldTable table;
  ASSERT_EQ(table.Record(kNs, Key(1), 11, 100, 100, 0), Landing::kRecorded);
  EXPECT_EQ(table.Record(kNs, Key(1), 21, 100, 400, 0), Landing::kAlreadyHeld);
  EXPECT_EQ(table.Record(kNs, Key(1), 22, 100, 50, 0), Landing::kAlreadyHeld);
  EXPECT_TRUE(table.TakeExpired(399).empty()) << "the later expiry, not the earlier";
  EXPECT_EQ(table.TakeExpired(400), (std::vector<uint64_t>{11})) << "the first lease stays the hold's";
}

TEST(HoldTableTest, APinLandingAfterItsNamespaceWasDroppedIsRefused) {
  HoldTable table;
  const uint64_t epoch = table.DropEpoch(kNs);
  ASSERT_EQ(table.Record(kNs, Key(1), 11, 100, 100, epoch), Landing::kRecorded);
  EXPECT_EQ(table.TakeNamespace(kNs), (std::vector<uint64_t>{11}));
  EXPECT_EQ(table.Record(kNs, Key(2), 12, 100, 100, epoch), Landing::kNamespaceDropped);
  EXPECT_EQ(table.Record(kOtherNs, Key(3), 13, 100, 100, table.DropEpoch(kOtherNs)), Landing::kRecorded)
      << "another namespace's holds are not touched";
  EXPECT_EQ(table.Record(kNs, Key(2), 12, 100, 100, table.DropEpoch(kNs)), Landing::kRecorded)
      << "a hold begun after the drop lands";
}

TEST(HoldTableTest, TakeHandsBackOnlyKeysHeldUnderTheNamespace) {
  HoldTable table;
  ASSERT_EQ(table.Record(kNs, Key(1), 11, 100, 100, 0), Landing::kRecorded);
  ASSERT_EQ(table.Record(kOtherNs, Key(2), 12, 100, 100, 0), Landing::kRecorded);
  const std::vector<BlockKey> keys{Key(1), Key(2), Key(3)};
  EXPECT_EQ(table.Take(kNs, keys), (std::vector<uint64_t>{11, 0, 0}));
  EXPECT_EQ(table.Take(kNs, keys), (std::vector<uint64_t>{0, 0, 0})) << "Key(2) is still held, by another namespace";
  EXPECT_EQ(table.TakeExpired(100), (std::vector<uint64_t>{12}));
  EXPECT_TRUE(table.Take(kNs, keys).empty()) << "nothing held at all: nothing to hand back";
}

TEST(HoldTableTest, TheGaugeCountsHoldsInForceAndTheirBytes) {
  HoldTable table;
  ASSERT_EQ(table.Record(kNs, Key(1), 11, 100, 100, 0), Landing::kRecorded);
  ASSERT_EQ(table.Record(kNs, Key(2), 12, 250, 200, 0), Landing::kRecorded);
  HoldTable::InForce held = table.CountInForce(50);
  EXPECT_EQ(held.holds, 2);
  EXPECT_EQ(held.bytes, 350);
  held = table.CountInForce(100);
  EXPECT_EQ(held.holds, 1) << "expired but not yet taken: not in force";
  EXPECT_EQ(held.bytes, 250);
}

}  // namespace
}  // namespace kvtier

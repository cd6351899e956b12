// Tests of ResidentOrder, the blocks a level holds in its eviction
// policy's order: victims come in the policy's order with their
// namespaces, uses reorder them, a removal under another namespace is
// refused, and a key is tracked once.
#include "daemon/engine/resident_order.h"

#include <gtest/gtest.h>

#include "policy/policy_registry.h"

namespace kvtier {
namespace {

constexpr NamespaceFingerprint kNs{0x0d, 0x1};
constexpr NamespaceFingerprint kOther{0x0d, 0x2};

BlockKey Key(uint64_t i) { return BlockKey{0x4e5, i}; }

TEST(ResidentOrderTest, VictimsComeLeastRecentlyUsedFirstWithTheirNamespaces) {
  ResidentOrder order(MakeEvictionPolicy(EvictionPolicyId::kLru));
  EXPECT_TRUE(order.Insert(Key(1), kNs, 10));
  EXPECT_TRUE(order.Insert(Key(2), kOther, 20));
  EXPECT_TRUE(order.Insert(Key(3), kNs, 30));
  order.Touch(Key(1), 40);
  order.Touch(Key(9), 50);  // not tracked: ignored
  auto first = order.PopVictim();
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->key, Key(2));
  EXPECT_EQ(first->ns, kOther);
  EXPECT_FALSE(order.Contains(Key(2))) << "a victim leaves the order";
  EXPECT_EQ(order.PopVictim()->key, Key(3));
  EXPECT_EQ(order.PopVictim()->key, Key(1)) << "the touched block goes last";
  EXPECT_FALSE(order.PopVictim().has_value());
  EXPECT_EQ(order.size(), 0u);
}

TEST(ResidentOrderTest, TheOrderIsThePolicysNotAListOfItsOwn) {
  // FIFO ignores uses: the first inserted goes first even when touched.
  ResidentOrder order(MakeEvictionPolicy(EvictionPolicyId::kFifo));
  order.Insert(Key(1), kNs, 10);
  order.Insert(Key(2), kNs, 20);
  order.Touch(Key(1), 30);
  EXPECT_EQ(order.PopVictim()->key, Key(1));
}

TEST(ResidentOrderTest, AKeyIsTrackedOnceAndRemovedOnlyUnderItsNamespace) {
  ResidentOrder order(MakeEvictionPolicy(EvictionPolicyId::kLru));
  EXPECT_TRUE(order.Insert(Key(1), kNs, 10));
  EXPECT_FALSE(order.Insert(Key(1), kOther, 20)) << "already tracked: nothing changes";
  EXPECT_EQ(order.size(), 1u);
  EXPECT_FALSE(order.Remove(Key(1), &kOther));
  EXPECT_TRUE(order.Contains(Key(1)));
  EXPECT_TRUE(order.Remove(Key(1), &kNs));
  EXPECT_FALSE(order.Remove(Key(1)));
  order.Insert(Key(2), kOther, 30);
  EXPECT_TRUE(order.Remove(Key(2))) << "without a namespace, under any";
  EXPECT_FALSE(order.PopVictim().has_value());
}

}  // namespace
}  // namespace kvtier

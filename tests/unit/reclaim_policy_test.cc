// Tests of the NVMe tier's reclaim orders: what reinsertion copies forward.
#include "policy/reclaim_policy.h"

#include <gtest/gtest.h>

#include <vector>

namespace kvtier {
namespace {

BlockKey K(uint64_t i) { return BlockKey{0x7ec, i}; }

std::vector<uint64_t> Ids(const std::vector<ReclaimCandidate>& chosen) {
  std::vector<uint64_t> ids;
  for (const ReclaimCandidate& c : chosen) ids.push_back(c.key.lo);
  return ids;
}

// 1: cold; 2: read 3 times; 3: needed, never read; 4: read once; 5: needed
// and read twice.
std::vector<ReclaimCandidate> Region() {
  return {{K(1), 0, false}, {K(2), 3, false}, {K(3), 0, true}, {K(4), 1, false}, {K(5), 2, true}};
}

TEST(ReclaimPolicyTest, FifoCopiesNothing) { EXPECT_TRUE(ChooseReinsertions(Region(), ReclaimOrder::kFifo).empty()); }

TEST(ReclaimPolicyTest, LruCopiesBlocksReadMostReadFirstAndIgnoresTheQueue) {
  EXPECT_EQ(Ids(ChooseReinsertions(Region(), ReclaimOrder::kLru)), (std::vector<uint64_t>{2, 5, 4}));
}

TEST(ReclaimPolicyTest, QueueAwareCopiesNeededBlocksFirstThenRead) {
  EXPECT_EQ(Ids(ChooseReinsertions(Region(), ReclaimOrder::kQueueAware)), (std::vector<uint64_t>{5, 3, 2, 4}));
}

TEST(ReclaimPolicyTest, NamesRoundTripAndUnknownIsRefused) {
  for (ReclaimOrder o : {ReclaimOrder::kFifo, ReclaimOrder::kLru, ReclaimOrder::kQueueAware}) {
    EXPECT_EQ(ParseReclaimOrder(ReclaimOrderName(o)), o);
  }
  EXPECT_FALSE(ParseReclaimOrder("arc"));
  EXPECT_FALSE(ParseReclaimOrder(""));
}

}  // namespace
}  // namespace kvtier

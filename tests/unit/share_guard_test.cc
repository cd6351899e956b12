// Tests of the victim choice of a tier shared by tenants
// (policy/share_guard.h): reclaim may drop a block only when its owner
// holds more than its share, or when it has no owner.
#include "policy/share_guard.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace kvtier {
namespace {

constexpr uint64_t kBlock = 100;

ShareCandidate Block(uint64_t n, uint32_t owner, uint64_t share, uint64_t offset) {
  return ShareCandidate{BlockKey{n, n}, ShareOwner{owner, share}, kBlock, offset};
}

std::vector<uint64_t> Keys(const std::vector<ShareCandidate>& blocks) {
  std::vector<uint64_t> out;
  for (const auto& b : blocks) out.push_back(b.key.lo);
  return out;
}

TEST(SplitByShare, AnOwnerWithinItsShareLosesNothing) {
  // Owner 1 holds 300 of a 500 share; owner 2 holds 900 of a 200 share.
  std::vector<ShareCandidate> region{Block(1, 1, 500, 0), Block(2, 2, 200, 100), Block(3, 1, 500, 200),
                                     Block(4, 2, 200, 300)};
  ShareSplit split = SplitByShare(region, {{1, 300}, {2, 900}});
  EXPECT_EQ(Keys(split.protected_), (std::vector<uint64_t>{1, 3}));
  EXPECT_EQ(Keys(split.may_go), (std::vector<uint64_t>{2, 4}));
}

TEST(SplitByShare, AnOwnerOverItsShareLosesItsExcessOldestFirstAndNoMore) {
  // Owner 1 holds 350 of a 200 share: 150 over, so its two oldest blocks
  // here may go (350 -> 250 -> 150) and the rest stay, whatever the log order given.
  std::vector<ShareCandidate> region{Block(4, 1, 200, 400), Block(1, 1, 200, 100), Block(3, 1, 200, 300),
                                     Block(2, 1, 200, 200)};
  ShareSplit split = SplitByShare(region, {{1, 350}});
  EXPECT_EQ(Keys(split.may_go), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(Keys(split.protected_), (std::vector<uint64_t>{3, 4}));
}

TEST(SplitByShare, BlocksOfNoOwnerAlwaysMayGo) {
  std::vector<ShareCandidate> region{Block(1, 0, 0, 0), Block(2, 0, 1000, 100)};
  ShareSplit split = SplitByShare(region, {});
  EXPECT_EQ(Keys(split.may_go), (std::vector<uint64_t>{1, 2}));
  EXPECT_TRUE(split.protected_.empty());
}

TEST(SplitByShare, AnOwnerWithNoShareIsNeverProtected) {
  std::vector<ShareCandidate> region{Block(1, 3, 0, 0), Block(2, 3, 0, 100)};
  ShareSplit split = SplitByShare(region, {{3, 200}});
  EXPECT_EQ(Keys(split.may_go), (std::vector<uint64_t>{1, 2}));
}

TEST(SplitByShare, AnOwnerExactlyAtItsShareIsWithinIt) {
  std::vector<ShareCandidate> region{Block(1, 1, 200, 0), Block(2, 1, 200, 100)};
  ShareSplit split = SplitByShare(region, {{1, 200}});
  EXPECT_TRUE(split.may_go.empty());
  EXPECT_EQ(Keys(split.protected_), (std::vector<uint64_t>{1, 2}));
}

}  // namespace
}  // namespace kvtier

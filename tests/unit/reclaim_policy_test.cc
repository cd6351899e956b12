// Tests of the NVMe tier's reclaim orders: what reinsertion copies forward.
#include "policy/reclaim_policy.h"

#include <gtest/gtest.h>

#include <string>
#include <string_view>
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
  for (ReclaimOrder o : {ReclaimOrder::kFifo, ReclaimOrder::kLru, ReclaimOrder::kQueueAware, ReclaimOrder::kLru2,
                         ReclaimOrder::kS3Fifo, ReclaimOrder::kArc}) {
    EXPECT_EQ(ParseReclaimOrder(ReclaimOrderName(o)), o);
    EXPECT_NE(ReclaimOrderChoices().find(ReclaimOrderName(o)), std::string_view::npos) << ReclaimOrderName(o);
  }
  EXPECT_FALSE(ParseReclaimOrder("clock"));
  EXPECT_FALSE(ParseReclaimOrder("LRU2"));
  EXPECT_FALSE(ParseReclaimOrder(""));
}

// ReclaimPolicy: the classic orders run the eviction policy of their name
// over the tier's writes (time = block number), reads and drops.

constexpr ReclaimOrder kAllOrders[] = {ReclaimOrder::kFifo, ReclaimOrder::kLru,    ReclaimOrder::kQueueAware,
                                       ReclaimOrder::kLru2, ReclaimOrder::kS3Fifo, ReclaimOrder::kArc};

// Blocks 1..12 written at t = 1..12; the region reclaimed next holds 1..4.
// Block 1 is read twice early (t 20, 21), block 2 once late (t 39), block
// 3 twice late (t 40, 41), block 4 never. With `busy_elsewhere` blocks
// 5..12 are each read twice in between (t 22..37), else never.
std::vector<ReclaimCandidate> PlayRegion(ReclaimPolicy& policy, bool busy_elsewhere) {
  for (uint64_t i = 1; i <= 12; ++i) policy.OnWritten(K(i), i);
  policy.OnRead(K(1), 20);
  policy.OnRead(K(1), 21);
  for (uint64_t i = 5; busy_elsewhere && i <= 12; ++i) {
    policy.OnRead(K(i), 22 + 2 * (i - 5));
    policy.OnRead(K(i), 23 + 2 * (i - 5));
  }
  policy.OnRead(K(2), 39);
  policy.OnRead(K(3), 40);
  policy.OnRead(K(3), 41);
  return policy.Choose({{K(1), 2, false}, {K(2), 1, false}, {K(3), 2, false}, {K(4), 0, false}});
}

// Worked by hand from each policy's rules (docs/POLICIES.md); the policy
// evicts 4 blocks (the region's) wherever they are, and the region's
// blocks it spares are copied, the most read first.
//
// Busy elsewhere (5..12 each read twice, t 22..37):
// - lru2: used once (the write only): 4; then the oldest second-to-last
//   use: 2 (its write, t 2), 1 (t 20), 5 (t 22). Spares 3.
// - s3fifo: the small queue in write order: 1 (2 reads) to main, 2 (1
//   read) evicted, 3 to main, 4 evicted, 5..12 to main; the small queue is
//   empty, so main's head goes: 1, then 3 (their uses reset on entering
//   main). Spares nothing.
// - arc: T1 (never read) = {4}, T2 by last read: 1 (t 21), 5..12, 2 (t 39),
//   3 (t 41); p = 0, so T1's 4 goes, then T2's LRU 1, 5, 6. Spares 3, 2.
// Cold elsewhere (5..12 never read):
// - lru2: used once: 4, 5, 6, 7 go. Spares 1, 3, 2 (reads 2, 2, 1).
// - s3fifo: 1 to main, 2 evicted, 3 to main, 4, 5, 6 evicted. Spares 1, 3.
// - arc: T1 = {4..12} > p = 0: 4, 5, 6, 7 go. Spares 1, 3, 2.
TEST(ReclaimPolicyTest, EachOrderSparesWhatItsPolicyKeeps) {
  struct Case {
    ReclaimOrder order;
    std::vector<uint64_t> busy, cold;
  };
  const Case cases[] = {
      {ReclaimOrder::kFifo, {}, {}},
      {ReclaimOrder::kLru, {1, 3, 2}, {1, 3, 2}},
      {ReclaimOrder::kQueueAware, {1, 3, 2}, {1, 3, 2}},
      {ReclaimOrder::kLru2, {3}, {1, 3, 2}},
      {ReclaimOrder::kS3Fifo, {}, {1, 3}},
      {ReclaimOrder::kArc, {3, 2}, {1, 3, 2}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(ReclaimOrderName(c.order)));
    const bool classic =
        c.order == ReclaimOrder::kLru2 || c.order == ReclaimOrder::kS3Fifo || c.order == ReclaimOrder::kArc;
    ReclaimPolicy busy(c.order);
    EXPECT_EQ(Ids(PlayRegion(busy, true)), c.busy) << "busy elsewhere";
    // The policy evicted 4 of its 12 blocks.
    EXPECT_EQ(busy.tracked_blocks(), classic ? 8u : 0u);
    EXPECT_EQ(busy.spared(), classic ? static_cast<int64_t>(c.busy.size()) : 0);
    ReclaimPolicy cold(c.order);
    EXPECT_EQ(Ids(PlayRegion(cold, false)), c.cold) << "cold elsewhere";
    EXPECT_EQ(cold.tracked_blocks(), classic ? 8u : 0u);
  }
}

// A block the policy evicted while it lived in another region stays in
// the log; read again, it comes back to the policy as its key returning
// (LRU-2's history, S3-FIFO's ghost queue, ARC's B1), so the next reclaim
// of its region spares it. Blocks 1..6 written at t = 1..6, block 3 read
// twice; the first region holds 1 and 3, the second 2 and 4.
TEST(ReclaimPolicyTest, AVictimReadAgainComesBackThroughItsGhost) {
  for (ReclaimOrder order : {ReclaimOrder::kLru2, ReclaimOrder::kS3Fifo, ReclaimOrder::kArc}) {
    SCOPED_TRACE(std::string(ReclaimOrderName(order)));
    ReclaimPolicy policy(order);
    for (uint64_t i = 1; i <= 6; ++i) policy.OnWritten(K(i), i);
    policy.OnRead(K(3), 10);
    policy.OnRead(K(3), 11);
    // Two victims: 1 (in the region) and 2 (elsewhere: still in the log).
    EXPECT_EQ(Ids(policy.Choose({{K(1), 0, false}, {K(3), 2, false}})), (std::vector<uint64_t>{3}));
    policy.OnDropped(K(1));  // the region goes (1 is no longer tracked: ignored)
    EXPECT_EQ(policy.tracked_blocks(), 4u);
    policy.OnRead(K(2), 20);  // the log still holds 2
    EXPECT_EQ(policy.tracked_blocks(), 5u);
    // lru2: 2 is used twice (t 2 remembered, t 20), 4 and 5 once: they go.
    // s3fifo: 2 enters main from the ghost queue; the small queue gives 3
    // to main and evicts 4 and 5. arc: 2 is a B1 hit (p = 1, into T2);
    // T1 = {4, 5, 6} > p: 4 and 5 go.
    EXPECT_EQ(Ids(policy.Choose({{K(2), 1, false}, {K(4), 0, false}})), (std::vector<uint64_t>{2}));
  }
}

// ARC adapts: unread blocks evicted from T1 that are written again (B1
// hits) raise T1's target p, after which ARC keeps unread blocks and
// evicts the least recently read ones instead. Blocks 1..8 written at
// t = 1..8, blocks 5..8 read once (t 11..14).
TEST(ReclaimPolicyTest, ArcSparesUnreadBlocksOnceRecencyPaysOff) {
  for (bool ghost_hits : {false, true}) {
    SCOPED_TRACE(ghost_hits ? "after two B1 hits" : "no ghost hits");
    ReclaimPolicy arc(ReclaimOrder::kArc);
    for (uint64_t i = 1; i <= 8; ++i) arc.OnWritten(K(i), i);
    for (uint64_t i = 5; i <= 8; ++i) arc.OnRead(K(i), 6 + i);
    // The region {1, 2}: T1 = {1, 2, 3, 4} > p = 0, so 1 and 2 go to B1.
    EXPECT_TRUE(arc.Choose({{K(1), 0, false}, {K(2), 0, false}}).empty());
    arc.OnDropped(K(1));
    arc.OnDropped(K(2));
    if (ghost_hits) {
      arc.OnWritten(K(1), 20);  // B1 hit: p = 1, into T2
      arc.OnWritten(K(2), 21);  // B1 hit: p = 2, into T2
    }
    // The region {3, 4, 5}. No ghost hits: T1 = {3, 4} > p = 0, so 3, 4
    // and then T2's LRU 5 go. After them: |T1| = 2 = p, so T2's LRU 5, 6
    // and 7 go and the unread 3 and 4 are spared.
    const auto spared = Ids(arc.Choose({{K(3), 0, false}, {K(4), 0, false}, {K(5), 1, false}}));
    EXPECT_EQ(spared, ghost_hits ? (std::vector<uint64_t>{3, 4}) : (std::vector<uint64_t>{}));
  }
}

TEST(ReclaimPolicyTest, DropsAndRewritesKeepTheTrackedSetRight) {
  ReclaimPolicy policy(ReclaimOrder::kLru2);
  policy.OnWritten(K(1), 1);
  policy.OnWritten(K(1), 2);  // tracked already: ignored
  policy.OnWritten(K(2), 3);
  EXPECT_EQ(policy.tracked_blocks(), 2u);
  policy.OnDropped(K(1));
  policy.OnDropped(K(1));
  policy.OnDropped(K(9));  // unknown
  EXPECT_EQ(policy.tracked_blocks(), 1u);
  EXPECT_TRUE(policy.Choose({}).empty());
  EXPECT_EQ(policy.tracked_blocks(), 1u) << "an empty region evicts nothing";
  // A candidate the policy does not track (evicted already) is never copied.
  EXPECT_TRUE(policy.Choose({{K(7), 5, false}}).empty());
  EXPECT_EQ(policy.tracked_blocks(), 1u);
  for (ReclaimOrder order : {ReclaimOrder::kFifo, ReclaimOrder::kLru, ReclaimOrder::kQueueAware}) {
    ReclaimPolicy plain(order);
    plain.OnWritten(K(1), 1);
    plain.OnRead(K(1), 2);
    EXPECT_EQ(plain.tracked_blocks(), 0u);
    EXPECT_EQ(Ids(plain.Choose(Region())), Ids(ChooseReinsertions(Region(), order)));
  }
}

// The reinsertion budget: share x each client write's record, capped.
TEST(ReinsertBudgetTest, FillsWithTheShareOfWritesUpToItsCapAndPaysWholeRecords) {
  ReinsertBudget budget(0.25, 1000);
  EXPECT_TRUE(budget.enabled());
  EXPECT_FALSE(budget.Take(1)) << "empty";
  budget.OnWrite(400);  // 100
  budget.OnWrite(400);  // 200
  EXPECT_DOUBLE_EQ(budget.bytes(), 200);
  EXPECT_FALSE(budget.Take(300)) << "over what it holds: nothing taken";
  EXPECT_DOUBLE_EQ(budget.bytes(), 200);
  EXPECT_TRUE(budget.Take(150));
  EXPECT_DOUBLE_EQ(budget.bytes(), 50);
  for (int i = 0; i < 100; ++i) budget.OnWrite(400);
  EXPECT_DOUBLE_EQ(budget.bytes(), 1000) << "capped";
  EXPECT_FALSE(ReinsertBudget(0, 1000).enabled());
}

// One turn: log order first, then the policy's choice while the budget pays.
TEST(PlanReclaimTurnTest, CopiesWhatThePolicyChoosesWhileTheBudgetPaysAndEvictsTheRestInLogOrder) {
  // Offsets out of order; records of 100 bytes but 5's of 300.
  std::vector<ReclaimCandidate> region = {{K(4), 1, false, 400, 100},
                                          {K(2), 3, false, 200, 100},
                                          {K(1), 0, false, 100, 100},
                                          {K(5), 2, true, 500, 300},
                                          {K(3), 0, true, 300, 100}};
  ReclaimPolicy queue_aware(ReclaimOrder::kQueueAware);
  ReinsertBudget budget(1.0, 1'000'000);
  budget.OnWrite(250);  // pays for two 100-byte records, not 5's 300
  ReclaimTurn turn = PlanReclaimTurn(region, queue_aware, budget);
  // queue_aware's order: 5 (needed, 2 reads), 3 (needed), 2 (3 reads), 4 (1).
  // 5 does not fit (over budget), 3 and 2 do, then 4 does not.
  EXPECT_EQ(Ids(turn.reinsert), (std::vector<uint64_t>{3, 2}));
  EXPECT_EQ(turn.over_budget, 2);
  EXPECT_EQ(turn.needed, 1);
  EXPECT_EQ(Ids(turn.evict), (std::vector<uint64_t>{1, 4, 5})) << "log order";
  EXPECT_DOUBLE_EQ(budget.bytes(), 50);

  // Ties keep log order whatever order the tier listed them in.
  std::vector<ReclaimCandidate> ties = {{K(7), 1, false, 700, 100}, {K(6), 1, false, 600, 100}};
  ReclaimPolicy lru(ReclaimOrder::kLru);
  ReinsertBudget one(1.0, 1'000'000);
  one.OnWrite(100);
  ReclaimTurn tie_turn = PlanReclaimTurn(ties, lru, one);
  EXPECT_EQ(Ids(tie_turn.reinsert), (std::vector<uint64_t>{6}));
  EXPECT_EQ(Ids(tie_turn.evict), (std::vector<uint64_t>{7}));

  // Without a budget the policy is not asked and everything goes.
  ReclaimPolicy arc(ReclaimOrder::kArc);
  arc.OnWritten(K(6), 1);
  arc.OnWritten(K(7), 2);
  ReinsertBudget off(0, 1'000'000);
  ReclaimTurn none = PlanReclaimTurn(ties, arc, off);
  EXPECT_TRUE(none.reinsert.empty());
  EXPECT_EQ(Ids(none.evict), (std::vector<uint64_t>{6, 7}));
  EXPECT_EQ(arc.tracked_blocks(), 2u) << "its state did not move";
}

}  // namespace
}  // namespace kvtier

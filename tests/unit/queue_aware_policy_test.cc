// Tests of QueueAwarePolicy: each ordering rule on hand-built cases, the
// queue's effect (next use, several requests, start/finish, enqueue before
// insert), the look-ahead test, pins, rank across shards, and a randomized
// comparison against a brute-force model of the documented order.
#include "policy/queue_aware_policy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "tests/testing/policy_drain.h"

namespace kvtier {
namespace {

BlockKey K(uint64_t i) { return BlockKey{0x9a, i}; }
using ::kvtier::testing::Drain;

TEST(QueueAwarePolicyTest, UnneededBlocksGoLeastRecentlyUsedFirst) {
  QueueAwarePolicy p;
  EXPECT_FALSE(p.Victim());
  p.OnInsertKeyed(1, K(1), 0, 0, 10);
  p.OnInsertKeyed(2, K(2), 0, 0, 20);
  p.OnInsertKeyed(3, K(3), 0, 0, 30);
  EXPECT_EQ(p.size(), 3u);
  EXPECT_EQ(p.Victim()->handle, 1u);
  EXPECT_EQ(Drain(p), (std::vector<BlockHandle>{1, 2, 3}));
}

TEST(QueueAwarePolicyTest, FewerUsesGoFirstThenRecency) {
  QueueAwarePolicy p;
  p.OnInsertKeyed(1, K(1), 0, 0, 10);
  p.OnInsertKeyed(2, K(2), 0, 0, 20);
  p.OnInsertKeyed(3, K(3), 0, 0, 30);
  p.OnAccess(1, 40);  // 1 use, most recent
  p.OnAccess(2, 5);   // 1 use, but used at 5: older than 1's
  EXPECT_EQ(Drain(p), (std::vector<BlockHandle>{3, 2, 1}));
}

TEST(QueueAwarePolicyTest, APinIsAUse) {
  QueueAwarePolicy p;
  p.OnInsertKeyed(1, K(1), 0, 0, 1);
  p.OnInsertKeyed(2, K(2), 0, 0, 5);
  p.OnPin(1);
  p.OnUnpin(1, 3);  // read at 3: one use, though older than 2's insertion
  EXPECT_EQ(Drain(p), (std::vector<BlockHandle>{2, 1}));
}

TEST(QueueAwarePolicyTest, ClosedSessionsGoFirst) {
  QueueAwarePolicy p;
  p.OnInsertKeyed(1, K(1), 0, /*session=*/7, 10);
  p.OnInsertKeyed(2, K(2), 0, /*session=*/8, 20);
  p.OnInsertKeyed(3, K(3), 0, /*session=*/8, 30);
  p.OnAccess(3, 31);
  p.OnAccess(3, 32);
  p.CloseSession(8);  // 2 and 3 (even with its uses) go before 1
  p.CloseSession(99);  // unknown: nothing
  EXPECT_EQ(Drain(p), (std::vector<BlockHandle>{2, 3, 1}));
}

TEST(QueueAwarePolicyTest, ChildrenLeaveBeforeParents) {
  QueueAwarePolicy p;
  // One chain written in one go: same time, same uses.
  for (uint32_t d = 0; d < 4; ++d) p.OnInsertKeyed(10 + d, K(d), d, 0, 100);
  EXPECT_EQ(Drain(p), (std::vector<BlockHandle>{13, 12, 11, 10}));
}

TEST(QueueAwarePolicyTest, QueuedBlocksGoLastFurthestNextUseFirst) {
  QueueAwarePolicy p;
  for (uint64_t i = 1; i <= 5; ++i) p.OnInsertKeyed(i, K(i), 0, 0, i);
  const BlockKey late[] = {K(1), K(2)};
  const BlockKey soon[] = {K(3)};
  p.Enqueue(100, late, 5000);
  p.Enqueue(200, soon, 1000);
  EXPECT_EQ(p.queued_requests(), 2u);
  EXPECT_EQ(p.NextUse(1), 5000u);
  EXPECT_EQ(p.NextUse(3), 1000u);
  EXPECT_FALSE(p.NextUse(4));
  // 4 and 5 first (unneeded, LRU), then 2 and 1 (needed at 5000; the chain
  // made 2 the child), then 3.
  EXPECT_EQ(Drain(p), (std::vector<BlockHandle>{4, 5, 2, 1, 3}));
}

TEST(QueueAwarePolicyTest, TheEarliestRequestCountsAndStartOrFinishLetsGo) {
  QueueAwarePolicy p;
  p.OnInsertKeyed(1, K(1), 0, 0, 1);
  p.OnInsertKeyed(2, K(2), 0, 0, 2);
  const BlockKey both[] = {K(1), K(2)};
  const BlockKey one[] = {K(1)};
  p.Enqueue(1, both, 900);
  p.Enqueue(2, one, 100);
  EXPECT_EQ(p.NextUse(1), 100u);
  EXPECT_EQ(p.Victim()->handle, 2u) << "2 is needed later (900) than 1 (100)";
  p.Started(2);
  EXPECT_EQ(p.NextUse(1), 900u);
  p.Finished(1);
  EXPECT_FALSE(p.NextUse(1));
  EXPECT_FALSE(p.NextUse(2));
  EXPECT_EQ(p.queued_requests(), 0u);
  // Unneeded again, both as used at the latest time given (2): the deeper
  // (2, position 1 of request 1's chain) goes first. A block used later
  // still outlives them.
  p.OnInsertKeyed(3, K(3), 0, 0, 1);
  p.OnAccess(1, 5);
  EXPECT_EQ(Drain(p), (std::vector<BlockHandle>{3, 2, 1}));
  p.Finished(1);  // unknown by now: ignored
  p.Started(77);
}

TEST(QueueAwarePolicyTest, LeavingTheQueueCountsAsAUseAtTheLatestTime) {
  QueueAwarePolicy p;
  p.OnInsertKeyed(1, K(1), 0, 0, 10);
  p.OnInsertKeyed(2, K(2), 0, 0, 20);
  p.OnInsertKeyed(3, K(3), 0, 0, 30);
  const BlockKey one[] = {K(1)};
  p.Enqueue(1, one, 1000);
  p.Finished(1);  // 1 counts as used at 30, after 3 (same time, filed later)
  EXPECT_EQ(Drain(p), (std::vector<BlockHandle>{2, 3, 1}));
}

TEST(QueueAwarePolicyTest, ManyUsesCountAs255) {
  QueueAwarePolicy p;
  p.OnInsertKeyed(1, K(1), 0, 0, 1);
  p.OnInsertKeyed(2, K(2), 0, 0, 2);
  for (int i = 0; i < 300; ++i) p.OnAccess(1, 10 + i);
  for (int i = 0; i < 260; ++i) p.OnAccess(2, 400 + i);
  EXPECT_EQ(Drain(p), (std::vector<BlockHandle>{1, 2})) << "both past 255 uses: recency decides";
}

TEST(QueueAwarePolicyTest, OutOfOrderTimesAndRootFirstChainsKeepTheOrder) {
  QueueAwarePolicy p;
  // A chain written root first at one time, then one leaf first at another.
  for (uint32_t d = 0; d < 5; ++d) p.OnInsertKeyed(10 + d, K(10 + d), d, 0, 100);
  for (uint32_t d = 5; d-- > 0;) p.OnInsertKeyed(20 + d, K(20 + d), d, 0, 200);
  // Uses reported late (older than the newest time) land by time.
  p.OnInsertKeyed(30, K(30), 0, 0, 150);
  p.OnInsertKeyed(31, K(31), 7, 0, 100);
  p.OnInsertKeyed(32, K(32), 0, 0, 50);
  EXPECT_EQ(Drain(p), (std::vector<BlockHandle>{32, 31, 14, 13, 12, 11, 10, 30, 24, 23, 22, 21, 20}));
}

TEST(QueueAwarePolicyTest, ABlockLeavingTheHeadOfASameTimeRunKeepsTheOrder) {
  QueueAwarePolicy p;
  p.OnInsertKeyed(1, K(1), 0, 0, 50);
  for (uint32_t d = 0; d < 4; ++d) p.OnInsertKeyed(10 + d, K(10 + d), d, 0, 100);
  p.OnRemove(13);  // the deepest, first of the time-100 run
  p.OnInsertKeyed(15, K(15), 5, 0, 100);
  p.OnInsertKeyed(16, K(16), 1, 0, 100);
  EXPECT_EQ(Drain(p), (std::vector<BlockHandle>{1, 15, 12, 11, 16, 10}));
}

TEST(QueueAwarePolicyTest, EqualTimeAndDepthGoInTheOrderTheyWereFiled) {
  QueueAwarePolicy p;
  for (BlockHandle h = 1; h <= 3; ++h) p.OnInsertKeyed(h, K(h), 1, 0, 100);
  p.OnRemove(3);  // the last of its depth in the run
  p.OnInsertKeyed(4, K(4), 1, 0, 100);
  p.OnInsertKeyed(5, K(5), 0, 0, 100);
  EXPECT_EQ(Drain(p), (std::vector<BlockHandle>{1, 2, 4, 5}));
}

TEST(QueueAwarePolicyTest, EnqueueAgainReplacesTheRequest) {
  QueueAwarePolicy p;
  p.OnInsertKeyed(1, K(1), 0, 0, 1);
  p.OnInsertKeyed(2, K(2), 0, 0, 2);
  const BlockKey a[] = {K(1)};
  const BlockKey b[] = {K(2)};
  p.Enqueue(5, a, 300);
  p.Enqueue(5, b, 400);
  EXPECT_EQ(p.queued_requests(), 1u);
  EXPECT_FALSE(p.NextUse(1));
  EXPECT_EQ(p.NextUse(2), 400u);
}

TEST(QueueAwarePolicyTest, ABlockCachedAfterItsRequestWasQueuedIsNeededAtOnce) {
  QueueAwarePolicy p;
  const BlockKey chain[] = {K(1), K(2)};
  p.Enqueue(1, chain, 500);
  p.OnInsertKeyed(1, K(1), 0, 0, 1);
  p.OnInsertKeyed(3, K(3), 0, 0, 2);
  EXPECT_EQ(p.NextUse(1), 500u);
  EXPECT_EQ(p.Victim()->handle, 3u);
}

TEST(QueueAwarePolicyTest, QueueHintsCarryDepthAndConversation) {
  QueueAwarePolicy p;
  // Cached before any hint: depth 0, no conversation.
  p.OnInsertKeyed(1, K(1), 100);
  p.OnInsertKeyed(2, K(2), 100);
  const QueuedBlock blocks[] = {{K(1), 0}, {K(2), 1}, {K(3), 2}};
  p.OnEnqueue(7, blocks, 1000, /*session=*/42);
  // Cached after the hint: takes depth 2 and conversation 42 from it.
  p.OnInsertKeyed(3, K(3), 100);
  p.OnDequeue(7);
  // Same time and uses: deeper first.
  EXPECT_EQ(p.Victim()->handle, 3u);
  // The conversation closes: all three are of a closed session now; a
  // fourth block of no conversation goes after them.
  p.OnInsertKeyed(4, K(4), 50);
  p.OnSessionClosed(42);
  EXPECT_EQ(Drain(p), (std::vector<BlockHandle>{3, 2, 1, 4}));
}

TEST(QueueAwarePolicyTest, AReopenedConversationIsNoLongerClosed) {
  QueueAwarePolicy p;
  p.OnInsertKeyed(1, K(1), 0, /*session=*/5, 10);
  p.OnInsertKeyed(2, K(2), 0, /*session=*/6, 20);
  p.OnSessionClosed(6);
  EXPECT_EQ(p.Victim()->handle, 2u);
  p.OnSessionOpened(6);
  EXPECT_EQ(p.Victim()->handle, 1u);
}

TEST(QueueAwarePolicyTest, RecencyPoliciesIgnoreQueueHints) {
  for (auto make : {&MakeLruPolicy, &MakeFifoPolicy}) {
    auto p = make();
    p->OnInsertKeyed(1, K(1), 10);
    p->OnInsertKeyed(2, K(2), 20);
    const QueuedBlock blocks[] = {{K(1), 0}};
    p->OnEnqueue(1, blocks, 5, 3);
    p->OnSessionClosed(3);
    EXPECT_FALSE(p->NeededWithin(1, 0, 1'000'000));
    EXPECT_EQ(p->Victim()->handle, 1u) << p->name();
    p->OnDequeue(1);
  }
  EXPECT_EQ(MakeEvictionPolicy("queue_aware")->name(), "queue_aware");
  EXPECT_EQ(MakeEvictionPolicy("lru")->name(), "lru");
  EXPECT_EQ(MakeEvictionPolicy("clock"), nullptr);
}

TEST(QueueAwarePolicyTest, LookAheadWindow) {
  QueueAwarePolicy p;
  p.OnInsertKeyed(1, K(1), 0, 0, 1);
  p.OnInsert(2, 2);  // no key: never needed
  const BlockKey chain[] = {K(1)};
  p.Enqueue(1, chain, 10'000);
  EXPECT_TRUE(p.NeededWithin(1, 5'000, 6'000));
  EXPECT_FALSE(p.NeededWithin(1, 5'000, 5'000));
  EXPECT_TRUE(p.NeededWithin(1, 20'000, 1)) << "overdue counts as needed";
  EXPECT_FALSE(p.NeededWithin(2, 0, ~uint64_t{0} / 2));
  EXPECT_FALSE(p.NeededWithin(99, 0, 1000)) << "untracked";
}

TEST(QueueAwarePolicyTest, PinnedBlocksAreNeverVictims) {
  QueueAwarePolicy p;
  p.OnInsertKeyed(1, K(1), 0, 0, 1);
  p.OnInsertKeyed(2, K(2), 0, 0, 2);
  p.OnPin(1);
  p.OnPin(1);  // idempotent
  EXPECT_EQ(p.Victim()->handle, 2u);
  const BlockKey chain[] = {K(1)};
  p.Enqueue(1, chain, 50);  // a pinned block's state still changes
  p.OnPin(2);
  EXPECT_FALSE(p.Victim());
  p.OnUnpin(1, 3);
  EXPECT_EQ(p.Victim()->handle, 1u);
  EXPECT_EQ(p.NextUse(1), 50u);
  p.OnRemove(1);
  p.OnRemove(1);  // untracked: ignored
  p.OnAccess(1, 9);
  EXPECT_EQ(p.size(), 1u);
  EXPECT_FALSE(p.Victim());
}

TEST(QueueAwarePolicyTest, RankOrdersAcrossShards) {
  // Two shards' victims compare by rank the way one policy would order them.
  QueueAwarePolicy a, b;
  a.OnInsertKeyed(1, K(1), 0, 0, 5'000'000);
  b.OnInsertKeyed(2, K(2), 0, 0, 1'000'000);  // older
  EXPECT_LT(b.Victim()->rank, a.Victim()->rank);
  const BlockKey chain[] = {K(2)};
  b.Enqueue(1, chain, 9'000'000);  // needed: after any unneeded block
  EXPECT_GT(b.Victim()->rank, a.Victim()->rank);
  QueueAwarePolicy c;
  c.OnInsertKeyed(3, K(3), 0, 0, 2'000'000);
  c.Enqueue(1, std::span<const BlockKey>(), 0);  // an empty chain changes nothing
  const BlockKey later[] = {K(3)};
  c.Enqueue(2, later, 20'000'000);  // needed later than b's: goes before it
  EXPECT_LT(c.Victim()->rank, b.Victim()->rank);
  a.CloseSession(0);
  QueueAwarePolicy d;
  d.OnInsertKeyed(4, K(4), 0, 11, 9'000'000);
  d.CloseSession(11);  // closed goes before an open, older block
  EXPECT_LT(d.Victim()->rank, a.Victim()->rank);
}

// The documented order, by brute force: every block is scored afresh at
// each Victim(). Queue bookkeeping mirrors the policy's contract: a key's
// expected starts are a multiset (a chain may name a key twice), and a block
// whose last start goes counts as used at the latest time given.
struct Model {
  struct B {
    BlockKey key;
    uint32_t depth;
    uint64_t session;
    uint32_t uses = 0;
    uint64_t last = 0;
    uint64_t seq = 0;
    bool closed = false;
    bool pinned = false;
  };
  std::map<BlockHandle, B> blocks;
  std::map<uint64_t, std::pair<std::vector<BlockKey>, uint64_t>> requests;
  std::map<BlockKey, std::multiset<uint64_t>> starts;
  uint64_t latest = 0, seq = 0;

  void Touch(B& b, uint64_t now) {
    b.last = now;
    b.seq = ++seq;
    latest = std::max(latest, now);
  }
  std::optional<uint64_t> Next(const BlockKey& k) const {
    auto it = starts.find(k);
    if (it == starts.end() || it->second.empty()) return std::nullopt;
    return *it->second.begin();
  }
  void Enqueue(uint64_t id, const std::vector<BlockKey>& chain, uint64_t start) {
    auto old = requests.find(id);
    std::optional<std::pair<std::vector<BlockKey>, uint64_t>> replaced;
    if (old != requests.end()) replaced = old->second;
    requests[id] = {chain, start};
    for (size_t i = 0; i < chain.size(); ++i) {
      starts[chain[i]].insert(start);
      // A cached block takes its depth from the chain (the last position wins).
      for (auto& [h, b] : blocks) {
        if (b.key == chain[i]) b.depth = static_cast<uint32_t>(i);
      }
    }
    if (replaced) RemoveStarts(replaced->first, replaced->second);
  }
  void Dequeue(uint64_t id) {
    auto it = requests.find(id);
    if (it == requests.end()) return;
    const auto r = it->second;
    requests.erase(it);
    RemoveStarts(r.first, r.second);
  }
  void RemoveStarts(const std::vector<BlockKey>& keys, uint64_t start) {
    for (const BlockKey& k : keys) {
      auto& s = starts[k];
      s.erase(s.find(start));
      if (!s.empty()) continue;
      for (auto& [h, b] : blocks) {
        if (b.key == k && !b.pinned) Touch(b, latest);
      }
    }
  }
  std::optional<BlockHandle> Victim() const {
    using Key = std::tuple<int, int, uint32_t, uint64_t, uint32_t, uint64_t>;
    std::optional<Key> best;
    for (const auto& [h, b] : blocks) {
      if (b.pinned) continue;
      const uint32_t shallow = std::numeric_limits<uint32_t>::max() - b.depth;
      const auto next = Next(b.key);
      Key k = next ? Key{1, 0, 0, std::numeric_limits<uint64_t>::max() - *next, shallow, h}
                   : Key{0, b.closed ? 0 : 1, std::min<uint32_t>(b.uses, 255), b.last, shallow, b.seq};
      if (!best || k < *best) best = k;
    }
    if (!best) return std::nullopt;
    const Key k = *best;
    if (std::get<0>(k) == 1) return std::get<5>(k);
    for (const auto& [h, b] : blocks) {
      if (!b.pinned && b.seq == std::get<5>(k) && !Next(b.key)) return h;
    }
    return std::nullopt;
  }
};

TEST(QueueAwarePolicyTest, MatchesTheModelUnderRandomOperations) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE(seed);
    std::mt19937_64 rng(seed);
    QueueAwarePolicy p;
    Model m;
    BlockHandle next_handle = 1;
    uint64_t now = 0, next_request = 1;
    for (int step = 0; step < 4000; ++step) {
      now += rng() % 3;  // equal times too: the depth and filing tie-breaks
      // Sometimes a use reported late, older than the newest time given.
      const uint64_t use_time = rng() % 4 == 0 ? now - std::min<uint64_t>(now, rng() % 5) : now;
      const int op = static_cast<int>(rng() % 9);
      auto pick = [&]() -> std::optional<BlockHandle> {
        if (m.blocks.empty()) return std::nullopt;
        auto it = m.blocks.begin();
        std::advance(it, rng() % m.blocks.size());
        return it->first;
      };
      if (op <= 1 || m.blocks.empty()) {  // insert a block of a 40-key universe not cached yet
        const BlockKey key = K(rng() % 40);
        bool cached = false;
        for (const auto& [h, b] : m.blocks) cached = cached || b.key == key;
        if (cached) continue;
        const uint32_t depth = static_cast<uint32_t>(rng() % 4);
        const uint64_t session = rng() % 4;
        p.OnInsertKeyed(next_handle, key, depth, session, now);
        m.blocks[next_handle] = Model::B{key, depth, session};
        m.Touch(m.blocks[next_handle], now);
        ++next_handle;
      } else if (op == 2) {
        if (auto h = pick()) {
          p.OnAccess(*h, use_time);
          ++m.blocks[*h].uses;
          m.Touch(m.blocks[*h], use_time);
        }
      } else if (op == 3) {
        if (auto h = pick()) {
          if (m.blocks[*h].pinned) {
            p.OnUnpin(*h, use_time);
            m.blocks[*h].pinned = false;
            ++m.blocks[*h].uses;  // a pin is a read
            m.Touch(m.blocks[*h], use_time);
          } else {
            p.OnPin(*h);
            m.blocks[*h].pinned = true;
          }
        }
      } else if (op == 4) {
        if (auto h = pick()) {
          p.OnRemove(*h);
          m.blocks.erase(*h);
        }
      } else if (op == 5) {  // enqueue a chain (sometimes re-enqueueing an id)
        std::vector<BlockKey> chain;
        const size_t n = 1 + rng() % 6;
        for (size_t i = 0; i < n; ++i) chain.push_back(K(rng() % 40));
        const uint64_t id = rng() % 4 == 0 && next_request > 1 ? 1 + rng() % (next_request - 1) : next_request++;
        const uint64_t start = now + rng() % 1000;
        p.Enqueue(id, chain, start);
        m.Enqueue(id, chain, start);
      } else if (op == 6) {
        const uint64_t id = 1 + rng() % next_request;
        if (rng() % 2) p.Started(id);
        else p.Finished(id);
        m.Dequeue(id);
      } else if (op == 7) {
        const uint64_t session = rng() % 4;
        p.CloseSession(session);
        for (auto& [h, b] : m.blocks) {
          if (b.session == session && session != 0) b.closed = true;
        }
      } else {  // evict
        auto v = p.Victim();
        auto want = m.Victim();
        ASSERT_EQ(v.has_value(), want.has_value()) << "step " << step;
        if (v) {
          ASSERT_EQ(v->handle, *want) << "step " << step;
          p.OnRemove(v->handle);
          m.blocks.erase(v->handle);
        }
      }
      auto v = p.Victim();
      auto want = m.Victim();
      ASSERT_EQ(v.has_value(), want.has_value()) << "step " << step;
      if (v) {
        ASSERT_EQ(v->handle, *want) << "step " << step << " op " << op;
      }
      ASSERT_EQ(p.size(), m.blocks.size());
    }
  }
}

}  // namespace
}  // namespace kvtier

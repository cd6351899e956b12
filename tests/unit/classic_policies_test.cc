// Tests of the classic eviction policies LRU-2, S3-FIFO and ARC: victims
// worked out by hand on small sequences, pins, removal, rank across
// instances, and a randomized comparison of each against a simple
// reference model (vectors scanned linearly).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "policy/eviction_policy.h"
#include "tests/testing/policy_drain.h"

namespace kvtier {
namespace {

using ::kvtier::testing::Drain;
using Factory = std::unique_ptr<EvictionPolicy> (*)();

constexpr uint64_t kBand = uint64_t{1} << 63;

BlockKey Key(uint64_t i) { return BlockKey{0x5eed, i}; }

const Factory kAll[] = {MakeLru2Policy, MakeS3FifoPolicy, MakeArcPolicy};

TEST(ClassicPoliciesTest, NamesAndFactory) {
  EXPECT_EQ(MakeLru2Policy()->name(), "lru2");
  EXPECT_EQ(MakeS3FifoPolicy()->name(), "s3fifo");
  EXPECT_EQ(MakeArcPolicy()->name(), "arc");
  for (const char* name : {"lru2", "s3fifo", "arc"}) {
    auto p = MakeEvictionPolicy(name);
    ASSERT_NE(p, nullptr) << name;
    EXPECT_EQ(p->name(), name);
  }
}

TEST(ClassicPoliciesTest, EmptyAndAllPinnedHaveNoVictim) {
  for (Factory make : kAll) {
    auto p = make();
    EXPECT_FALSE(p->Victim().has_value()) << p->name();
    for (BlockHandle h = 1; h <= 3; ++h) p->OnInsertKeyed(h, Key(h), h * 10);
    p->OnAccess(2, 40);
    for (BlockHandle h = 1; h <= 3; ++h) p->OnPin(h);
    EXPECT_FALSE(p->Victim().has_value()) << p->name();
    EXPECT_EQ(p->size(), 3u) << p->name();
    p->OnUnpin(3, 50);
    ASSERT_TRUE(p->Victim().has_value()) << p->name();
    EXPECT_EQ(p->Victim()->handle, 3u) << p->name();
  }
}

TEST(ClassicPoliciesTest, RemoveOfPinnedAndUnknown) {
  for (Factory make : kAll) {
    auto p = make();
    p->OnRemove(9);  // empty, unknown: ignored
    p->OnInsertKeyed(1, Key(1), 10);
    p->OnInsertKeyed(2, Key(2), 20);
    p->OnPin(1);
    p->OnRemove(1);     // pinned: removed
    p->OnRemove(1);     // again: ignored
    p->OnRemove(77);    // unknown: ignored
    p->OnUnpin(1, 30);  // no longer tracked: ignored
    p->OnAccess(1, 30);
    p->OnPin(77);
    EXPECT_EQ(p->size(), 1u) << p->name();
    EXPECT_EQ(Drain(*p), (std::vector<BlockHandle>{2})) << p->name();
  }
}

TEST(ClassicPoliciesTest, VictimTwiceNamesTheSameBlockAndDoesNotRemove) {
  for (Factory make : kAll) {
    auto p = make();
    for (BlockHandle h = 1; h <= 6; ++h) p->OnInsertKeyed(h, Key(h), h);
    for (BlockHandle h : {1, 2, 1, 2, 4}) p->OnAccess(h, 10 + h);
    auto a = p->Victim();
    auto b = p->Victim();
    ASSERT_TRUE(a && b) << p->name();
    EXPECT_EQ(a->handle, b->handle) << p->name();
    EXPECT_EQ(a->rank, b->rank) << p->name();
    EXPECT_EQ(p->size(), 6u) << p->name();
  }
}

// ---- LRU-2 ----

TEST(Lru2PolicyTest, OnceUsedFirstThenOldestSecondToLastUse) {
  auto p = MakeLru2Policy();
  p->OnInsert(1, 10);
  p->OnInsert(2, 20);
  p->OnInsert(3, 30);
  p->OnAccess(1, 40);  // 1: uses 10, 40
  p->OnAccess(3, 50);  // 3: uses 30, 50
  p->OnAccess(1, 60);  // 1: uses 40, 60
  // 2 is used once: first, rank = its last use 20. Then 3 (second-to-last
  // use 30) before 1 (40).
  auto v = p->Victim();
  ASSERT_TRUE(v);
  EXPECT_EQ(v->handle, 2u);
  EXPECT_EQ(v->rank, 20u);
  p->OnRemove(2);
  v = p->Victim();
  ASSERT_TRUE(v);
  EXPECT_EQ(v->handle, 3u);
  EXPECT_EQ(v->rank, kBand | 30);
  EXPECT_EQ(Drain(*p), (std::vector<BlockHandle>{3, 1}));
}

TEST(Lru2PolicyTest, DiffersFromLru) {
  auto p = MakeLru2Policy();
  p->OnInsert(1, 10);
  p->OnInsert(2, 20);
  p->OnAccess(1, 30);  // 1: 10, 30
  p->OnAccess(2, 40);  // 2: 20, 40
  p->OnAccess(2, 50);  // 2: 40, 50
  p->OnAccess(1, 60);  // 1: 30, 60
  // LRU would evict 2 (last use 50 < 60); LRU-2 compares the second-to-last
  // uses: 1's 30 < 2's 40, so 1 goes.
  auto v = p->Victim();
  ASSERT_TRUE(v);
  EXPECT_EQ(v->handle, 1u);
  EXPECT_EQ(v->rank, kBand | 30);
}

TEST(Lru2PolicyTest, RemembersRemovedKeys) {
  auto p = MakeLru2Policy();
  p->OnInsertKeyed(1, Key(1), 10);
  p->OnInsertKeyed(2, Key(2), 20);
  p->OnRemove(1);                   // remembers Key(1) used at 10
  p->OnInsertKeyed(3, Key(3), 30);  // once
  p->OnInsertKeyed(4, Key(1), 40);  // Key(1) again: uses 10, 40
  p->OnInsert(5, 50);               // once
  // Once-used by last use: 2 (20), 3 (30), 5 (50); then 4 (second-to-last
  // use 10). Had Key(1) been forgotten, 4 (once, 40) would precede 5.
  EXPECT_EQ(Drain(*p), (std::vector<BlockHandle>{2, 3, 5, 4}));
}

TEST(Lru2PolicyTest, PlainInsertKeepsNoHistory) {
  auto p = MakeLru2Policy();
  p->OnInsert(1, 10);
  p->OnRemove(1);
  p->OnInsert(1, 20);  // same handle, no key: a new block, used once
  p->OnInsert(2, 30);
  EXPECT_EQ(Drain(*p), (std::vector<BlockHandle>{1, 2}));
}

TEST(Lru2PolicyTest, PinAndUnpinCountAsUses) {
  auto p = MakeLru2Policy();
  p->OnInsert(1, 10);
  p->OnInsert(2, 20);
  p->OnPin(1);
  EXPECT_EQ(p->Victim()->handle, 2u);
  p->OnAccess(1, 30);  // while pinned: uses 10, 30; stays out of the order
  EXPECT_EQ(p->Victim()->handle, 2u);
  p->OnUnpin(1, 40);  // uses 30, 40
  p->OnRemove(2);
  auto v = p->Victim();
  ASSERT_TRUE(v);
  EXPECT_EQ(v->handle, 1u);
  EXPECT_EQ(v->rank, kBand | 30);
}

// ---- S3-FIFO ----

TEST(S3FifoPolicyTest, OneUseBlocksLeaveInInsertionOrder) {
  auto p = MakeS3FifoPolicy();
  for (BlockHandle h = 1; h <= 5; ++h) p->OnInsert(h, h * 10);
  p->OnAccess(3, 60);  // one use: not enough to reach the main queue
  auto v = p->Victim();
  ASSERT_TRUE(v);
  EXPECT_EQ(v->handle, 1u);
  EXPECT_EQ(v->rank, 10u);  // small queue: the insertion time, no band
  EXPECT_EQ(Drain(*p), (std::vector<BlockHandle>{1, 2, 3, 4, 5}));
}

TEST(S3FifoPolicyTest, TwiceUsedMovesToMain) {
  auto p = MakeS3FifoPolicy();
  p->OnInsert(1, 10);
  p->OnInsert(2, 20);
  p->OnInsert(3, 30);
  p->OnAccess(1, 40);
  p->OnAccess(1, 50);  // 1: two uses
  p->OnAccess(2, 60);  // 2: one use
  // Victim: M is empty, so S: its head 1 has two uses and moves to M (uses
  // reset, entered at the latest time, 60); S = [2, 3] holds 2 of 3 blocks
  // (>= 10%): head 2 has one use, the victim.
  auto v = p->Victim();
  ASSERT_TRUE(v);
  EXPECT_EQ(v->handle, 2u);
  EXPECT_EQ(v->rank, 20u);
  p->OnRemove(2);
  // S = [3] is 1 of 2 blocks: 3 goes; then M's 1, ranked in the main band.
  EXPECT_EQ(p->Victim()->handle, 3u);
  p->OnRemove(3);
  v = p->Victim();
  ASSERT_TRUE(v);
  EXPECT_EQ(v->handle, 1u);
  EXPECT_EQ(v->rank, kBand | 60);
}

TEST(S3FifoPolicyTest, SmallQueueUnderTenPercentEvictsMain) {
  auto p = MakeS3FifoPolicy();
  for (BlockHandle h = 1; h <= 10; ++h) p->OnInsert(h, h);
  uint64_t now = 10;
  for (BlockHandle h = 1; h <= 10; ++h) {
    p->OnAccess(h, ++now);
    p->OnAccess(h, ++now);
  }
  p->OnInsert(11, 40);
  // Victim: S = [1..10, 11], M empty. 1..10 have two uses and move to M in
  // turn; then S = [11] is 1 of 11 blocks (< 10%), so M's head 1 (no uses
  // left) is the victim. After it goes, S is 1 of 10 (10%): 11 goes, then
  // M's 2..10.
  auto v = p->Victim();
  ASSERT_TRUE(v);
  EXPECT_EQ(v->handle, 1u);
  EXPECT_EQ(v->rank, kBand | 40);
  EXPECT_EQ(Drain(*p), (std::vector<BlockHandle>{1, 11, 2, 3, 4, 5, 6, 7, 8, 9, 10}));
}

TEST(S3FifoPolicyTest, MainGivesUsedBlocksAnotherRound) {
  auto p = MakeS3FifoPolicy();
  p->OnInsert(1, 10);
  p->OnInsert(2, 20);
  p->OnInsert(3, 30);
  for (uint64_t t : {40, 50}) p->OnAccess(1, t);
  for (uint64_t t : {60, 70}) p->OnAccess(2, t);
  // 1 and 2 move to M (entered at 70); 3 (no use) is the victim.
  EXPECT_EQ(p->Victim()->handle, 3u);
  p->OnRemove(3);
  p->OnAccess(1, 80);  // M = [1 (one use), 2]
  // M's head 1 has a use: back to the tail with none (entered at 80); 2 goes.
  auto v = p->Victim();
  ASSERT_TRUE(v);
  EXPECT_EQ(v->handle, 2u);
  EXPECT_EQ(v->rank, kBand | 70);
  p->OnRemove(2);
  v = p->Victim();
  ASSERT_TRUE(v);
  EXPECT_EQ(v->handle, 1u);
  EXPECT_EQ(v->rank, kBand | 80);
}

TEST(S3FifoPolicyTest, GhostHitGoesToMain) {
  auto p = MakeS3FifoPolicy();
  for (BlockHandle h = 1; h <= 3; ++h) p->OnInsertKeyed(h, Key(h), h * 10);
  EXPECT_EQ(p->Victim()->handle, 1u);
  p->OnRemove(1);                   // evicted from S: Key(1) goes to G
  p->OnInsertKeyed(4, Key(1), 40);  // found in G: into M
  p->OnInsert(5, 50);               // into S
  // S = [2, 3, 5], M = [4]: S holds >= 10% until it is empty, so 2, 3, 5,
  // then 4. Without the ghost 4 would precede 5.
  EXPECT_EQ(Drain(*p), (std::vector<BlockHandle>{2, 3, 5, 4}));
}

TEST(S3FifoPolicyTest, UnpinReturnsToItsPlaceWithAUse) {
  auto p = MakeS3FifoPolicy();
  p->OnInsert(1, 10);
  p->OnInsert(2, 20);
  p->OnInsert(3, 30);
  p->OnPin(1);
  EXPECT_EQ(p->Victim()->handle, 2u);
  p->OnUnpin(1, 40);  // one use; back at S's head
  auto v = p->Victim();
  ASSERT_TRUE(v);
  EXPECT_EQ(v->handle, 1u);
  EXPECT_EQ(v->rank, 10u);
  p->OnPin(1);
  p->OnUnpin(1, 50);  // two uses: moves to M when it reaches the head
  EXPECT_EQ(Drain(*p), (std::vector<BlockHandle>{2, 3, 1}));
}

// ---- ARC ----

TEST(ArcPolicyTest, UnusedBlocksLeaveInLruOrder) {
  auto p = MakeArcPolicy();
  for (BlockHandle h = 1; h <= 3; ++h) p->OnInsert(h, h * 10);
  auto v = p->Victim();
  ASSERT_TRUE(v);
  EXPECT_EQ(v->handle, 1u);
  EXPECT_EQ(v->rank, 10u);
  EXPECT_EQ(Drain(*p), (std::vector<BlockHandle>{1, 2, 3}));
}

TEST(ArcPolicyTest, UsedBlocksMoveToT2) {
  auto p = MakeArcPolicy();
  for (BlockHandle h = 1; h <= 3; ++h) p->OnInsert(h, h * 10);
  p->OnAccess(1, 40);  // T1 = [2, 3], T2 = [1]; p = 0 < |T1|: T1 first
  auto v = p->Victim();
  ASSERT_TRUE(v);
  EXPECT_EQ(v->handle, 2u);
  EXPECT_EQ(Drain(*p), (std::vector<BlockHandle>{2, 3, 1}));
}

TEST(ArcPolicyTest, GhostHitsAdaptTheTarget) {
  auto p = MakeArcPolicy();
  for (BlockHandle h = 1; h <= 4; ++h) p->OnInsertKeyed(h, Key(h), h * 10);
  p->OnAccess(3, 50);
  p->OnAccess(4, 60);  // T1 = [1, 2], T2 = [3, 4], p = 0
  EXPECT_EQ(p->Victim()->handle, 1u);
  p->OnRemove(1);  // B1 = [Key(1)]
  // Key(1) in B1: p += max(|B2| / |B1|, 1) = 1; the block enters T2.
  p->OnInsertKeyed(5, Key(1), 70);
  // T1 = [2] (|T1| = 1 = p, last hit not in B2): T2's LRU 3 goes.
  auto v = p->Victim();
  ASSERT_TRUE(v);
  EXPECT_EQ(v->handle, 3u);
  EXPECT_EQ(v->rank, kBand | 50);
  p->OnRemove(3);  // B2 = [Key(3)]
  // Key(3) in B2: p -= max(|B1| / |B2|, 1) = 1, so p = 0 < |T1|: T1's 2.
  p->OnInsertKeyed(6, Key(3), 80);
  v = p->Victim();
  ASSERT_TRUE(v);
  EXPECT_EQ(v->handle, 2u);
  EXPECT_EQ(v->rank, 20u);
  // Then T2 in LRU order: 4 (60), 5 (70), 6 (80).
  EXPECT_EQ(Drain(*p), (std::vector<BlockHandle>{2, 4, 5, 6}));
}

// ARC's target p as a share of its blocks: what the expert panel carries
// from a shadow to a rebuilt instance. The other classics learn nothing.
TEST(ArcPolicyTest, TheLearnedTargetIsReadAndSetAsAShare) {
  auto p = MakeArcPolicy();
  for (BlockHandle h = 1; h <= 4; ++h) p->OnInsertKeyed(h, Key(h), h * 10);
  p->OnAccess(3, 50);
  p->OnAccess(4, 60);  // T1 = [1, 2], T2 = [3, 4], p = 0
  EXPECT_EQ(p->learned_share(), 0.0);
  EXPECT_EQ(p->Victim()->handle, 1u);
  p->SetLearnedShare(0.5);  // p = 2 = |T1|: T2 first
  EXPECT_EQ(p->learned_share(), 0.5);
  EXPECT_EQ(p->Victim()->handle, 3u);
  p->SetLearnedShare(7);  // clamped to c
  EXPECT_EQ(p->learned_share(), 1.0);
  p->OnRemove(1);  // p = 4 over 3 blocks: still a share of at most 1
  EXPECT_EQ(p->learned_share(), 1.0);
  // B1 = [Key(1)]; a ghost hit raises p, capped at c = 4 (the new block counts)
  p->OnInsertKeyed(5, Key(1), 70);
  EXPECT_EQ(p->learned_share(), 1.0);
  p->SetLearnedShare(std::numeric_limits<double>::quiet_NaN());
  EXPECT_EQ(p->learned_share(), 0.0);
  for (std::string_view name : {"lru", "fifo", "lru2", "s3fifo"}) {
    auto other = MakeEvictionPolicy(name);
    other->OnInsert(1, 10);
    other->SetLearnedShare(0.5);
    EXPECT_FALSE(other->learned_share().has_value()) << name;
  }
}

TEST(ArcPolicyTest, UnpinMovesToT2) {
  auto p = MakeArcPolicy();
  for (BlockHandle h = 1; h <= 3; ++h) p->OnInsert(h, h * 10);
  p->OnPin(1);
  EXPECT_EQ(p->Victim()->handle, 2u);
  p->OnUnpin(1, 40);  // a use: T2 = [1]
  EXPECT_EQ(Drain(*p), (std::vector<BlockHandle>{2, 3, 1}));
}

// ---- Rank across instances ----

// Two instances given disjoint blocks: the lower rank must be the block one
// instance given all of them would evict first.
void ExpectRankOrder(Factory make, const std::function<void(EvictionPolicy&, EvictionPolicy&)>& feed_a_b,
                     BlockHandle first) {
  auto a = make(), b = make(), both = make();
  feed_a_b(*a, *b);
  feed_a_b(*both, *both);
  auto va = a->Victim(), vb = b->Victim(), v = both->Victim();
  ASSERT_TRUE(va && vb && v) << a->name();
  EXPECT_EQ(v->handle, first) << a->name();
  EXPECT_EQ((va->rank < vb->rank ? va : vb)->handle, first) << a->name();
}

TEST(ClassicPoliciesTest, RankIsComparableAcrossInstances) {
  // All: two once-inserted blocks, the older goes first.
  for (Factory make : kAll) {
    ExpectRankOrder(
        make,
        [](EvictionPolicy& a, EvictionPolicy& b) {
          a.OnInsert(1, 10);
          b.OnInsert(2, 20);
        },
        1);
  }
  // LRU-2 and ARC: a block used twice (older) after one used once (newer).
  for (Factory make : {MakeLru2Policy, MakeArcPolicy}) {
    ExpectRankOrder(
        make,
        [](EvictionPolicy& a, EvictionPolicy& b) {
          a.OnInsert(1, 10);
          a.OnAccess(1, 15);
          b.OnInsert(2, 20);
        },
        2);
  }
  // LRU-2: two twice-used blocks by second-to-last use, not last use.
  ExpectRankOrder(
      MakeLru2Policy,
      [](EvictionPolicy& a, EvictionPolicy& b) {
        a.OnInsert(1, 10);
        b.OnInsert(2, 20);
        b.OnAccess(2, 30);
        a.OnAccess(1, 40);
      },
      1);
  // S3-FIFO: a main-queue block after a small-queue one.
  ExpectRankOrder(
      MakeS3FifoPolicy,
      [](EvictionPolicy& a, EvictionPolicy& b) {
        a.OnInsert(1, 10);
        a.OnAccess(1, 11);
        a.OnAccess(1, 12);  // moves to M when named
        b.OnInsert(2, 20);
      },
      2);
}

// ---- Randomized comparison with reference models ----

struct RefBlock {
  BlockHandle h = 0;
  bool has_key = false;
  BlockKey key;
  bool pinned = false;
  // LRU-2
  uint64_t last = 0, lseq = 0, prev = 0, pseq = 0;
  bool twice = false;
  // S3-FIFO, ARC
  uint64_t entered = 0;
  int uses = 0;
  bool main = false;  // S3-FIFO: in M; ARC: in T2
};

// The models keep every block in one vector per queue, pinned ones in place.
class RefModel {
 public:
  virtual ~RefModel() = default;
  virtual void Insert(BlockHandle h, const BlockKey* key, uint64_t now) = 0;
  virtual void Use(BlockHandle h, uint64_t now) = 0;
  virtual void Remove(BlockHandle h) = 0;
  virtual std::optional<EvictionCandidate> Victim() = 0;
  virtual size_t size() const = 0;
  void Pin(BlockHandle h) {
    if (RefBlock* b = Find(h)) b->pinned = true;
  }
  // The latest time given, tracked or not (S3-FIFO stamps moves with it).
  virtual void Time(uint64_t now) {}
  void Access(BlockHandle h, uint64_t now) {
    Time(now);
    if (Find(h)) Use(h, now);
  }
  void Unpin(BlockHandle h, uint64_t now) {
    Time(now);
    RefBlock* b = Find(h);
    if (b == nullptr || !b->pinned) return;
    b->pinned = false;
    Use(h, now);
  }
  virtual RefBlock* Find(BlockHandle h) = 0;

 protected:
  static RefBlock* In(std::vector<RefBlock>& v, BlockHandle h) {
    for (RefBlock& b : v)
      if (b.h == h) return &b;
    return nullptr;
  }
  static RefBlock Take(std::vector<RefBlock>& v, BlockHandle h) {
    auto it = std::find_if(v.begin(), v.end(), [h](const RefBlock& b) { return b.h == h; });
    RefBlock b = *it;
    v.erase(it);
    return b;
  }
  static bool Forget(std::vector<BlockKey>& ghosts, const BlockKey& k) {
    auto it = std::find(ghosts.begin(), ghosts.end(), k);
    if (it == ghosts.end()) return false;
    ghosts.erase(it);
    return true;
  }
  uint64_t seq_ = 0;
};

class RefLru2 final : public RefModel {
 public:
  void Insert(BlockHandle h, const BlockKey* key, uint64_t now) override {
    RefBlock b;
    b.h = h;
    if (key) {
      b.has_key = true;
      b.key = *key;
      for (size_t i = 0; i < hist_.size(); ++i) {
        if (hist_[i].key == *key) {
          b.twice = true;
          b.prev = hist_[i].last;
          b.pseq = hist_[i].lseq;
          hist_.erase(hist_.begin() + i);
          break;
        }
      }
    }
    b.last = now;
    b.lseq = ++seq_;
    v_.push_back(b);
    Trim();
  }
  void Use(BlockHandle h, uint64_t now) override {
    RefBlock* b = In(v_, h);
    if (!b) return;
    b->prev = b->last;
    b->pseq = b->lseq;
    b->twice = true;
    b->last = now;
    b->lseq = ++seq_;
  }
  void Remove(BlockHandle h) override {
    if (!In(v_, h)) return;
    RefBlock b = Take(v_, h);
    if (b.has_key) hist_.push_back(b);
    Trim();
  }
  std::optional<EvictionCandidate> Victim() override {
    const RefBlock* best = nullptr;
    auto key = [](const RefBlock& b) {
      return b.twice ? std::tuple(1, b.prev, b.pseq) : std::tuple(0, b.last, b.lseq);
    };
    for (const RefBlock& b : v_) {
      if (!b.pinned && (!best || key(b) < key(*best))) best = &b;
    }
    if (!best) return std::nullopt;
    return EvictionCandidate{best->h, best->twice ? (kBand | best->prev) : best->last};
  }
  size_t size() const override { return v_.size(); }
  RefBlock* Find(BlockHandle h) override { return In(v_, h); }

 private:
  void Trim() {
    while (hist_.size() > 8 * v_.size()) hist_.erase(hist_.begin());
  }
  std::vector<RefBlock> v_;
  std::vector<RefBlock> hist_;  // removed keyed blocks, oldest removal first
};

class RefS3Fifo final : public RefModel {
 public:
  void Insert(BlockHandle h, const BlockKey* key, uint64_t now) override {
    now_ = std::max(now_, now);
    RefBlock b;
    b.h = h;
    b.entered = now;
    if (key) {
      b.has_key = true;
      b.key = *key;
      b.main = Forget(ghosts_, *key);
    }
    (b.main ? m_ : s_).push_back(b);
    Trim();
  }
  void Time(uint64_t now) override { now_ = std::max(now_, now); }
  void Use(BlockHandle h, uint64_t now) override {
    if (RefBlock* b = Find(h)) b->uses = std::min(b->uses + 1, 3);
  }
  void Remove(BlockHandle h) override {
    if (In(s_, h)) {
      RefBlock b = Take(s_, h);
      if (b.has_key) ghosts_.push_back(b.key);
    } else if (In(m_, h)) {
      Take(m_, h);
    }
    Trim();
  }
  std::optional<EvictionCandidate> Victim() override {
    for (;;) {
      RefBlock* s = FirstUnpinned(s_);
      RefBlock* m = FirstUnpinned(m_);
      if (s && (!m || 10 * s_.size() >= size())) {
        if (s->uses < 2) return EvictionCandidate{s->h, s->entered};
        RefBlock b = Take(s_, s->h);
        b.uses = 0;
        b.entered = now_;
        m_.push_back(b);
        continue;
      }
      if (!m) return std::nullopt;
      if (m->uses == 0) return EvictionCandidate{m->h, kBand | m->entered};
      RefBlock b = Take(m_, m->h);
      b.uses--;
      b.entered = now_;
      m_.push_back(b);
    }
  }
  size_t size() const override { return s_.size() + m_.size(); }
  RefBlock* Find(BlockHandle h) override {
    RefBlock* b = In(s_, h);
    return b ? b : In(m_, h);
  }

 private:
  static RefBlock* FirstUnpinned(std::vector<RefBlock>& v) {
    for (RefBlock& b : v)
      if (!b.pinned) return &b;
    return nullptr;
  }
  void Trim() {
    while (ghosts_.size() > size() - size() / 10) ghosts_.erase(ghosts_.begin());
  }
  std::vector<RefBlock> s_, m_;
  std::vector<BlockKey> ghosts_;  // oldest first
  uint64_t now_ = 0;
};

class RefArc final : public RefModel {
 public:
  void Insert(BlockHandle h, const BlockKey* key, uint64_t now) override {
    RefBlock b;
    b.h = h;
    b.entered = now;
    const size_t c = size() + 1;
    last_b2_ = false;
    if (key) {
      b.has_key = true;
      b.key = *key;
      const size_t n1 = b1_.size(), n2 = b2_.size();
      if (Forget(b1_, *key)) {
        p_ = std::min(c, p_ + std::max<size_t>(n2 / n1, 1));
        b.main = true;
      } else if (Forget(b2_, *key)) {
        const size_t d = std::max<size_t>(n1 / n2, 1);
        p_ = p_ > d ? p_ - d : 0;
        last_b2_ = true;
        b.main = true;
      }
    }
    (b.main ? t2_ : t1_).push_back(b);
    p_ = std::min(p_, c);
    Trim(c);
  }
  void Use(BlockHandle h, uint64_t now) override {
    RefBlock* f = Find(h);
    if (!f) return;
    RefBlock b = Take(f->main ? t2_ : t1_, h);
    b.main = true;
    b.entered = now;
    t2_.push_back(b);
  }
  void Remove(BlockHandle h) override {
    RefBlock* f = Find(h);
    if (!f) return;
    const size_t c = size();
    RefBlock b = Take(f->main ? t2_ : t1_, h);
    if (b.has_key) (b.main ? b2_ : b1_).push_back(b.key);
    Trim(c);
  }
  std::optional<EvictionCandidate> Victim() override {
    const bool t1_first = t1_.size() > p_ || (t1_.size() == p_ && !t1_.empty() && last_b2_);
    std::vector<RefBlock>* order[2] = {&t1_, &t2_};
    if (!t1_first) std::swap(order[0], order[1]);
    for (auto* l : order) {
      for (const RefBlock& b : *l) {
        if (!b.pinned) return EvictionCandidate{b.h, (b.main ? kBand : 0) | b.entered};
      }
    }
    return std::nullopt;
  }
  size_t size() const override { return t1_.size() + t2_.size(); }
  RefBlock* Find(BlockHandle h) override {
    RefBlock* b = In(t1_, h);
    return b ? b : In(t2_, h);
  }

 private:
  void Trim(size_t c) {
    while (!b1_.empty() && t1_.size() + b1_.size() > c) b1_.erase(b1_.begin());
    while (size() + b1_.size() + b2_.size() > 2 * c) {
      auto& l = b2_.empty() ? b1_ : b2_;
      l.erase(l.begin());
    }
  }
  std::vector<RefBlock> t1_, t2_;
  std::vector<BlockKey> b1_, b2_;  // LRU first
  size_t p_ = 0;
  bool last_b2_ = false;
};

void RunRandomized(Factory make, RefModel& ref, uint32_t seed) {
  auto policy = make();
  SCOPED_TRACE(::testing::Message() << policy->name() << " seed=" << seed);
  std::printf("%s randomized seed=%u\n", std::string(policy->name()).c_str(), seed);
  std::mt19937 rng(seed);
  constexpr uint64_t kKeys = 40;
  std::map<uint64_t, BlockHandle> tracked;  // key index -> handle
  BlockHandle next_handle = 1;
  uint64_t now = 1000;
  auto random_tracked = [&]() -> std::optional<std::pair<uint64_t, BlockHandle>> {
    if (tracked.empty()) return std::nullopt;
    auto it = tracked.begin();
    std::advance(it, rng() % tracked.size());
    return *it;
  };
  for (int op = 0; op < 20'000; ++op) {
    SCOPED_TRACE(::testing::Message() << "op " << op);
    now += rng() % 3;  // equal times happen
    switch (rng() % 8) {
      case 0:
      case 1: {  // insert a key not tracked, keyed most of the time
        const uint64_t k = rng() % kKeys;
        if (tracked.count(k)) break;
        const BlockHandle h = next_handle++;
        tracked[k] = h;
        const BlockKey key = Key(k);
        if (rng() % 4 != 0) {
          policy->OnInsertKeyed(h, key, now);
          ref.Insert(h, &key, now);
        } else {
          policy->OnInsert(h, now);
          ref.Insert(h, nullptr, now);
        }
        break;
      }
      case 2: {  // access, sometimes of an untracked handle
        BlockHandle h = next_handle + 5;
        if (auto t = random_tracked(); t && rng() % 8 != 0) h = t->second;
        policy->OnAccess(h, now);
        ref.Access(h, now);
        break;
      }
      case 3:
        if (auto t = random_tracked()) {
          policy->OnPin(t->second);
          ref.Pin(t->second);
        }
        break;
      case 4:
        if (auto t = random_tracked()) {
          policy->OnUnpin(t->second, now);
          ref.Unpin(t->second, now);
        }
        break;
      case 5:  // remove, pinned or not
        if (auto t = random_tracked(); t && rng() % 3 == 0) {
          policy->OnRemove(t->second);
          ref.Remove(t->second);
          tracked.erase(t->first);
        }
        break;
      default:  // evict as the engine does, once or more
        for (int n = 1 + rng() % 2; n > 0; --n) {
          auto v = ref.Victim();
          if (!v) break;
          policy->OnRemove(v->handle);
          ref.Remove(v->handle);
          std::erase_if(tracked, [&](const auto& kv) { return kv.second == v->handle; });
        }
        break;
    }
    ASSERT_EQ(policy->size(), ref.size());
    auto got = policy->Victim();
    auto want = ref.Victim();
    ASSERT_EQ(got.has_value(), want.has_value());
    if (want) {
      ASSERT_EQ(got->handle, want->handle);
      ASSERT_EQ(got->rank, want->rank);
      ASSERT_FALSE(ref.Find(got->handle)->pinned);
    }
  }
}

uint32_t Seed() {
  if (const char* env = std::getenv("KVTIER_TEST_SEED")) {
    return static_cast<uint32_t>(std::strtoul(env, nullptr, 10));
  }
  return 20240611;
}

TEST(Lru2PolicyTest, RandomizedAgainstReference) {
  RefLru2 ref;
  RunRandomized(MakeLru2Policy, ref, Seed());
}

TEST(S3FifoPolicyTest, RandomizedAgainstReference) {
  RefS3Fifo ref;
  RunRandomized(MakeS3FifoPolicy, ref, Seed());
}

TEST(ArcPolicyTest, RandomizedAgainstReference) {
  RefArc ref;
  RunRandomized(MakeArcPolicy, ref, Seed());
}

}  // namespace
}  // namespace kvtier

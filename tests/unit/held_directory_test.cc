// HeldDirectory (subscriber/held_directory.h), what the peer tier is told
// of which node holds which blocks, over fake event streams: a node is
// known once its snapshot applied, follows its stream (stored, removed,
// the remote tier ignored), drops what it held and is retried after an
// error, stays under its bound, starts again from a snapshot when its
// endpoints change, and is forgotten when unfollowed.
#include <gtest/gtest.h>

#include <chrono>
#include <deque>
#include <map>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "daemon/events/event_encoding.h"
#include "subscriber/held_directory.h"

namespace kvtier::events {
namespace {

using namespace std::chrono_literals;

const NamespaceFingerprint kNs{7, 7};

BlockKey Key(uint64_t n) { return BlockKey{0, n}; }

std::string Batch(BlockEventKind kind, Tier tier, std::vector<uint64_t> keys) {
  std::vector<BlockEvent> events;
  for (uint64_t k : keys) events.push_back(BlockEvent{kind, tier, kNs, Key(k), std::nullopt});
  return EncodeEventBatch(1.0, events, EventFormat::kMap, nullptr);
}

// One node's events as the fake serves them; the test changes it under `mu`.
struct FakeNode {
  Mutex mu;
  std::vector<SeqPayload> snapshot GUARDED_BY(mu);
  std::deque<SeqPayload> stream GUARDED_BY(mu);
  std::map<int64_t, std::string> kept GUARDED_BY(mu);  // for replays
  bool refuse GUARDED_BY(mu) = false;                  // snapshots fail
  bool unsubscribed GUARDED_BY(mu) = false;            // the publisher refuses the subscription
  int snapshots GUARDED_BY(mu) = 0;
  int opens GUARDED_BY(mu) = 0;

  void Publish(int64_t seq, std::string payload) {
    MutexLock lock(mu);
    kept[seq] = payload;
    stream.push_back({seq, std::move(payload)});
  }
};

class FakeStream final : public EventStream {
 public:
  explicit FakeStream(FakeNode& node) : node_(node) {}
  Result<std::optional<SeqPayload>> Next(std::chrono::milliseconds) override {
    MutexLock lock(node_.mu);
    if (node_.stream.empty()) return std::optional<SeqPayload>();
    SeqPayload next = std::move(node_.stream.front());
    node_.stream.pop_front();
    return std::optional<SeqPayload>(std::move(next));
  }
  Status WaitSubscribed(std::chrono::milliseconds) override {
    MutexLock lock(node_.mu);
    return node_.unsubscribed ? Unavailable("refused this subscriber") : Status::Ok();
  }
  Result<std::vector<SeqPayload>> Replay(uint64_t start) override {
    MutexLock lock(node_.mu);
    std::vector<SeqPayload> out;
    for (const auto& [seq, payload] : node_.kept) {
      if (seq >= static_cast<int64_t>(start)) out.push_back({seq, payload});
    }
    return out;
  }
  Result<std::vector<SeqPayload>> Snapshot() override {
    MutexLock lock(node_.mu);
    ++node_.snapshots;
    if (node_.refuse) return Unavailable("no answer");
    return node_.snapshot;
  }

 private:
  FakeNode& node_;
};

class HeldDirectoryTest : public ::testing::Test {
 protected:
  std::unique_ptr<HeldDirectory> Start(size_t max_blocks = 1000) {
    HeldDirectoryOptions o;
    o.max_blocks = max_blocks;
    o.retry = 50ms;
    o.open = [this](const std::string& endpoint, const std::string&) -> Result<std::unique_ptr<EventStream>> {
      FakeNode& node = endpoint == "tcp://b:1" ? b_ : endpoint == "tcp://c:1" ? c_ : a_;
      MutexLock lock(node.mu);
      ++node.opens;
      return std::unique_ptr<EventStream>(new FakeStream(node));
    };
    return std::make_unique<HeldDirectory>(std::move(o));
  }

  // Waits (at most 5 s) until Leading(name, keys) answers `want`.
  static bool WaitFor(const HeldDirectory& d, const std::string& name, std::vector<uint64_t> keys,
                      std::optional<size_t> want) {
    std::vector<BlockKey> k;
    for (uint64_t n : keys) k.push_back(Key(n));
    for (auto until = std::chrono::steady_clock::now() + 5s; std::chrono::steady_clock::now() < until;) {
      if (d.Leading(name, k) == want) return true;
      std::this_thread::sleep_for(1ms);
    }
    return false;
  }

  static int64_t Counter(const HeldDirectory& d, std::string_view name) {
    CounterCollector c;
    d.VisitCounters(c);
    for (const auto& [n, v] : c.counters()) {
      if (n == name) return v;
    }
    ADD_FAILURE() << "no counter " << name;
    return -1;
  }

  FakeNode a_, b_, c_;
};

TEST_F(HeldDirectoryTest, ANodeIsKnownFromItsSnapshotAndFollowsItsStream) {
  {
    MutexLock lock(a_.mu);
    a_.snapshot = {{4, Batch(BlockEventKind::kStored, Tier::kHost, {1, 2})}};
  }
  auto d = Start();
  EXPECT_EQ(d->Leading("a", std::vector<BlockKey>{Key(1)}), std::nullopt);  // not followed
  d->Follow("a", "tcp://a:1", "tcp://a:2");
  ASSERT_TRUE(WaitFor(*d, "a", {1, 2, 3}, 2));
  EXPECT_TRUE(WaitFor(*d, "a", {2}, 1));
  EXPECT_TRUE(WaitFor(*d, "a", {3, 1}, 0));  // from the first key only

  a_.Publish(5, Batch(BlockEventKind::kStored, Tier::kNvme, {3}));
  EXPECT_TRUE(WaitFor(*d, "a", {1, 2, 3}, 3));
  // Host and NVMe both hold 1: removed from the host, it is still held.
  a_.Publish(6, Batch(BlockEventKind::kStored, Tier::kNvme, {1}));
  a_.Publish(7, Batch(BlockEventKind::kRemoved, Tier::kHost, {1}));
  a_.Publish(8, Batch(BlockEventKind::kStored, Tier::kHost, {9}));
  ASSERT_TRUE(WaitFor(*d, "a", {9}, 1));
  EXPECT_TRUE(WaitFor(*d, "a", {1, 2, 3}, 3));
  a_.Publish(9, Batch(BlockEventKind::kRemoved, Tier::kNvme, {1}));
  EXPECT_TRUE(WaitFor(*d, "a", {1, 2, 3}, 0));
  // The remote tier is every node's: it says nothing of this one.
  a_.Publish(10, Batch(BlockEventKind::kStored, Tier::kRemote, {1}));
  a_.Publish(11, Batch(BlockEventKind::kStored, Tier::kHost, {10}));
  ASSERT_TRUE(WaitFor(*d, "a", {10}, 1));
  EXPECT_EQ(d->Leading("a", std::vector<BlockKey>{Key(1)}), 0u);
  EXPECT_EQ(Counter(*d, "peer_events.known"), 1);
  EXPECT_EQ(Counter(*d, "peer_events.blocks"), 4);  // 2, 3, 9, 10
  EXPECT_EQ(Counter(*d, "peer_events.syncs"), 1);

  d->Unfollow("a");
  EXPECT_EQ(d->Leading("a", std::vector<BlockKey>{Key(2)}), std::nullopt);
  EXPECT_EQ(Counter(*d, "peer_events.blocks"), 0);
  EXPECT_EQ(Counter(*d, "peer_events.followed"), 0);
}

TEST_F(HeldDirectoryTest, AGapIsReplayedAndOneTheBufferLostMakesTheNodeUnknownUntilItSyncsAgain) {
  {
    MutexLock lock(a_.mu);
    a_.snapshot = {{0, Batch(BlockEventKind::kStored, Tier::kHost, {1})}};
  }
  auto d = Start();
  d->Follow("a", "tcp://a:1", "tcp://a:2");
  ASSERT_TRUE(WaitFor(*d, "a", {1}, 1));
  {
    MutexLock lock(a_.mu);
    a_.kept[1] = Batch(BlockEventKind::kStored, Tier::kHost, {2});  // published, not received
  }
  a_.Publish(2, Batch(BlockEventKind::kStored, Tier::kHost, {3}));
  ASSERT_TRUE(WaitFor(*d, "a", {1, 2, 3}, 3));

  {
    MutexLock lock(a_.mu);
    a_.kept.clear();  // the replay buffer no longer has 3
    a_.refuse = true;
  }
  a_.Publish(4, Batch(BlockEventKind::kStored, Tier::kHost, {5}));
  ASSERT_TRUE(WaitFor(*d, "a", {1}, std::nullopt));  // what it held is dropped, not half-trusted
  EXPECT_GE(Counter(*d, "peer_events.failures"), 1);
  EXPECT_EQ(Counter(*d, "peer_events.blocks"), 0);
  {
    MutexLock lock(a_.mu);
    a_.refuse = false;
    a_.snapshot = {{4, Batch(BlockEventKind::kStored, Tier::kHost, {1, 2, 3, 5})}};
  }
  ASSERT_TRUE(WaitFor(*d, "a", {1, 2, 3, 5}, 4));  // subscribed again after retry
  MutexLock lock(a_.mu);
  EXPECT_GE(a_.opens, 2);
}

TEST_F(HeldDirectoryTest, TheBoundIsOverAllNodesAndANodePastItIsUnknown) {
  {
    MutexLock lock(a_.mu);
    a_.snapshot = {{0, Batch(BlockEventKind::kStored, Tier::kHost, {1, 2, 3})}};
  }
  {
    MutexLock lock(b_.mu);
    b_.snapshot = {{0, Batch(BlockEventKind::kStored, Tier::kHost, {11, 12})}};
  }
  auto d = Start(/*max_blocks=*/5);
  d->Follow("a", "tcp://a:1", "tcp://a:2");
  ASSERT_TRUE(WaitFor(*d, "a", {1, 2, 3}, 3));
  d->Follow("b", "tcp://b:1", "tcp://b:2");
  ASSERT_TRUE(WaitFor(*d, "b", {11, 12}, 2));
  EXPECT_EQ(Counter(*d, "peer_events.blocks"), 5);
  {
    MutexLock lock(b_.mu);
    b_.snapshot = {{1, Batch(BlockEventKind::kStored, Tier::kHost, {11, 12, 13})}};
  }
  b_.Publish(1, Batch(BlockEventKind::kStored, Tier::kHost, {13}));  // a sixth entry
  ASSERT_TRUE(WaitFor(*d, "b", {11}, std::nullopt));
  EXPECT_GE(Counter(*d, "peer_events.overflows"), 1);  // and again at each retry, while a holds its 3
  EXPECT_EQ(d->Leading("a", std::vector<BlockKey>{Key(1), Key(2), Key(3)}), 3u);  // the others keep theirs
  // Room again (a evicted two): b syncs again from its snapshot.
  a_.Publish(1, Batch(BlockEventKind::kRemoved, Tier::kHost, {2, 3}));
  ASSERT_TRUE(WaitFor(*d, "a", {1, 2}, 1));
  EXPECT_TRUE(WaitFor(*d, "b", {11, 12, 13}, 3));
  EXPECT_LE(Counter(*d, "peer_events.blocks"), 5);
}

TEST_F(HeldDirectoryTest, NewEndpointsStartAgainFromASnapshot) {
  {
    MutexLock lock(a_.mu);
    a_.snapshot = {{0, Batch(BlockEventKind::kStored, Tier::kHost, {1})}};
  }
  {
    MutexLock lock(c_.mu);
    c_.snapshot = {{0, Batch(BlockEventKind::kStored, Tier::kHost, {21})}};
  }
  auto d = Start();
  d->Follow("x", "tcp://a:1", "tcp://a:2");
  ASSERT_TRUE(WaitFor(*d, "x", {1}, 1));
  d->Follow("x", "tcp://a:1", "tcp://a:2");  // the same: nothing changes
  d->Follow("x", "tcp://c:1", "tcp://c:2");  // reconnected elsewhere
  ASSERT_TRUE(WaitFor(*d, "x", {21}, 1));
  EXPECT_EQ(d->Leading("x", std::vector<BlockKey>{Key(1)}), 0u);
  MutexLock lock(a_.mu);
  EXPECT_EQ(a_.snapshots, 1);
}

// A node unfollowed and followed again (its connection failed and came
// back) starts again from a new snapshot, whatever the old session did.
TEST_F(HeldDirectoryTest, ANodeFollowedAgainAfterUnfollowSyncsAfresh) {
  {
    MutexLock lock(a_.mu);
    a_.snapshot = {{0, Batch(BlockEventKind::kStored, Tier::kHost, {1, 2})}};
  }
  auto d = Start();
  d->Follow("a", "tcp://a:1", "tcp://a:2");
  ASSERT_TRUE(WaitFor(*d, "a", {1, 2}, 2));
  for (int round = 0; round < 20; ++round) {
    d->Unfollow("a");
    {
      MutexLock lock(a_.mu);
      a_.snapshot = {{0, Batch(BlockEventKind::kStored, Tier::kHost, {100 + static_cast<uint64_t>(round)})}};
    }
    d->Follow("a", "tcp://a:1", "tcp://a:2");
    ASSERT_TRUE(WaitFor(*d, "a", {100 + static_cast<uint64_t>(round)}, 1)) << "round " << round;
    EXPECT_EQ(d->Leading("a", std::vector<BlockKey>{Key(1)}), 0u);
  }
  EXPECT_EQ(Counter(*d, "peer_events.blocks"), 1);
}

// A publisher that refuses the subscription (its events.max_subscribers)
// leaves the node unknown, not known with a snapshot that never moves.
TEST_F(HeldDirectoryTest, ARefusedSubscriptionLeavesTheNodeUnknown) {
  {
    MutexLock lock(a_.mu);
    a_.snapshot = {{0, Batch(BlockEventKind::kStored, Tier::kHost, {1})}};
    a_.unsubscribed = true;
  }
  auto d = Start();
  d->Follow("a", "tcp://a:1", "tcp://a:2");
  for (auto until = std::chrono::steady_clock::now() + 5s;
       Counter(*d, "peer_events.failures") < 2 && std::chrono::steady_clock::now() < until;) {
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_GE(Counter(*d, "peer_events.failures"), 2);  // tried again after retry
  EXPECT_EQ(d->Leading("a", std::vector<BlockKey>{Key(1)}), std::nullopt);
  {
    MutexLock lock(a_.mu);
    EXPECT_EQ(a_.snapshots, 0) << "a snapshot was asked before the subscription was taken";
    a_.unsubscribed = false;
  }
  EXPECT_TRUE(WaitFor(*d, "a", {1}, 1));
}

}  // namespace
}  // namespace kvtier::events

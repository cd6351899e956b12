// Tests of RequestQueue, the engine's queue hints: each request's chain
// reaches exactly the shards' policies its keys belong to (and leaves them
// on replace, remove and a closed connection), the keys are counted for
// the tiers below, the earliest requests come first, and every bound
// refuses without changing anything.
#include "daemon/engine/request_queue.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <set>
#include <vector>

#include "daemon/engine/block_index.h"
#include "tests/testing/test_daemon.h"

namespace kvtier {
namespace {

constexpr NamespaceFingerprint kNs{0x9e, 0x11};
constexpr size_t kShards = 4;

BlockKey Key(uint64_t i) { return BlockKey{0x9a11, i}; }

std::vector<BlockKey> Chain(uint64_t first, size_t n) {
  std::vector<BlockKey> chain;
  for (size_t i = 0; i < n; ++i) chain.push_back(Key(first + i));
  return chain;
}

// An LRU that records the queue hints it is told: request id -> blocks.
class RecordingPolicy final : public EvictionPolicy {
 public:
  explicit RecordingPolicy(std::map<uint64_t, std::vector<QueuedBlock>>& queued, std::set<uint64_t>& opened)
      : lru_(MakeLruPolicy()), queued_(queued), opened_(opened) {}
  void OnInsert(BlockHandle h, uint64_t now_us) override { lru_->OnInsert(h, now_us); }
  void OnAccess(BlockHandle h, uint64_t now_us) override { lru_->OnAccess(h, now_us); }
  void OnPin(BlockHandle h) override { lru_->OnPin(h); }
  void OnUnpin(BlockHandle h, uint64_t now_us) override { lru_->OnUnpin(h, now_us); }
  void OnRemove(BlockHandle h) override { lru_->OnRemove(h); }
  std::optional<EvictionCandidate> Victim() const override { return lru_->Victim(); }
  size_t size() const override { return lru_->size(); }
  std::string_view name() const override { return "recording"; }
  void OnEnqueue(uint64_t request, std::span<const QueuedBlock> blocks, uint64_t, uint64_t) override {
    queued_[request].assign(blocks.begin(), blocks.end());
  }
  void OnDequeue(uint64_t request) override { queued_.erase(request); }
  void OnSessionOpened(uint64_t session) override { opened_.insert(session); }
  void OnSessionClosed(uint64_t session) override { opened_.erase(session); }

 private:
  std::unique_ptr<EvictionPolicy> lru_;
  std::map<uint64_t, std::vector<QueuedBlock>>& queued_;
  std::set<uint64_t>& opened_;
};

class RequestQueueTest : public ::testing::Test {
 protected:
  void SetUp() override {
    host_ = ::kvtier::testing::OpenTestHostTier(1 << 20);
    ASSERT_NE(host_, nullptr);
    for (size_t s = 0; s < kShards; ++s) {
      shards_.push_back(
          std::make_unique<BlockIndex>(s, 1, std::make_unique<RecordingPolicy>(queued_[s], opened_[s]), *host_));
    }
  }

  RequestQueue Make(size_t max_requests = 16, size_t per_connection = 8, size_t keys_per_connection = 64) {
    return RequestQueue(shards_, RequestQueue::Limits{max_requests, per_connection, keys_per_connection});
  }

  // Every (shard, key, depth) the shards' policies hold for `request` id.
  std::set<std::tuple<size_t, BlockKey, uint32_t>> Told(uint64_t id) const {
    std::set<std::tuple<size_t, BlockKey, uint32_t>> told;
    for (size_t s = 0; s < kShards; ++s) {
      auto it = queued_[s].find(id);
      if (it == queued_[s].end()) continue;
      for (const QueuedBlock& b : it->second) told.emplace(s, b.key, b.depth);
    }
    return told;
  }
  static std::set<std::tuple<size_t, BlockKey, uint32_t>> Expected(const std::vector<BlockKey>& chain) {
    std::set<std::tuple<size_t, BlockKey, uint32_t>> want;
    for (uint32_t i = 0; i < chain.size(); ++i) want.emplace(ShardIndexOf(chain[i], kShards), chain[i], i);
    return want;
  }
  size_t QueuedAnywhere() const {
    size_t n = 0;
    for (const auto& q : queued_) n += q.size();
    return n;
  }

  std::unique_ptr<HostTier> host_;
  std::map<uint64_t, std::vector<QueuedBlock>> queued_[kShards];
  std::set<uint64_t> opened_[kShards];
  std::vector<std::unique_ptr<BlockIndex>> shards_;
};

TEST_F(RequestQueueTest, AChainReachesTheShardsItsKeysBelongToWithTheirDepths) {
  RequestQueue queue = Make();
  const std::vector<BlockKey> chain = Chain(0, 12);
  ASSERT_TRUE(queue.Add(1, kNs, 100, chain, 5'000, 0).ok());
  const std::vector<RequestQueue::Queued> earliest = queue.Earliest(8);
  ASSERT_EQ(earliest.size(), 1u);
  EXPECT_EQ(Told(earliest[0].id), Expected(chain));
  for (const BlockKey& k : chain) EXPECT_TRUE(queue.Needs(k));
  EXPECT_FALSE(queue.Needs(Key(99)));
}

TEST_F(RequestQueueTest, ReplacingARequestLeavesTheShardsOnlyItsOldChainTouched) {
  RequestQueue queue = Make();
  const std::vector<BlockKey> old_chain = Chain(0, 12);
  const std::vector<BlockKey> new_chain = Chain(50, 2);
  ASSERT_TRUE(queue.Add(1, kNs, 100, old_chain, 5'000, 0).ok());
  const uint64_t id = queue.Earliest(1).at(0).id;
  ASSERT_TRUE(queue.Add(1, kNs, 100, new_chain, 6'000, 0).ok());
  EXPECT_EQ(queue.size(), 1u);
  EXPECT_EQ(queue.Earliest(1).at(0).id, id) << "a replaced request keeps its id";
  EXPECT_EQ(Told(id), Expected(new_chain));
  for (const BlockKey& k : old_chain) EXPECT_FALSE(queue.Needs(k)) << k.ToHex();
  for (const BlockKey& k : new_chain) EXPECT_TRUE(queue.Needs(k));
}

TEST_F(RequestQueueTest, RemoveAndAClosedConnectionForgetEverything) {
  RequestQueue queue = Make();
  ASSERT_TRUE(queue.Add(1, kNs, 1, Chain(0, 6), 1'000, 0).ok());
  ASSERT_TRUE(queue.Add(1, kNs, 2, Chain(10, 6), 2'000, 0).ok());
  ASSERT_TRUE(queue.Add(2, kNs, 1, Chain(20, 6), 3'000, 0).ok());
  EXPECT_EQ(queue.Remove(1, 7).code(), StatusCode::kNotFound);
  EXPECT_EQ(queue.Remove(3, 1).code(), StatusCode::kNotFound) << "request ids are the connection's own";
  ASSERT_TRUE(queue.Remove(1, 1).ok());
  EXPECT_EQ(queue.Remove(1, 1).code(), StatusCode::kNotFound);
  queue.DropConnection(1);
  EXPECT_EQ(queue.size(), 1u);
  for (const BlockKey& k : Chain(0, 20)) EXPECT_FALSE(queue.Needs(k));
  ASSERT_EQ(queue.Earliest(8).size(), 1u);
  EXPECT_EQ(Told(queue.Earliest(1)[0].id), Expected(Chain(20, 6)));
  queue.DropConnection(2);
  EXPECT_EQ(QueuedAnywhere(), 0u);
  EXPECT_EQ(queue.size(), 0u);
}

TEST_F(RequestQueueTest, TheEarliestComeFirstAndTiesGoByArrival) {
  RequestQueue queue = Make();
  ASSERT_TRUE(queue.Add(1, kNs, 1, Chain(0, 1), 3'000, 0).ok());
  ASSERT_TRUE(queue.Add(1, kNs, 2, Chain(1, 1), 1'000, 0).ok());
  ASSERT_TRUE(queue.Add(2, kNs, 1, Chain(2, 1), 3'000, 0).ok());
  ASSERT_TRUE(queue.Add(2, kNs, 2, Chain(3, 1), 2'000, 0).ok());
  const std::vector<RequestQueue::Queued> two = queue.Earliest(2);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0].chain, Chain(1, 1));
  EXPECT_EQ(two[1].chain, Chain(3, 1));
  const std::vector<RequestQueue::Queued> all = queue.Earliest(99);
  ASSERT_EQ(all.size(), 4u);
  EXPECT_EQ(all[2].chain, Chain(0, 1)) << "of two starting together, the first queued first";
  EXPECT_EQ(all[3].chain, Chain(2, 1));
  EXPECT_EQ(all[3].ns, kNs);
  EXPECT_EQ(all[3].start_us, 3'000u);
}

TEST_F(RequestQueueTest, EachBoundRefusesWithoutChangingAnything) {
  RequestQueue queue = Make(/*max_requests=*/3, /*per_connection=*/2, /*keys_per_connection=*/10);
  ASSERT_TRUE(queue.Add(1, kNs, 1, Chain(0, 4), 1'000, 0).ok());
  ASSERT_TRUE(queue.Add(1, kNs, 2, Chain(10, 4), 1'000, 0).ok());
  // A third request of connection 1: over its share of requests.
  EXPECT_EQ(queue.Add(1, kNs, 3, Chain(20, 1), 1'000, 0).code(), StatusCode::kBusy);
  // Replacing one with a longer chain: over its share of keys; the old
  // chain stays.
  EXPECT_EQ(queue.Add(1, kNs, 2, Chain(30, 7), 1'000, 0).code(), StatusCode::kBusy);
  for (const BlockKey& k : Chain(10, 4)) EXPECT_TRUE(queue.Needs(k));
  for (const BlockKey& k : Chain(30, 7)) EXPECT_FALSE(queue.Needs(k));
  // Within its keys, a replace is fine (6 + 4 = 10).
  EXPECT_TRUE(queue.Add(1, kNs, 2, Chain(30, 6), 1'000, 0).ok());
  ASSERT_TRUE(queue.Add(2, kNs, 1, Chain(40, 1), 1'000, 0).ok());
  // A fourth request in all: over the total.
  EXPECT_EQ(queue.Add(3, kNs, 1, Chain(50, 1), 1'000, 0).code(), StatusCode::kBusy);
  EXPECT_EQ(queue.size(), 3u);
  EXPECT_FALSE(queue.Needs(Key(50)));
  size_t told = 0;
  for (const RequestQueue::Queued& q : queue.Earliest(9)) told += Told(q.id).size();
  EXPECT_EQ(told, 4u + 6u + 1u) << "a refused request reached no policy";
  // Room comes back when a request leaves.
  ASSERT_TRUE(queue.Remove(1, 1).ok());
  EXPECT_TRUE(queue.Add(1, kNs, 3, Chain(20, 4), 1'000, 0).ok());
}

TEST_F(RequestQueueTest, ConversationsReachEveryShard) {
  RequestQueue queue = Make();
  queue.SetConversation(42, true);
  for (size_t s = 0; s < kShards; ++s) EXPECT_EQ(opened_[s].count(42), 1u) << s;
  queue.SetConversation(42, false);
  for (size_t s = 0; s < kShards; ++s) EXPECT_EQ(opened_[s].count(42), 0u) << s;
}

}  // namespace
}  // namespace kvtier

// Queue hints end to end (Client::Enqueue / Started / Finished, conversation
// open/close) against a daemon evicting with queue_aware: a queued prefix
// stays cached under pressure, and every bad hint gets a clear error while
// the connection keeps serving.
#include <gtest/gtest.h>

#include <chrono>
#include <vector>

#include "tests/testing/test_daemon.h"

namespace kvtier::testing {
namespace {

constexpr size_t kBlock = 1 << 20;

TestDaemonOptions EightBlockArena(EvictionPolicyId eviction) {
  TestDaemonOptions o;
  o.arena_bytes = 8 * kBlock;
  o.eviction = eviction;
  return o;
}

TEST(QueueHints, AQueuedPrefixStaysCachedUnderPressure) {
  TestDaemon daemon(EightBlockArena(EvictionPolicyId::kQueueAware));
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  auto keys = TestKeys(TestNamespace(), 24, 11);
  for (size_t i = 0; i < 8; ++i) ASSERT_TRUE(client->Put(0, keys[i], Block(keys[i], kBlock)).ok()) << i;
  const std::vector<BlockKey> prefix(keys.begin(), keys.begin() + 3);
  const auto start = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  ASSERT_TRUE(client->Enqueue(1, 0, prefix, start, /*session=*/77).ok());
  for (size_t i = 8; i < 24; ++i) ASSERT_TRUE(client->Put(0, keys[i], Block(keys[i], kBlock)).ok()) << i;

  auto hit = client->Lookup(0, prefix);
  ASSERT_TRUE(hit.ok()) << hit.status().ToString();
  EXPECT_EQ(hit->prefix_blocks, 3u) << "the queued request's prefix survived two arenas of puts";
  std::vector<std::byte> dst(kBlock);
  for (const BlockKey& k : prefix) {
    auto got = client->Get(0, k, dst);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_TRUE(CheckBlockBytes(k, 0, dst));
  }
  for (size_t i = 3; i < 8; ++i) {
    auto miss = client->Lookup(0, {&keys[i], 1});
    ASSERT_TRUE(miss.ok());
    EXPECT_EQ(miss->prefix_blocks, 0u) << "evicted: " << i;
  }
  EXPECT_TRUE(client->Started(1).ok());
  EXPECT_EQ(StatsCounter(*client, "engine.enqueues"), 1);
  EXPECT_EQ(StatsCounter(*client, "engine.dequeues"), 1);
}

TEST(QueueHints, LruDaemonAcceptsHintsAndIgnoresThem) {
  TestDaemon daemon(EightBlockArena(EvictionPolicyId::kLru));
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  auto keys = TestKeys(TestNamespace(), 24, 12);
  for (size_t i = 0; i < 8; ++i) ASSERT_TRUE(client->Put(0, keys[i], Block(keys[i], kBlock)).ok());
  const std::vector<BlockKey> prefix(keys.begin(), keys.begin() + 3);
  ASSERT_TRUE(client->Enqueue(1, 0, prefix, std::chrono::steady_clock::now()).ok());
  for (size_t i = 8; i < 24; ++i) ASSERT_TRUE(client->Put(0, keys[i], Block(keys[i], kBlock)).ok());
  auto hit = client->Lookup(0, prefix);
  ASSERT_TRUE(hit.ok());
  EXPECT_EQ(hit->prefix_blocks, 0u);
  EXPECT_TRUE(client->Finished(1).ok());
}

TEST(QueueHints, BadHintsAreClearErrorsAndTheConnectionGoesOn) {
  TestDaemon daemon(EightBlockArena(EvictionPolicyId::kQueueAware));
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  auto keys = TestKeys(TestNamespace(), 2, 13);
  const auto now = std::chrono::steady_clock::now();

  Status s = client->Enqueue(1, 0, {}, now);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("at least one key"), std::string::npos) << s.message();
  EXPECT_EQ(client->Enqueue(1, /*ns=*/5, keys, now).code(), StatusCode::kInvalidArgument) << "unregistered namespace";
  EXPECT_EQ(client->Started(42).code(), StatusCode::kNotFound);
  EXPECT_EQ(client->Finished(42).code(), StatusCode::kNotFound);
  EXPECT_EQ(client->CloseSession(0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(client->OpenSession(0).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(client->OpenSession(9).ok());
  EXPECT_TRUE(client->CloseSession(9).ok());
  // A start in the past means now; finishing twice is NotFound the second time.
  ASSERT_TRUE(client->Enqueue(2, 0, keys, now - std::chrono::hours(1)).ok());
  EXPECT_TRUE(client->Finished(2).ok());
  EXPECT_EQ(client->Finished(2).code(), StatusCode::kNotFound);
  // Another connection's ids are its own.
  auto other = daemon.Connect();
  ASSERT_NE(other, nullptr);
  ASSERT_TRUE(client->Enqueue(3, 0, keys, now).ok());
  EXPECT_EQ(other->Started(3).code(), StatusCode::kNotFound);
  EXPECT_TRUE(client->Started(3).ok());
  // Still serving.
  ASSERT_TRUE(client->Put(0, keys[0], Block(keys[0], 4096)).ok());
  auto hit = client->Lookup(0, keys);
  ASSERT_TRUE(hit.ok());
  EXPECT_EQ(hit->prefix_blocks, 1u);
}

}  // namespace
}  // namespace kvtier::testing

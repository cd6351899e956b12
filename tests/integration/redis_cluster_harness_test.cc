// The RedisCluster harness (support/redis_cluster.h) itself, against
// real redis-server processes: it forms a 3-master, 3-replica cluster, moves
// a slot with its keys (whole and step by step), survives a master crash by
// failover, and goes down cleanly. Skipped where Redis is not installed.
#include <gtest/gtest.h>

#include <algorithm>

#include "tests/testing/redis_cluster.h"

namespace kvtier::testing {
namespace {

// A live master other than `port`.
int OtherMaster(const RedisCluster& cluster, int port) {
  for (int master : cluster.Masters()) {
    if (master != port) return master;
  }
  return -1;
}

TEST(RedisClusterHarness, FormsMovesSlotsFailsOverAndStops) {
  if (const std::string why = RedisCluster::Unavailable(); !why.empty()) GTEST_SKIP() << why;
  auto started = RedisCluster::Start(RedisCluster::Options{});
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  RedisCluster& cluster = **started;

  EXPECT_EQ(cluster.Ports().size(), 6u);
  EXPECT_EQ(cluster.Seeds().size(), 6u);
  EXPECT_EQ(cluster.Seeds()[0], "127.0.0.1:" + std::to_string(cluster.Ports()[0]));
  ASSERT_EQ(cluster.Masters().size(), 3u);
  auto policy = cluster.Cli(cluster.Ports()[0], {"CONFIG", "GET", "maxmemory-policy"});
  ASSERT_TRUE(policy.ok()) << policy.status().ToString();
  EXPECT_EQ(*policy, "maxmemory-policy\nallkeys-lru");

  // A cluster client (redis-cli -c) reads what it wrote.
  ASSERT_TRUE(cluster.ClusterCli({"SET", "harness-key", "v1"}).ok());
  auto read = cluster.ClusterCli({"GET", "harness-key"});
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(*read, "v1");

  // The whole slot moves; the old master now redirects.
  const int slot = cluster.SlotOf("harness-key");
  ASSERT_GE(slot, 0);
  const int from = cluster.MasterOf(slot);
  const int to = OtherMaster(cluster, from);
  ASSERT_GT(from, 0);
  ASSERT_GT(to, 0);
  ASSERT_TRUE(cluster.MoveSlot(slot, to).ok());
  EXPECT_EQ(cluster.MasterOf(slot), to);
  read = cluster.Cli(to, {"GET", "harness-key"});
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(*read, "v1");
  read = cluster.Cli(from, {"GET", "harness-key"});
  ASSERT_FALSE(read.ok());
  EXPECT_NE(read.status().message().find("MOVED " + std::to_string(slot)), std::string::npos)
      << read.status().ToString();

  // Step by step: after BeginMove and one key moved, the source answers ASK
  // for the moved key and still serves the other.
  const int tag_slot = cluster.SlotOf("{harness-tag}");
  ASSERT_TRUE(cluster.ClusterCli({"SET", "{harness-tag}a", "a"}).ok());
  ASSERT_TRUE(cluster.ClusterCli({"SET", "{harness-tag}b", "b"}).ok());
  const int tag_from = cluster.MasterOf(tag_slot);
  const int tag_to = OtherMaster(cluster, tag_from);
  ASSERT_TRUE(cluster.BeginMove(tag_slot, tag_to).ok());
  EXPECT_FALSE(cluster.BeginMove(tag_slot, tag_to).ok());  // already moving
  auto moved = cluster.MoveKeys(tag_slot, 1);
  ASSERT_TRUE(moved.ok()) << moved.status().ToString();
  EXPECT_EQ(*moved, 1);
  int asked = 0;
  for (const std::string key : {"{harness-tag}a", "{harness-tag}b"}) {
    read = cluster.Cli(tag_from, {"GET", key});
    if (!read.ok()) {
      EXPECT_NE(read.status().message().find("ASK " + std::to_string(tag_slot)), std::string::npos)
          << read.status().ToString();
      ++asked;
    }
    read = cluster.ClusterCli({"GET", key});
    ASSERT_TRUE(read.ok()) << read.status().ToString();
    EXPECT_EQ(*read, key.substr(key.size() - 1));
  }
  EXPECT_EQ(asked, 1);
  ASSERT_TRUE(cluster.FinishMove(tag_slot).ok());
  EXPECT_EQ(cluster.MasterOf(tag_slot), tag_to);
  read = cluster.Cli(tag_to, {"MGET", "{harness-tag}a", "{harness-tag}b"});
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(*read, "a\nb");

  // A crashed master fails over to its replica, which has the key once the
  // write reached it (WAIT).
  ASSERT_TRUE(cluster.Cli(to, {"WAIT", "1", "2000"}).ok());
  ASSERT_TRUE(cluster.Kill(to).ok());
  EXPECT_FALSE(cluster.Kill(to).ok());  // no longer running
  auto served = cluster.WaitForSlotServed(slot, std::chrono::seconds(10));
  ASSERT_TRUE(served.ok()) << served.status().ToString();
  EXPECT_NE(*served, to);
  EXPECT_EQ(cluster.MasterOf(slot), *served);
  EXPECT_EQ(cluster.Masters().size(), 3u);
  read = cluster.ClusterCli({"GET", "harness-key"});
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(*read, "v1");

  // The whole cluster down.
  ASSERT_TRUE(cluster.KillAll().ok());
  EXPECT_TRUE(cluster.Masters().empty());
  EXPECT_EQ(cluster.MasterOf(slot), -1);
  for (int port : cluster.Ports()) EXPECT_FALSE(cluster.Cli(port, {"PING"}).ok()) << port;
  EXPECT_FALSE(cluster.ClusterCli({"GET", "harness-key"}).ok());
}

// A node that cannot start is an error carrying its log, not a hang.
TEST(RedisClusterHarness, StartFailureCarriesTheNodeLog) {
  if (const std::string why = RedisCluster::Unavailable(); !why.empty()) GTEST_SKIP() << why;
  RedisCluster::Options two_masters;
  two_masters.masters = 2;
  EXPECT_EQ(RedisCluster::Start(two_masters).status().code(), StatusCode::kInvalidArgument);
  RedisCluster::Options bad_memory;
  bad_memory.maxmemory = "plenty";
  const auto started = RedisCluster::Start(bad_memory);
  ASSERT_FALSE(started.ok());
  EXPECT_NE(started.status().message().find("exited at start"), std::string::npos) << started.status().ToString();
  EXPECT_NE(started.status().message().find("maxmemory"), std::string::npos) << started.status().ToString();
}

}  // namespace
}  // namespace kvtier::testing

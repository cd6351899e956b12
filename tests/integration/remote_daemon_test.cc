// kvtierd with a remote tier ([remote] nodes = a real 6-node Redis Cluster,
// tests/testing/redis_cluster.h), as operators run it: two daemons given
// the same cluster serve each other's blocks (one puts, its arena pushes
// them down to the cluster, the other looks them up and gets them from
// there), and a daemon whose cluster goes down keeps serving its own tiers.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "tests/testing/daemon_clients.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/redis_cluster.h"
#include "tests/testing/test_daemon.h"

namespace kvtier::testing {
namespace {

using namespace std::chrono_literals;

constexpr size_t kBlockBytes = 64 << 10;  // TestNamespace()'s whole block

// The cluster secret file every daemon of a test shares (the first to
// start creates it), as every node of a deployment has the same copy.
std::string KeyFile() {
  static const std::string dir = MakeTempDir();
  return dir + "/remote.key";
}

std::string RemoteToml(const std::string& nodes, const std::string& key_file = KeyFile()) {
  return "[host]\ncapacity_bytes = \"8MiB\"\nlock_memory = \"off\"\n"
         "[remote]\nnodes = \"" +
         nodes +
         "\"\nadmission = \"all\"\nretry_ms = 200\nprobe_timeout_ms = 500\n"
         "key_file = \"" +
         key_file + "\"\n[metrics]\nenabled = false\n";
}

using RemoteDaemon = RedisClusterTest;

TEST_F(RemoteDaemon, TwoDaemonsOnOneClusterServeEachOthersBlocks) {
  const std::string nodes = cluster_->Seeds().front();
  DaemonProcess a(KVTIERD_PATH, "", RemoteToml(nodes));
  DaemonProcess b(KVTIERD_PATH, "", RemoteToml(nodes));
  ASSERT_TRUE(a.running());
  ASSERT_TRUE(b.running());
  auto put = ConnectTo(a);
  auto get = ConnectTo(b);
  ASSERT_NE(put, nullptr);
  ASSERT_NE(get, nullptr);
  // 300 blocks through an 8 MiB arena: the oldest are pushed down to the
  // cluster (remote.admission = all).
  const auto keys = TestKeys(TestNamespace(), 300, 31);
  for (const auto& k : keys) {
    Status s = put->Put(0, k, Block(k, kBlockBytes));
    ASSERT_TRUE(s.ok()) << s.ToString() << "\n" << LogOf(a);
  }
  ASSERT_TRUE(WaitForCounter(*put, "remote.writes", 100)) << "daemon a wrote too little to the cluster";
  const int64_t written = StatsCounters(*put)["remote.writes"];

  // Daemon b has never seen these blocks: its lookup finds them remote.
  auto found = get->Lookup(0, keys);
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  ASSERT_GE(found->prefix_blocks, static_cast<size_t>(written / 2));
  for (size_t i = 0; i < found->prefix_blocks; ++i) EXPECT_EQ(found->tiers[i], Tier::kRemote) << i;
  std::vector<std::byte> dst(kBlockBytes);
  for (size_t i = 0; i < found->prefix_blocks; ++i) {
    auto got = get->Get(0, keys[i], dst);
    ASSERT_TRUE(got.ok()) << i << ": " << got.status().ToString();
    ASSERT_EQ(*got, kBlockBytes);
    ASSERT_TRUE(CheckBlockBytes(keys[i], 0, dst)) << "block " << i;
  }
  // Promoted into b's host tier: a second lookup of the last one says host
  // (the first ones left b's 8 MiB arena again, for the cluster they came from).
  auto again = get->Lookup(0, std::span(keys).subspan(found->prefix_blocks - 1, 1));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->tiers.front(), Tier::kHost);
  auto c = StatsCounters(*get);
  EXPECT_GE(c["remote.probe_hits"], static_cast<int64_t>(found->prefix_blocks));
  EXPECT_GE(c["engine.promotions"], static_cast<int64_t>(found->prefix_blocks));
  EXPECT_EQ(c["remote.corrupt"], 0);
  EXPECT_EQ(c["remote.writes"], 0) << "b only read";
}

// host -> NVMe -> remote: what the NVMe tier evicts goes on to the cluster
// (through remote admission), and another daemon finds it there.
TEST_F(RemoteDaemon, BlocksTheNvmeTierEvictsGoOnToTheCluster) {
  const std::string dir = MakeTempDir();
  const std::string nodes = cluster_->Seeds().front();
  DaemonProcess a(KVTIERD_PATH, "",
                  RemoteToml(nodes) + "[nvme]\npath = \"" + dir +
                      "/tier.dat\"\ncapacity_bytes = \"8MiB\"\n"
                      "region_bytes = \"1MiB\"\nadmission = \"all\"\ndirect_io = false\n");
  DaemonProcess b(KVTIERD_PATH, "", RemoteToml(nodes));
  ASSERT_TRUE(a.running()) << LogOf(a);
  ASSERT_TRUE(b.running());
  auto put = ConnectTo(a);
  auto get = ConnectTo(b);
  ASSERT_NE(put, nullptr);
  ASSERT_NE(get, nullptr);
  // 400 blocks (25 MiB) through 8 MiB of arena and 8 MiB of NVMe.
  const auto keys = TestKeys(TestNamespace(), 400, 34);
  for (const auto& k : keys) ASSERT_TRUE(put->Put(0, k, Block(k, kBlockBytes)).ok());
  ASSERT_TRUE(WaitForCounter(*put, "remote.writes", 50)) << LogOf(a);
  auto c = StatsCounters(*put);
  EXPECT_GT(c["nvme.writes"], 0);
  // The cluster's blocks came out of the NVMe tier (its evictions), found
  // by b from the first key on.
  auto found = get->Lookup(0, keys);
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  ASSERT_GE(found->prefix_blocks, 1u);
  EXPECT_EQ(found->tiers.front(), Tier::kRemote);
  std::vector<std::byte> dst(kBlockBytes);
  auto got = get->Get(0, keys.front(), dst);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(CheckBlockBytes(keys.front(), 0, dst));
  // Every block a wrote to the cluster came from the NVMe tier's
  // evictions (nvme.admission = all takes every host victim first), once
  // the writes in flight have landed.
  for (int64_t before = -1; before != c["remote.writes"];) {
    before = c["remote.writes"];
    std::this_thread::sleep_for(300ms);
    c = StatsCounters(*put);
  }
  EXPECT_EQ(c["engine.remote_demotions_in"], c["remote.writes"]);
  // a's own lookup starts in the cluster too (host -> nvme -> remote).
  auto own = put->Lookup(0, keys);
  ASSERT_TRUE(own.ok());
  ASSERT_GE(own->prefix_blocks, 1u);
  EXPECT_EQ(own->tiers.front(), Tier::kRemote);
  RemoveTree(dir);
}

TEST_F(RemoteDaemon, ADaemonWhoseClusterGoesDownKeepsServingItsOwnTiers) {
  DaemonProcess daemon(KVTIERD_PATH, "", RemoteToml(cluster_->Seeds().front()));
  ASSERT_TRUE(daemon.running());
  auto client = ConnectTo(daemon);
  ASSERT_NE(client, nullptr);
  const auto keys = TestKeys(TestNamespace(), 200, 32);
  for (size_t i = 0; i < 150; ++i) ASSERT_TRUE(client->Put(0, keys[i], Block(keys[i], kBlockBytes)).ok());
  ASSERT_TRUE(WaitForCounter(*client, "remote.writes", 10));
  ASSERT_TRUE(cluster_->KillAll().ok());
  // Everything still goes on: puts (evicting, the demotions now refused),
  // gets of what the arena holds, lookups that cannot reach the cluster.
  for (size_t i = 150; i < keys.size(); ++i) ASSERT_TRUE(client->Put(0, keys[i], Block(keys[i], kBlockBytes)).ok());
  std::vector<std::byte> dst(kBlockBytes);
  auto got = client->Get(0, keys.back(), dst);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(CheckBlockBytes(keys.back(), 0, dst));
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 20; ++i) {
    auto found = client->Lookup(0, keys);
    ASSERT_TRUE(found.ok()) << found.status().ToString();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s) << "lookups wait for a dead cluster";
  // The early blocks are unreachable now: a miss, never an error or hang.
  auto early = client->Get(0, keys.front(), dst);
  EXPECT_FALSE(early.ok());
  auto c = StatsCounters(*client);
  EXPECT_EQ(c["remote.available"], 0);
  EXPECT_GE(c["remote.unavailable_periods"], 1);
}

// A stalled cluster (every master paused: CLIENT PAUSE) and a layer-wise
// load with a deadline: the remote blocks fail with TimedOut at the
// deadline, not at the remote tier's own timeout, so the engine recomputes
// them; the host blocks before them are served.
TEST_F(RemoteDaemon, ALoadFromAStalledClusterFailsItsRemoteBlocksAtItsDeadline) {
  DaemonProcess daemon(KVTIERD_PATH, "", RemoteToml(cluster_->Seeds().front()));
  ASSERT_TRUE(daemon.running());
  auto client = ConnectTo(daemon);
  ASSERT_NE(client, nullptr);
  const auto keys = TestKeys(TestNamespace(), 300, 35);
  for (const auto& k : keys) ASSERT_TRUE(client->Put(0, k, Block(k, kBlockBytes)).ok());
  ASSERT_TRUE(WaitForCounter(*client, "remote.writes", 50)) << LogOf(daemon);
  // The newest block is a host hit; the oldest ones went to the cluster.
  auto found = client->Lookup(0, std::span(keys).first(2));
  ASSERT_TRUE(found.ok());
  ASSERT_EQ(found->prefix_blocks, 2u);
  ASSERT_EQ(found->tiers[0], Tier::kRemote);
  ASSERT_EQ(found->tiers[1], Tier::kRemote);
  for (int port : cluster_->Masters()) {
    ASSERT_TRUE(cluster_->Cli(port, {"CLIENT", "PAUSE", "4000", "ALL"}).ok());
  }
  const std::vector<BlockKey> chain{keys.back(), keys[0], keys[1]};
  LoadOptions options;
  options.deadline = std::chrono::milliseconds(300);  // remote.timeout_ms is 2000
  auto load = client->BeginLoad(0, chain, options);
  ASSERT_TRUE(load.ok()) << load.status().ToString();
  ASSERT_TRUE(load->WaitAll().ok());
  EXPECT_TRUE(load->status(0).ok());
  for (size_t b : {1, 2}) {
    EXPECT_EQ(load->status(b).code(), StatusCode::kTimedOut) << load->status(b).ToString();
    EXPECT_NE(load->status(b).message().find("deadline"), std::string::npos) << load->status(b).ToString();
  }
  EXPECT_EQ(load->usable_prefix(), 1u);
  EXPECT_TRUE(load->End().ok());
}

TEST(RemoteDaemonStart, ADaemonStartsAndServesWhenItsClusterDoesNotAnswer) {
  DaemonProcess daemon(KVTIERD_PATH, "", RemoteToml("127.0.0.1:" + std::to_string(FreeLoopbackPort())));
  ASSERT_TRUE(daemon.running());
  auto client = ConnectTo(daemon);
  ASSERT_NE(client, nullptr);
  const auto keys = TestKeys(TestNamespace(), 4, 33);
  for (const auto& k : keys) ASSERT_TRUE(client->Put(0, k, Block(k, kBlockBytes)).ok());
  std::vector<std::byte> dst(kBlockBytes);
  for (const auto& k : keys) {
    auto got = client->Get(0, k, dst);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_TRUE(CheckBlockBytes(k, 0, dst));
  }
  EXPECT_EQ(StatsCounters(*client)["remote.available"], 0);
}

}  // namespace
}  // namespace kvtier::testing

// A Redis node that lies to kvtier's cluster client (tiers/remote/
// cluster_client.h), on fake nodes (tests/testing/fake_redis.h):
//   - cluster maps too big (ranges, nodes, replicas of a range, host names)
//     or malformed (slots out of range, bad ports, entries of the wrong
//     type) are refused whole, counted, and the previous map keeps routing;
//   - a map entry, a MOVED or an ASK that names a node outside the allowed
//     networks (ClusterOptions::networks, by default the seeds' /24) is
//     refused without connecting: the node outside, listening on another
//     loopback address, sees no connection and so never the password;
//   - meanwhile the commands for every other slot are served.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/counters.h"
#include "tests/testing/counter_of.h"
#include "tests/testing/fake_redis.h"
#include "tiers/remote/cluster_client.h"
#include "tiers/remote/hash_slot.h"

namespace kvtier::testing {
namespace {

using namespace std::chrono_literals;
using Command = FakeRedis::Command;

constexpr char kPassword[] = "pw-never-outside";

RedisDeadline Soon(std::chrono::milliseconds ms = 2000ms) { return std::chrono::steady_clock::now() + ms; }

// The clients' clock: stateless, shared by every test.
const SystemClock kClock{};

std::unique_ptr<ClusterClient> Cluster(std::vector<std::string> seeds, std::vector<std::string> networks = {}) {
  ClusterOptions options;
  options.seeds = std::move(seeds);
  options.networks = std::move(networks);
  options.connect_timeout = 500ms;
  options.password = kPassword;
  auto client = ClusterClient::Create(options, kClock);
  EXPECT_TRUE(client.ok()) << client.status().ToString();
  return client.ok() ? std::move(*client) : nullptr;
}

Result<RespReply> RunGet(ClusterClient& client, const std::string& key) {
  return client.Run(
      key,
      [&key](RedisConnection& c) -> Result<RespReply> {
        const RespArg args[] = {{"GET"}, {key}};
        c.Append(args);
        if (Status s = c.Flush(Soon()); !s.ok()) return s;
        return c.ReadReply(Soon());
      },
      Soon());
}

// The text of a served GET, or the error's.
std::string Served(ClusterClient& client, const std::string& key) {
  auto reply = RunGet(client, key);
  return reply.ok() ? reply->text : reply.status().ToString();
}

std::string KeyInSlots(uint16_t first, uint16_t last) {
  for (int i = 0;; ++i) {
    std::string key = "key:" + std::to_string(i);
    const uint16_t slot = HashSlot(key);
    if (slot >= first && slot <= last) return key;
  }
}

std::vector<std::string> Sorted(std::vector<std::string> v) {
  std::sort(v.begin(), v.end());
  return v;
}

bool SawAuth(const FakeRedis& server) {
  for (const Command& c : server.commands()) {
    if (c.size() == 2 && c[0] == "AUTH" && c[1] == kPassword) return true;
  }
  return false;
}

// CLUSTER SLOTS' pieces.
std::string Int(int64_t v) { return ":" + std::to_string(v) + "\r\n"; }
std::string Bulk(const std::string& s) { return "$" + std::to_string(s.size()) + "\r\n" + s + "\r\n"; }
std::string Node(const std::string& host, int64_t port) { return "*3\r\n" + Bulk(host) + Int(port) + Bulk("id"); }
std::string Range(int64_t first, int64_t last, const std::vector<std::string>& nodes) {
  std::string out = "*" + std::to_string(2 + nodes.size()) + "\r\n" + Int(first) + Int(last);
  for (const std::string& n : nodes) out += n;
  return out;
}
std::string Map(const std::vector<std::string>& ranges) {
  std::string out = "*" + std::to_string(ranges.size()) + "\r\n";
  for (const std::string& r : ranges) out += r;
  return out;
}

// Two masters: `low` (the seed) owns [0, 8191], `high` [8192, 16383]. What
// the seed answers to CLUSTER SLOTS can be changed to a hostile map.
class TwoNodeCluster {
 public:
  TwoNodeCluster() {
    SetMap(
        Map({Range(0, 8191, {Node("127.0.0.1", low_.port())}), Range(8192, 16383, {Node("127.0.0.1", high_.port())})}));
  }
  void SetMap(std::string reply) {
    std::lock_guard lock(mu_);
    map_ = std::move(reply);
  }
  const FakeRedis& low() const { return low_; }
  const FakeRedis& high() const { return high_; }

 private:
  FakeRedis::Reply Answer(const Command& c, const char* name) {
    if (c[0] == "AUTH") return Say("+OK\r\n");
    if (c[0] == "CLUSTER") {
      std::lock_guard lock(mu_);
      return Say(map_);
    }
    return Say(std::string("+") + name + "\r\n");
  }
  std::mutex mu_;
  std::string map_;  // guarded by mu_
  FakeRedis high_{[this](const Command& c) { return Answer(c, "high"); }};
  FakeRedis low_{[this](const Command& c) { return Answer(c, "low"); }};
};

// Maps a node may send that kvtier must refuse, by what is wrong.
std::vector<std::pair<std::string, std::string>> HostileMaps(int low_port) {
  const std::string low = Node("127.0.0.1", low_port);
  std::vector<std::pair<std::string, std::string>> maps;
  {  // more ranges than there are slots
    std::vector<std::string> ranges;
    for (int i = 0; i < kClusterSlots + 1; ++i) ranges.push_back(Range(i % kClusterSlots, i % kClusterSlots, {low}));
    maps.emplace_back("16385 ranges", Map(ranges));
  }
  maps.emplace_back("1M ranges announced, none sent", "*1048576\r\n");
  {  // 3000 distinct masters
    std::vector<std::string> ranges;
    for (int i = 0; i < 3000; ++i) ranges.push_back(Range(5 * i, 5 * i + 4, {Node("127.0.0.1", 20000 + i)}));
    maps.emplace_back("3000 nodes", Map(ranges));
  }
  for (int replicas : {100, 5000}) {  // one range with a crowd of replicas
    std::vector<std::string> nodes = {low};
    for (int i = 0; i < replicas; ++i) nodes.push_back(Node("127.0.0.1", 30000 + i));
    maps.emplace_back(std::to_string(replicas) + " replicas of a range", Map({Range(0, 16383, nodes)}));
  }
  maps.emplace_back("a 300-byte host name", Map({Range(0, 16383, {Node(std::string(300, 'h'), 7000)})}));
  maps.emplace_back("a 1 MiB host name", Map({Range(0, 16383, {Node(std::string(1 << 20, 'h'), 7000)})}));
  maps.emplace_back("slot 16384", Map({Range(0, 16384, {low})}));
  maps.emplace_back("slot -1", Map({Range(-1, 100, {low})}));
  maps.emplace_back("first after last", Map({Range(9000, 8000, {low})}));
  maps.emplace_back("a slot as a string", Map({"*3\r\n" + Bulk("0") + Int(16383) + low}));
  maps.emplace_back("port 0", Map({Range(0, 16383, {Node("127.0.0.1", 0)})}));
  maps.emplace_back("port 65536", Map({Range(0, 16383, {Node("127.0.0.1", 65536)})}));
  maps.emplace_back("a range without a master", Map({"*2\r\n" + Int(0) + Int(16383)}));
  maps.emplace_back("a host that is a number", Map({Range(0, 16383, {"*3\r\n" + Int(1) + Int(7000) + Bulk("id")})}));
  maps.emplace_back("a range that is a number", Map({Int(5)}));
  return maps;
}

TEST(HostileRedisTest, AnOversizedOrMalformedMapIsRefusedAndThePreviousOneKeepsRouting) {
  TwoNodeCluster cluster;
  const std::string low_key = KeyInSlots(100, 200), high_key = KeyInSlots(9000, 9100);
  for (const auto& [what, reply] : HostileMaps(cluster.low().port())) {
    SCOPED_TRACE(what);
    cluster.SetMap(Map({Range(0, 8191, {Node("127.0.0.1", cluster.low().port())}),
                        Range(8192, 16383, {Node("127.0.0.1", cluster.high().port())})}));
    auto client = Cluster({cluster.low().address()});
    ASSERT_NE(client, nullptr);
    ASSERT_TRUE(client->Refresh(Soon()).ok());
    const auto nodes = Sorted(client->Nodes());
    ASSERT_EQ(nodes.size(), 2u);

    cluster.SetMap(reply);
    const Status refused = client->Refresh(Soon(1000ms));
    EXPECT_EQ(refused.code(), StatusCode::kProtocolError) << refused.ToString();
    EXPECT_NE(refused.message().find("CLUSTER SLOTS"), std::string::npos) << refused.ToString();
    EXPECT_EQ(CounterOf(*client, "remote.cluster.maps_refused"), 2) << "both nodes answer it, both are refused";
    EXPECT_EQ(Sorted(client->Nodes()), nodes) << "no node of a refused map is learned";
    EXPECT_EQ(Served(*client, low_key), "low");
    EXPECT_EQ(Served(*client, high_key), "high") << "the previous map still routes";
  }
}

TEST(HostileRedisTest, AMapAtTheBoundsIsTaken) {
  // Every slot its own range, alternating between the two masters, each
  // with a replica: as fragmented as a real map gets.
  TwoNodeCluster cluster;
  const std::string low = Node("127.0.0.1", cluster.low().port()), high = Node("127.0.0.1", cluster.high().port());
  std::vector<std::string> ranges;
  for (int slot = 0; slot < kClusterSlots; ++slot) {
    ranges.push_back(slot % 2 == 0 ? Range(slot, slot, {low, high}) : Range(slot, slot, {high, low}));
  }
  cluster.SetMap(Map(ranges));
  auto client = Cluster({cluster.low().address()});
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Refresh(Soon()).ok());
  EXPECT_EQ(CounterOf(*client, "remote.cluster.maps_refused"), 0);
  const std::string even = KeyInSlots(4000, 4000), odd = KeyInSlots(4001, 4001);
  EXPECT_EQ(Served(*client, even), "low");
  EXPECT_EQ(Served(*client, odd), "high");
}

// A seed whose map gives slots [8192, 16383] to `outside`, and which
// answers a GET of any of those with a MOVED there.
class SeedNamingOutside {
 public:
  explicit SeedNamingOutside(std::string outside) : outside_(std::move(outside)) {}
  const FakeRedis& seed() const { return seed_; }

 private:
  FakeRedis::Reply Answer(const Command& c) {
    if (c[0] == "AUTH") return Say("+OK\r\n");
    if (c[0] == "CLUSTER") {
      const size_t colon = outside_.rfind(':');
      return Say(Map({Range(0, 8191, {Node("127.0.0.1", seed_.port())}),
                      Range(8192, 16383, {Node(outside_.substr(0, colon), std::stoi(outside_.substr(colon + 1)))})}));
    }
    if (HashSlot(c[1]) >= 8192) return Say("-MOVED " + std::to_string(HashSlot(c[1])) + " " + outside_ + "\r\n");
    return Say("+seed\r\n");
  }
  std::string outside_;
  FakeRedis seed_{[this](const Command& c) { return Answer(c); }};
};

FakeRedis::Reply Accommodating(const Command& c) { return Say(c[0] == "AUTH" ? "+OK\r\n" : "+outside\r\n"); }

TEST(HostileRedisTest, AMapEntryAndAMovedOutsideTheConfiguredNetworkReachNoOne) {
  FakeRedis outside(Accommodating, "127.0.0.2");
  SeedNamingOutside cluster(outside.address());
  auto client = Cluster({cluster.seed().address()}, {"127.0.0.1/32"});
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Refresh(Soon()).ok()) << "the map is taken, less the entry outside";
  EXPECT_EQ(CounterOf(*client, "remote.cluster.nodes_refused"), 1);
  const auto nodes = client->Nodes();
  EXPECT_EQ(std::find(nodes.begin(), nodes.end(), outside.address()), nodes.end());

  auto moved = RunGet(*client, KeyInSlots(9000, 9100));  // to the seed, which says MOVED outside
  ASSERT_FALSE(moved.ok());
  EXPECT_EQ(moved.status().code(), StatusCode::kPermissionDenied) << moved.status().ToString();
  EXPECT_NE(moved.status().message().find(outside.address()), std::string::npos) << moved.status().ToString();
  EXPECT_EQ(CounterOf(*client, "remote.cluster.nodes_refused"), 2);
  EXPECT_EQ(Served(*client, KeyInSlots(100, 200)), "seed") << "the other slots are served";
  EXPECT_TRUE(SawAuth(cluster.seed()));
  EXPECT_EQ(outside.connections(), 0) << "nothing, the password least of all, went outside";
  EXPECT_EQ(outside.received(), "");
}

TEST(HostileRedisTest, AnAskOutsideTheConfiguredNetworkReachesNoOne) {
  FakeRedis outside(Accommodating, "127.0.0.2");
  FakeRedis seed([&](const Command& c) {
    if (c[0] == "AUTH") return Say("+OK\r\n");
    if (c[0] == "CLUSTER") return Say("-ERR This instance has cluster support disabled\r\n");
    if (c[1] == "away") return Say("-ASK " + std::to_string(HashSlot(c[1])) + " " + outside.address() + "\r\n");
    return Say("+seed\r\n");
  });
  auto client = Cluster({seed.address()}, {"127.0.0.1/32"});
  ASSERT_NE(client, nullptr);
  auto asked = RunGet(*client, "away");
  ASSERT_FALSE(asked.ok());
  EXPECT_EQ(asked.status().code(), StatusCode::kPermissionDenied) << asked.status().ToString();
  EXPECT_EQ(CounterOf(*client, "remote.cluster.nodes_refused"), 1);
  EXPECT_EQ(Served(*client, "home"), "seed");
  EXPECT_EQ(outside.connections(), 0);
}

TEST(HostileRedisTest, ByDefaultNodesMayBeInTheSeedsSlash24Only) {
  // The seed is 127.0.0.1: 127.0.0.2 is its /24, 127.0.1.1 is not.
  FakeRedis inside(Accommodating, "127.0.0.2");
  FakeRedis outside(Accommodating, "127.0.1.1");
  FakeRedis seed([&](const Command& c) {
    if (c[0] == "AUTH") return Say("+OK\r\n");
    if (c[0] == "CLUSTER") return Say("-ERR This instance has cluster support disabled\r\n");
    const std::string to = c[1] == "in" ? inside.address() : outside.address();
    return Say("-MOVED " + std::to_string(HashSlot(c[1])) + " " + to + "\r\n");
  });
  auto client = Cluster({seed.address()});
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(Served(*client, "in"), "outside") << "127.0.0.2 answered (its handler says 'outside')";
  EXPECT_TRUE(SawAuth(inside));
  auto refused = RunGet(*client, "out");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kPermissionDenied) << refused.status().ToString();
  EXPECT_EQ(CounterOf(*client, "remote.cluster.nodes_refused"), 1);
  EXPECT_EQ(outside.connections(), 0);
}

TEST(HostileRedisTest, AHostNameIsCheckedAtTheAddressItResolvesTo) {
  // "localhost" is 127.0.0.1 (and maybe ::1), outside 10.0.0.0/8: refused
  // when connecting, before any byte is sent. The seed itself is allowed
  // because it is configured, whatever the networks say.
  FakeRedis named(Accommodating);
  FakeRedis seed([&](const Command& c) {
    if (c[0] == "AUTH") return Say("+OK\r\n");
    if (c[0] == "CLUSTER") return Say("-ERR This instance has cluster support disabled\r\n");
    if (c[1] == "away")
      return Say("-MOVED " + std::to_string(HashSlot(c[1])) + " localhost:" + std::to_string(named.port()) + "\r\n");
    return Say("+seed\r\n");
  });
  auto client = Cluster({seed.address()}, {"10.0.0.0/8"});
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(Served(*client, "home"), "seed");
  auto refused = RunGet(*client, "away");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kPermissionDenied) << refused.status().ToString();
  EXPECT_GE(CounterOf(*client, "remote.cluster.nodes_refused"), 1);
  EXPECT_EQ(named.connections(), 0);
}

TEST(HostileRedisTest, NetworksMustBeNetworks) {
  for (const char* bad :
       {"10.0.0.0/33", "fd00::/129", "10.0.0.0/", "/8", "10.0.0/8", "nonsense", "10.0.0.0/8x", "10.0.0.0/-1"}) {
    ClusterOptions options;
    options.seeds = {"127.0.0.1:7000"};
    options.networks = {bad};
    auto client = ClusterClient::Create(options, kClock);
    ASSERT_FALSE(client.ok()) << bad;
    EXPECT_EQ(client.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(client.status().message().find(bad), std::string::npos) << client.status().ToString();
  }
  ClusterOptions options;
  options.seeds = {"127.0.0.1:7000"};
  options.networks = {"10.0.0.0/8", "192.168.1.7", "fd00::/64", "::1", "0.0.0.0/0"};
  EXPECT_TRUE(ClusterClient::Create(options, kClock).ok());
}

}  // namespace
}  // namespace kvtier::testing

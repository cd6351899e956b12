// kvtierd with a peer tier ([peer] listen and members), as operators run
// it: two and three daemons on this machine over UCX on loopback (TCP, and
// shared memory with TCP for the connection set-up). One daemon's host
// blocks are pulled byte-exact by the others on a lookup their own tiers
// miss; a daemon without the cluster secret gets nothing; a source killed
// mid-way costs the reader its hits, never its service.
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <thread>

#include <unistd.h>

#include "tests/testing/daemon_clients.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/redis_cluster.h"
#include "tests/testing/test_daemon.h"

namespace kvtier::testing {
namespace {

using namespace std::chrono_literals;

constexpr size_t kBlockBytes = 64 << 10;  // TestNamespace()'s whole block

std::string SharedKeyFile() {
  static const std::string dir = MakeTempDir();
  return dir + "/cluster.key";
}

// A daemon serving on `listen` and reading from `members`.
std::string PeerToml(int listen, const std::vector<int>& members, const std::string& key_file = SharedKeyFile(),
                     const std::string& host_bytes = "16MiB") {
  std::string list;
  for (int port : members) list += (list.empty() ? "" : ",") + ("127.0.0.1:" + std::to_string(port));
  return "[host]\ncapacity_bytes = \"" + host_bytes +
         "\"\nlock_memory = \"off\"\n"
         "[remote]\nkey_file = \"" +
         key_file +
         "\"\n"
         "[peer]\nlisten = \"127.0.0.1:" +
         std::to_string(listen) + "\"\nmembers = \"" + list +
         "\"\nprobe_timeout_ms = 2000\ntimeout_ms = 1000\nretry_ms = 100\n"
         "[metrics]\nenabled = false\n";
}

// Polls `client`'s lookups of `keys` until the whole prefix is found (a
// prefill node's first layer is published a moment after its save wrote it).
bool WaitFound(Client& client, const std::vector<BlockKey>& keys) {
  for (auto end = std::chrono::steady_clock::now() + 10s; std::chrono::steady_clock::now() < end;) {
    auto lookup = client.Lookup(0, keys);
    if (lookup.ok() && lookup->prefix_blocks == keys.size()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return false;
}

// Waits until `daemon` logs that it connected to the peer on `port` (with
// tenants, the shared peer tier's counters are not in a tenant's stats).
bool WaitConnected(const DaemonProcess& daemon, int port) {
  const std::string line = "peer 127.0.0.1:" + std::to_string(port) + ": connected";
  for (auto end = std::chrono::steady_clock::now() + 10s; std::chrono::steady_clock::now() < end;) {
    if (LogOf(daemon).find(line) != std::string::npos) return true;
    std::this_thread::sleep_for(20ms);
  }
  return false;
}

// A prefill node and a decode node, peers of each other, a client on each.
constexpr uint32_t kLayers = 4;  // TestNamespace's
constexpr uint64_t kLayerBytes = kBlockBytes / kLayers;
struct PrefillDecode {
  const std::vector<int> ports = FreeLoopbackPorts(2);
  const int pp = ports.at(0), pd = ports.at(1);
  DaemonProcess prefill{KVTIERD_PATH, "", PeerToml(pp, {pp, pd})};
  DaemonProcess decode{KVTIERD_PATH, "", PeerToml(pd, {pp, pd})};
  std::unique_ptr<Client> p, d;
  // Both running, both clients connected, the decode node connected to the prefill node.
  bool Start() {
    if (!prefill.running() || !decode.running()) return false;
    p = ConnectTo(prefill);
    d = ConnectTo(decode);
    return p != nullptr && d != nullptr && WaitForCounter(*d, "peer.connected", 1);
  }
};

// Layer `l` of each of `blocks`, as SaveLayer takes it.
std::vector<std::span<const std::byte>> LayerOf(const std::vector<std::vector<std::byte>>& blocks, uint32_t l) {
  std::vector<std::span<const std::byte>> src;
  for (const auto& b : blocks) src.push_back(std::span(b).subspan(l * kLayerBytes, kLayerBytes));
  return src;
}

class PeerDaemon : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override { ::setenv("UCX_TLS", GetParam(), 1); }  // the daemons inherit it
  void TearDown() override { ::unsetenv("UCX_TLS"); }
};

TEST_P(PeerDaemon, ADaemonPullsAnothersHostBlocksByteExact) {
  const std::vector<int> ports = FreeLoopbackPorts(2);
  const int pa = ports.at(0), pb = ports.at(1);
  DaemonProcess a(KVTIERD_PATH, "", PeerToml(pa, {pa, pb}));
  DaemonProcess b(KVTIERD_PATH, "", PeerToml(pb, {pa, pb}));
  ASSERT_TRUE(a.running()) << LogOf(a);
  ASSERT_TRUE(b.running()) << LogOf(b);
  auto put = ConnectTo(a);
  auto get = ConnectTo(b);
  ASSERT_NE(put, nullptr);
  ASSERT_NE(get, nullptr);
  // Each lists the other and itself; each connects to the other only.
  ASSERT_TRUE(WaitForCounter(*get, "peer.connected", 1)) << LogOf(b);
  ASSERT_TRUE(WaitForCounter(*put, "peer.connected", 1)) << LogOf(a);

  const auto keys = TestKeys(TestNamespace(), 40, 7);
  for (const auto& k : keys) ASSERT_TRUE(put->Put(0, k, Block(k, kBlockBytes)).ok());

  auto found = get->Lookup(0, keys);
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  ASSERT_EQ(found->prefix_blocks, keys.size()) << LogOf(b);
  for (Tier t : found->tiers) EXPECT_EQ(t, Tier::kRemote);  // off this node
  std::vector<std::byte> dst(kBlockBytes);
  for (size_t i = 0; i < keys.size(); ++i) {
    auto got = get->Get(0, keys[i], dst);
    ASSERT_TRUE(got.ok()) << i << ": " << got.status().ToString() << "\n" << LogOf(b);
    ASSERT_EQ(*got, kBlockBytes);
    ASSERT_TRUE(CheckBlockBytes(keys[i], 0, dst)) << "block " << i;
  }
  // Promoted into b's host tier.
  auto again = get->Lookup(0, keys);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->tiers.back(), Tier::kHost);
  auto c = StatsCounters(*get);
  EXPECT_GE(c["peer.probe_hits"], static_cast<int64_t>(keys.size()));
  EXPECT_EQ(c["peer.read_bytes"], static_cast<int64_t>(keys.size() * kBlockBytes));
  EXPECT_EQ(c["peer.corrupt"], 0);
  EXPECT_GE(c["engine.promotions"], static_cast<int64_t>(keys.size()));
  // a's pins for b end once b has its copies (the tier releases them a moment after the last read).
  EXPECT_TRUE(put->Lookup(0, keys).ok());
}

TEST_P(PeerDaemon, ThreeDaemonsEachFindWhatTheOthersHold) {
  const std::vector<int> ports = FreeLoopbackPorts(3);
  const int pa = ports.at(0), pb = ports.at(1), pc = ports.at(2);
  const std::vector<int> all = {pa, pb, pc};
  DaemonProcess a(KVTIERD_PATH, "", PeerToml(pa, all));
  DaemonProcess b(KVTIERD_PATH, "", PeerToml(pb, all));
  DaemonProcess c(KVTIERD_PATH, "", PeerToml(pc, all));
  ASSERT_TRUE(a.running() && b.running() && c.running());
  auto ca = ConnectTo(a), cb = ConnectTo(b), cc = ConnectTo(c);
  ASSERT_TRUE(WaitForCounter(*cc, "peer.connected", 2)) << LogOf(c);
  const auto on_a = TestKeys(TestNamespace(), 8, 11);
  const auto on_b = TestKeys(TestNamespace(), 8, 12);
  for (const auto& k : on_a) ASSERT_TRUE(ca->Put(0, k, Block(k, kBlockBytes)).ok());
  for (const auto& k : on_b) ASSERT_TRUE(cb->Put(0, k, Block(k, kBlockBytes)).ok());
  std::vector<std::byte> dst(kBlockBytes);
  for (const auto* keys : {&on_a, &on_b}) {
    auto found = cc->Lookup(0, *keys);
    ASSERT_TRUE(found.ok());
    ASSERT_EQ(found->prefix_blocks, keys->size()) << LogOf(c);
    for (const auto& k : *keys) {
      auto got = cc->Get(0, k, dst);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      ASSERT_TRUE(CheckBlockBytes(k, 0, dst));
    }
  }
}

// Three daemons whose KV events reach each other on tcp (a wildcard host,
// which the reader replaces by the member's), each asking one member per
// lookup: a finds what b holds by b's events, and never asks c.
TEST_P(PeerDaemon, ALookupAsksTheMemberWhoseEventsHoldThePrefix) {
  const std::vector<int> ports = FreeLoopbackPorts(9);
  const std::vector<int> all = {ports[0], ports[1], ports[2]};
  auto toml = [&](int i) {
    std::string t = PeerToml(all[i], all);
    t.replace(t.find("retry_ms = 100\n"), 15, "retry_ms = 100\nprobe_fanout = 1\n");
    return t + "[events]\nendpoint = \"tcp://*:" + std::to_string(ports[3 + 2 * i]) +
           "\"\nreplay_endpoint = \"tcp://*:" + std::to_string(ports[4 + 2 * i]) + "\"\n";
  };
  DaemonProcess a(KVTIERD_PATH, "", toml(0));
  DaemonProcess b(KVTIERD_PATH, "", toml(1));
  DaemonProcess c(KVTIERD_PATH, "", toml(2));
  ASSERT_TRUE(a.running() && b.running() && c.running()) << LogOf(a) << LogOf(b) << LogOf(c);
  auto ca = ConnectTo(a), cb = ConnectTo(b), cc = ConnectTo(c);
  ASSERT_TRUE(ca && cb && cc);
  ASSERT_TRUE(WaitForCounter(*ca, "peer.connected", 2)) << LogOf(a);
  ASSERT_TRUE(WaitForCounter(*ca, "peer_events.known", 2)) << LogOf(a);  // b's and c's events followed

  const auto on_b = TestKeys(TestNamespace(), 8, 21);
  const auto on_c = TestKeys(TestNamespace(), 8, 22);
  for (const auto& k : on_b) ASSERT_TRUE(cb->Put(0, k, Block(k, kBlockBytes)).ok());
  for (const auto& k : on_c) ASSERT_TRUE(cc->Put(0, k, Block(k, kBlockBytes)).ok());
  ASSERT_TRUE(WaitForCounter(*ca, "peer_events.blocks", 16)) << LogOf(a);

  auto found = ca->Lookup(0, on_b);
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  ASSERT_EQ(found->prefix_blocks, on_b.size()) << LogOf(a);
  std::vector<std::byte> dst(kBlockBytes);
  for (const auto& k : on_b) {
    auto got = ca->Get(0, k, dst);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_TRUE(CheckBlockBytes(k, 0, dst));
  }
  EXPECT_EQ(StatsCounters(*cc)["peer_server.queries"], 0) << "c was asked for b's prefix";
  const int64_t b_queries = StatsCounters(*cb)["peer_server.queries"];
  EXPECT_GE(b_queries, 1);

  found = ca->Lookup(0, on_c);
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(found->prefix_blocks, on_c.size()) << LogOf(a);
  EXPECT_EQ(StatsCounters(*cb)["peer_server.queries"], b_queries) << "b was asked for c's prefix";
  EXPECT_GE(StatsCounters(*cc)["peer_server.queries"], 1);
  auto counters = StatsCounters(*ca);
  EXPECT_EQ(counters["peer.probe_asks"], counters["peer.probes"]);  // one member each
  EXPECT_EQ(counters["peer_events.failures"], 0);
}

TEST_P(PeerDaemon, ADaemonWithoutTheClusterSecretGetsNothing) {
  const std::vector<int> ports = FreeLoopbackPorts(2);
  const int pa = ports.at(0), pf = ports.at(1);
  DaemonProcess a(KVTIERD_PATH, "", PeerToml(pa, {pa}));
  const std::string other_key = MakeTempDir() + "/other.key";
  DaemonProcess forged(KVTIERD_PATH, "", PeerToml(pf, {pa}, other_key));
  ASSERT_TRUE(a.running() && forged.running());
  auto put = ConnectTo(a);
  auto get = ConnectTo(forged);
  const auto keys = TestKeys(TestNamespace(), 4, 21);
  for (const auto& k : keys) ASSERT_TRUE(put->Put(0, k, Block(k, kBlockBytes)).ok());
  ASSERT_TRUE(WaitForCounter(*get, "peer.refused", 1)) << LogOf(forged);
  auto found = get->Lookup(0, keys);
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(found->prefix_blocks, 0u);
  EXPECT_EQ(StatsCounters(*get)["peer.connected"], 0);
  EXPECT_NE(LogOf(forged).find("does not prove the cluster secret"), std::string::npos) << LogOf(forged);
  // a goes on serving its own clients.
  auto mine = put->Lookup(0, keys);
  ASSERT_TRUE(mine.ok());
  EXPECT_EQ(mine->prefix_blocks, keys.size());
}

TEST_P(PeerDaemon, AKilledSourceCostsTheReaderItsHitsNotItsService) {
  const std::vector<int> ports = FreeLoopbackPorts(2);
  const int pa = ports.at(0), pb = ports.at(1);
  DaemonProcess a(KVTIERD_PATH, "", PeerToml(pa, {pa, pb}));
  DaemonProcess b(KVTIERD_PATH, "", PeerToml(pb, {pa, pb}));
  ASSERT_TRUE(a.running() && b.running());
  auto put = ConnectTo(a);
  auto get = ConnectTo(b);
  ASSERT_TRUE(WaitForCounter(*get, "peer.connected", 1));
  const auto keys = TestKeys(TestNamespace(), 16, 31);
  for (const auto& k : keys) ASSERT_TRUE(put->Put(0, k, Block(k, kBlockBytes)).ok());
  auto found = get->Lookup(0, keys);
  ASSERT_TRUE(found.ok());
  ASSERT_EQ(found->prefix_blocks, keys.size());
  ::kill(a.pid(), SIGKILL);
  // Every get either has the right bytes (read before the kill was seen) or misses; b keeps serving.
  std::vector<std::byte> dst(kBlockBytes);
  size_t missed = 0;
  for (const auto& k : keys) {
    auto got = get->Get(0, k, dst);
    if (got.ok()) {
      ASSERT_TRUE(CheckBlockBytes(k, 0, dst));
    } else {
      ++missed;
    }
  }
  EXPECT_GT(missed, 0u);
  ASSERT_TRUE(WaitForCounter(*get, "peer.disconnects", 1)) << LogOf(b);
  EXPECT_EQ(StatsCounters(*get)["peer.connected"], 0);
  auto after = get->Lookup(0, keys);
  ASSERT_TRUE(after.ok());
  const auto own = TestKeys(TestNamespace(), 2, 41);
  for (const auto& k : own) EXPECT_TRUE(get->Put(0, k, Block(k, kBlockBytes)).ok());
}

// peer.discover: daemons that list no members find each other through the
// remote tier's Redis and pull each other's blocks; a daemon that dies
// (killed: it cannot leave the registry) is dropped by the others once its
// announcement lapsed. Without remote.nodes, or with a wildcard to
// announce, the daemon refuses to start and says why.
TEST_P(PeerDaemon, DaemonsFindEachOtherThroughTheRemoteTier) {
  if (std::string why = RedisCluster::Unavailable(); !why.empty()) GTEST_SKIP() << why;
  RedisCluster::Options ro;
  ro.replicas_per_master = 0;
  auto redis = RedisCluster::Start(ro);
  ASSERT_TRUE(redis.ok()) << redis.status().ToString();
  std::string seeds;
  for (const std::string& s : (*redis)->Seeds()) seeds += (seeds.empty() ? "" : ",") + s;
  auto toml = [&](int listen) {
    return "[host]\ncapacity_bytes = \"16MiB\"\nlock_memory = \"off\"\n"
           "[remote]\nnodes = \"" +
           seeds + "\"\nkey_file = \"" + SharedKeyFile() +
           "\"\n"
           "[peer]\nlisten = \"127.0.0.1:" +
           std::to_string(listen) +
           "\"\ndiscover = true\ndiscover_interval_ms = 100\nprobe_timeout_ms = 2000\ntimeout_ms = 1000\n"
           "retry_ms = 100\n[metrics]\nenabled = false\n";
  };
  const std::vector<int> ports = FreeLoopbackPorts(2);
  const int pa = ports.at(0), pb = ports.at(1);
  DaemonProcess a(KVTIERD_PATH, "", toml(pa));
  auto b = std::make_unique<DaemonProcess>(KVTIERD_PATH, "", toml(pb));
  ASSERT_TRUE(a.running()) << LogOf(a);
  ASSERT_TRUE(b->running()) << LogOf(*b);
  auto on_a = ConnectTo(a);
  auto on_b = ConnectTo(*b);
  ASSERT_TRUE(on_a && on_b);
  ASSERT_TRUE(WaitForCounter(*on_b, "peer.connected", 1)) << LogOf(*b);
  ASSERT_TRUE(WaitForCounter(*on_a, "peer.connected", 1)) << LogOf(a);
  EXPECT_EQ(StatsCounters(*on_a)["peer.members"], 1);

  const auto keys = TestKeys(TestNamespace(), 8, 61);
  for (const auto& k : keys) ASSERT_TRUE(on_a->Put(0, k, Block(k, kBlockBytes)).ok());
  auto found = on_b->Lookup(0, keys);
  ASSERT_TRUE(found.ok());
  ASSERT_EQ(found->prefix_blocks, keys.size());
  std::vector<std::byte> dst(kBlockBytes);
  for (const auto& k : keys) {
    auto got = on_b->Get(0, k, dst);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_TRUE(CheckBlockBytes(k, 0, dst));
  }
  EXPECT_GE(StatsCounters(*on_b)["peer.reads"], static_cast<int64_t>(keys.size())) << "pulled from the peer";

  // b dies: a drops it once its announcement lapsed (10 intervals) and 3 reads missed it.
  on_b.reset();
  ::kill(b->pid(), SIGKILL);
  const std::string log_b = LogOf(*b);
  for (auto end = std::chrono::steady_clock::now() + 10s;
       StatsCounters(*on_a)["peer.members"] != 0 && std::chrono::steady_clock::now() < end;) {
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(StatsCounters(*on_a)["peer.members"], 0) << LogOf(a) << log_b;
  EXPECT_NE(LogOf(a).find("dropped (no longer in the cluster's registry)"), std::string::npos) << LogOf(a);

  // Misconfigured: refused at start with the reason.
  const std::string dir = MakeTempDir();
  auto refuses = [&](const std::string& body, const std::string& why) {
    const std::string path = dir + "/bad.toml";
    FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fprintf(f, "[server]\nsocket_path = \"%s/s.sock\"\n%s", dir.c_str(), body.c_str());
    std::fclose(f);
    CommandResult r = RunCommand({KVTIERD_PATH, "--config", path});
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find(why), std::string::npos) << r.output;
  };
  const std::string host = "[host]\ncapacity_bytes = \"16MiB\"\nlock_memory = \"off\"\n";
  refuses(host + "[remote]\nkey_file = \"" + SharedKeyFile() +
              "\"\n[peer]\nlisten = \"127.0.0.1:" + std::to_string(FreeLoopbackPort()) + "\"\ndiscover = true\n",
          "peer.discover needs the remote tier's Redis (remote.nodes)");
  refuses(host + "[remote]\nnodes = \"" + seeds + "\"\nkey_file = \"" + SharedKeyFile() +
              "\"\n[peer]\nlisten = \"0.0.0.0:" + std::to_string(FreeLoopbackPort()) + "\"\ndiscover = true\n",
          "is a wildcard the other nodes cannot connect to");
  RemoveTree(dir);
}

// Prefill on one node, decode on another: the prefill node's layer-wise
// save publishes each layer as it is written; the decode node's layer-wise
// load of the same keys has layer 0 in place while the prefill node has
// not written the last layer, and the whole prefix byte-exact once it has.
TEST_P(PeerDaemon, PrefillHandsItsLayersToDecodeBeforeTheLastIsWritten) {
  PrefillDecode pair;
  ASSERT_TRUE(pair.Start()) << LogOf(pair.decode);
  auto& p = pair.p;
  auto& d = pair.d;
  const auto keys = TestKeys(TestNamespace(), 8, 51);
  std::vector<std::vector<std::byte>> blocks;
  for (const auto& k : keys) blocks.push_back(Block(k, kBlockBytes));

  auto save = p->BeginSave(0, keys);
  ASSERT_TRUE(save.ok()) << save.status().ToString();
  ASSERT_TRUE(save->PublishToPeers().ok());
  ASSERT_TRUE(save->SaveLayer(0, LayerOf(blocks, 0)).ok());
  // The decode node finds the prefix on the prefill node once layer 0 is published there.
  ASSERT_TRUE(WaitFound(*d, keys)) << LogOf(pair.decode);
  auto load = d->BeginLoad(0, keys);
  ASSERT_TRUE(load.ok()) << load.status().ToString();
  ASSERT_TRUE(load->WaitLayer(0).ok());
  EXPECT_EQ(load->layers_ready(), 1u) << "layer 1 is not written yet";
  EXPECT_EQ(load->usable_prefix(), keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    auto got = load->LayerSpan(i, 0);
    ASSERT_EQ(got.size(), kLayerBytes) << i;
    EXPECT_TRUE(std::equal(got.begin(), got.end(), blocks[i].begin())) << i;
  }
  // The rest of the prefill, layer by layer, then its commit.
  for (uint32_t l = 1; l < kLayers; ++l) ASSERT_TRUE(save->SaveLayer(l, LayerOf(blocks, l)).ok());
  auto committed = save->FinishSave();
  ASSERT_TRUE(committed.ok());
  for (const Status& st : *committed) EXPECT_TRUE(st.ok()) << st.ToString();
  ASSERT_TRUE(load->WaitAll().ok());
  EXPECT_EQ(load->usable_prefix(), keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    for (uint32_t l = 0; l < kLayers; ++l) {
      auto got = load->LayerSpan(i, l);
      ASSERT_EQ(got.size(), kLayerBytes) << i << "/" << l;
      EXPECT_TRUE(std::equal(got.begin(), got.end(), blocks[i].begin() + l * kLayerBytes)) << i << "/" << l;
    }
  }
  ASSERT_TRUE(load->End().ok());
  EXPECT_GE(StatsCounters(*d)["peer.watches"], 1);
  EXPECT_EQ(StatsCounters(*d)["peer.corrupt"], 0);
  // The decode node now holds the prefix itself.
  auto again = d->Lookup(0, keys);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->tiers.front(), Tier::kHost);
  // Not a hand-off: the prefill node keeps its copy though the decode node took it whole.
  ASSERT_TRUE(WaitForCounter(*p, "peer_server.taken", static_cast<int64_t>(keys.size())));
  EXPECT_EQ(StatsCounters(*p)["engine.handoffs_freed"], 0);
  auto kept = p->Lookup(0, keys);
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept->prefix_blocks, keys.size());
  EXPECT_EQ(kept->tiers.front(), Tier::kHost);
}

// A hand-off (LayerSave::PublishToPeers(true)): once the decode node has
// read a block whole, the prefill node frees it: at its commit when the
// decode node took it while it was still being written, at once when it
// was taken after the commit.
TEST_P(PeerDaemon, AHandedOffPrefixLeavesThePrefillNodeOnceDecodeHasIt) {
  PrefillDecode pair;
  ASSERT_TRUE(pair.Start()) << LogOf(pair.decode);
  auto& p = pair.p;
  auto& d = pair.d;
  auto held_by_prefill = [&](const std::vector<BlockKey>& keys) {
    size_t n = 0;
    for (const BlockKey& k : keys) {
      auto one = p->Lookup(0, std::vector<BlockKey>{k});
      if (one.ok() && one->prefix_blocks == 1 && one->tiers.front() == Tier::kHost) ++n;
    }
    return n;
  };
  auto load_all = [&](const std::vector<BlockKey>& keys, const std::vector<std::vector<std::byte>>& blocks) {
    auto load = d->BeginLoad(0, keys);
    ASSERT_TRUE(load.ok()) << load.status().ToString();
    ASSERT_TRUE(load->WaitAll().ok());
    ASSERT_EQ(load->usable_prefix(), keys.size()) << LogOf(pair.decode);
    for (size_t i = 0; i < keys.size(); ++i) {
      for (uint32_t l = 0; l < kLayers; ++l) {
        auto got = load->LayerSpan(i, l);
        ASSERT_EQ(got.size(), kLayerBytes);
        EXPECT_TRUE(std::equal(got.begin(), got.end(), blocks[i].begin() + l * kLayerBytes)) << i << "/" << l;
      }
    }
    ASSERT_TRUE(load->End().ok());
  };

  // Taken while still being written: every layer published, not committed yet.
  const auto keys = TestKeys(TestNamespace(), 6, 71);
  std::vector<std::vector<std::byte>> blocks;
  for (const auto& k : keys) blocks.push_back(Block(k, kBlockBytes));
  auto save = p->BeginSave(0, keys);
  ASSERT_TRUE(save.ok()) << save.status().ToString();
  ASSERT_TRUE(save->PublishToPeers(/*free_when_taken=*/true).ok());
  EXPECT_EQ(save->PublishToPeers(false).code(), StatusCode::kInvalidArgument) << "the first call decided";
  for (uint32_t l = 0; l < kLayers; ++l) ASSERT_TRUE(save->SaveLayer(l, LayerOf(blocks, l)).ok());
  ASSERT_TRUE(WaitFound(*d, keys)) << LogOf(pair.decode);
  load_all(keys, blocks);
  ASSERT_TRUE(WaitForCounter(*p, "peer_server.taken", static_cast<int64_t>(keys.size()))) << LogOf(pair.prefill);
  EXPECT_EQ(StatsCounters(*p)["engine.handoffs_freed"], 0) << "not committed yet: nothing to free";
  auto committed = save->FinishSave();
  ASSERT_TRUE(committed.ok());
  for (const Status& st : *committed) EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(StatsCounters(*p)["engine.handoffs_freed"], static_cast<int64_t>(keys.size())) << "freed at the commit";
  EXPECT_EQ(held_by_prefill(keys), 0u);

  // Taken after the commit: freed as the decode node reports it.
  const auto later = TestKeys(TestNamespace(), 3, 81);
  std::vector<std::vector<std::byte>> later_blocks;
  for (const auto& k : later) later_blocks.push_back(Block(k, kBlockBytes));
  auto save2 = p->BeginSave(0, later);
  ASSERT_TRUE(save2.ok());
  ASSERT_TRUE(save2->PublishToPeers(true).ok());
  for (uint32_t l = 0; l < kLayers; ++l) ASSERT_TRUE(save2->SaveLayer(l, LayerOf(later_blocks, l)).ok());
  ASSERT_TRUE(save2->FinishSave().ok());
  EXPECT_EQ(held_by_prefill(later), later.size()) << "on the prefill node until the decode node has it";
  load_all(later, later_blocks);
  ASSERT_TRUE(WaitForCounter(*p, "engine.handoffs_freed", static_cast<int64_t>(keys.size() + later.size())))
      << LogOf(pair.prefill);
  EXPECT_EQ(held_by_prefill(later), 0u);
  // The decode node holds both prefixes itself.
  auto on_decode = d->Lookup(0, later);
  ASSERT_TRUE(on_decode.ok());
  EXPECT_EQ(on_decode->tiers.front(), Tier::kHost);
}

// A prefill that stops publishing (its engine stalls): the decode node's
// load fails those blocks within peer.timeout_ms, and its connection to the
// prefill node stays up.
TEST_P(PeerDaemon, APrefillThatStopsWritingFailsTheLoadNotThePeer) {
  PrefillDecode pair;
  ASSERT_TRUE(pair.Start()) << LogOf(pair.decode);
  auto& p = pair.p;
  auto& d = pair.d;
  const auto keys = TestKeys(TestNamespace(), 2, 61);
  auto save = p->BeginSave(0, keys);
  ASSERT_TRUE(save.ok());
  ASSERT_TRUE(save->PublishToPeers().ok());
  std::vector<std::byte> zeros(kLayerBytes);
  std::vector<std::span<const std::byte>> src(keys.size(), std::span<const std::byte>(zeros));
  ASSERT_TRUE(save->SaveLayer(0, src).ok());
  ASSERT_TRUE(WaitFound(*d, keys));
  auto load = d->BeginLoad(0, keys);
  ASSERT_TRUE(load.ok());
  ASSERT_TRUE(load->WaitAll().ok());  // layer 1 never comes: the blocks fail after peer.timeout_ms
  EXPECT_EQ(load->usable_prefix(), 0u);
  EXPECT_FALSE(load->status(0).ok());
  ASSERT_TRUE(load->End().ok());
  EXPECT_GE(StatsCounters(*d)["peer.watch_timeouts"], 1);
  EXPECT_EQ(StatsCounters(*d)["peer.connected"], 1) << "the peer answered: it stays connected";
  EXPECT_EQ(StatsCounters(*d)["peer.stalls"], 0) << LogOf(pair.decode);
}

// With tenants: a tenant's blocks on one node are found by the same
// tenant on another (both nodes share the tenant key and names), and by no
// other tenant.
std::string TenantsToml(uint32_t alpha_uid, uint32_t beta_uid) {
  return "[[tenant]]\nname = \"alpha\"\nuids = [" + std::to_string(alpha_uid) +
         "]\nhost_bytes = \"16MiB\"\n[[tenant]]\nname = \"beta\"\nuids = [" + std::to_string(beta_uid) +
         "]\nhost_bytes = \"16MiB\"\n";
}

TEST_P(PeerDaemon, ATenantFindsItsOwnBlocksOnAPeerAndNoOtherTenants) {
  const std::string tenant_key = "tenant_key_file = \"" + MakeTempDir() + "/tenant.key\"\n";
  const uint32_t me = ::geteuid();
  const std::vector<int> ports = FreeLoopbackPorts(3);
  const int pa = ports.at(0), pb = ports.at(1), pc = ports.at(2);
  // On a and on b this process is alpha; on c it is beta.
  DaemonProcess a(KVTIERD_PATH, tenant_key,
                  PeerToml(pa, {pa, pb, pc}, SharedKeyFile(), "40MiB") + TenantsToml(me, 54321));
  DaemonProcess b(KVTIERD_PATH, tenant_key,
                  PeerToml(pb, {pa, pb, pc}, SharedKeyFile(), "40MiB") + TenantsToml(me, 54321));
  ASSERT_TRUE(a.running()) << LogOf(a);
  ASSERT_TRUE(b.running()) << LogOf(b);
  auto on_a = ConnectTo(a);
  auto on_b = ConnectTo(b);
  ASSERT_NE(on_a, nullptr);
  ASSERT_NE(on_b, nullptr);
  ASSERT_TRUE(WaitConnected(b, pa)) << LogOf(b);
  const auto keys = TestKeys(TestNamespace(), 6, 71);
  for (const auto& k : keys) ASSERT_TRUE(on_a->Put(0, k, Block(k, kBlockBytes)).ok());
  auto found = on_b->Lookup(0, keys);
  ASSERT_TRUE(found.ok());
  ASSERT_EQ(found->prefix_blocks, keys.size()) << LogOf(b);
  std::vector<std::byte> dst(kBlockBytes);
  for (const auto& k : keys) {
    auto got = on_b->Get(0, k, dst);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_TRUE(CheckBlockBytes(k, 0, dst));
  }
  // A node where this process is beta puts the same keys, under beta's namespace: a's alpha never sees them.
  DaemonProcess c(KVTIERD_PATH, tenant_key,
                  PeerToml(pc, {pa, pb, pc}, SharedKeyFile(), "40MiB") + TenantsToml(54320, me));
  ASSERT_TRUE(c.running()) << LogOf(c);
  auto on_c = ConnectTo(c);
  ASSERT_NE(on_c, nullptr);
  ASSERT_TRUE(WaitConnected(a, pc)) << LogOf(a);
  ASSERT_TRUE(WaitConnected(c, pa)) << LogOf(c);
  const auto betas = TestKeys(TestNamespace(), 6, 72);
  for (const auto& k : betas) ASSERT_TRUE(on_c->Put(0, k, Block(k, kBlockBytes)).ok());
  auto other = on_a->Lookup(0, betas);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->prefix_blocks, 0u) << "alpha reached beta's blocks on a peer";
  // And beta on c does not reach alpha's blocks on a and b.
  auto from_c = on_c->Lookup(0, keys);
  ASSERT_TRUE(from_c.ok());
  EXPECT_EQ(from_c->prefix_blocks, 0u) << "beta reached alpha's blocks on a peer";
}

INSTANTIATE_TEST_SUITE_P(Transports, PeerDaemon, ::testing::Values("tcp", "shm,tcp"),
                         [](const auto& info) { return std::string(info.index == 0 ? "tcp" : "shm"); });

}  // namespace
}  // namespace kvtier::testing

// The remote tier (tiers/remote/remote_tier.h) against a real 6-node Redis
// Cluster on loopback (3 masters, 3 replicas: tests/testing/redis_cluster.h):
// put/get, blocks another node wrote found by probing, values that are
// gone, foreign or corrupt read as misses, a slot moved during the test
// (MOVED and ASK), values forged by a party with write access (valid
// checksums, no cluster secret) read as counted misses, a master killed (failover with only misses between),
// and the whole cluster down (the tier says unavailable, fast).
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <future>
#include <set>
#include <thread>

#include "daemon/tenants/tenant_scope.h"
#include "daemon/tenants/tenant_tier.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/redis_cluster.h"
#include "tests/testing/test_daemon.h"
#include "tests/testing/wait_for.h"
#include "common/checksum.h"
#include "common/little_endian.h"
#include "tiers/remote/hash_slot.h"
#include "tiers/remote/remote_tier.h"
#include "tiers/remote/remote_value.h"

namespace kvtier::testing {
namespace {

using namespace std::chrono_literals;

const NamespaceFingerprint kNs{0x5eed, 0xcafe};
constexpr uint32_t kLayers = 4;
constexpr size_t kBlockBytes = 64 << 10;

// Every tier of these tests is a node of one cluster: the same secret.
const std::string kClusterSecret(kClusterSecretBytes, 'c');

RemoteTierOptions TierOptions(const RedisCluster& cluster) {
  RemoteTierOptions o;
  o.cluster_secret = kClusterSecret;
  o.cluster.seeds = {cluster.Seeds().front()};  // the rest are learned
  o.timeout = 2000ms;
  o.probe_timeout = 500ms;
  o.retry_interval = 200ms;
  o.threads = 2;
  return o;
}

// The tiers' clock (ClusterClient's pauses): stateless, shared by every test.
const SystemClock kClock{};

std::unique_ptr<RemoteTier> OpenTier(const RemoteTierOptions& options) {
  auto tier = RemoteTier::Open(options, kClock);
  EXPECT_TRUE(tier.ok()) << tier.status().ToString();
  return tier.ok() ? std::move(*tier) : nullptr;
}

std::vector<BlockKey> Keys(size_t n, uint64_t seed) {
  std::vector<BlockKey> keys;
  for (size_t i = 0; i < n; ++i) keys.push_back(BlockKey{seed, 0x1000 + i});
  return keys;
}

Status WriteSync(BlockTier& tier, const BlockKey& key, std::span<const std::byte> bytes,
                 const NamespaceFingerprint& ns = kNs) {
  std::promise<Status> done;
  Status accepted = tier.Write(ns, key, kLayers, bytes, [&done](Status s) { done.set_value(s); });
  if (!accepted.ok()) return accepted;
  return done.get_future().get();
}

Result<size_t> ReadSync(BlockTier& tier, const BlockKey& key, uint32_t first, uint32_t last, std::span<std::byte> dst) {
  std::promise<Result<size_t>> done;
  Status accepted = tier.Read(key, first, last, dst, [&done](Result<size_t> r) { done.set_value(std::move(r)); });
  if (!accepted.ok()) return accepted;
  return done.get_future().get();
}

int64_t Counter(const BlockTier& tier, std::string_view name) {
  CounterCollector c;
  tier.VisitCounters(c);
  return FindCounter(c, name);
}

class RemoteTierCluster : public RedisClusterTest {
 protected:
  // Writes `keys` (FillBlockBytes(key, 0)) through `tier`.
  void WriteAll(BlockTier& tier, const std::vector<BlockKey>& keys) {
    for (const BlockKey& key : keys) {
      const auto bytes = Block(key, kBlockBytes);
      ASSERT_TRUE(WriteSync(tier, key, bytes).ok()) << key.ToHex();
    }
  }
};

TEST_F(RemoteTierCluster, BlocksReadBackWholeAndByLayerFromEveryMaster) {
  auto tier = OpenTier(TierOptions(*cluster_));
  ASSERT_NE(tier, nullptr);
  EXPECT_TRUE(tier->available());
  const auto keys = Keys(48, 1);
  WriteAll(*tier, keys);
  std::set<int> masters;
  for (const BlockKey& key : keys) masters.insert(cluster_->MasterOf(HashSlot(RemoteKeyName(kNs, key))));
  EXPECT_EQ(masters.size(), 3u) << "the keys should spread over every master";
  std::vector<std::byte> dst(kBlockBytes);
  for (const BlockKey& key : keys) {
    auto info = tier->Find(key);
    ASSERT_TRUE(info.has_value());
    EXPECT_EQ(info->payload_bytes, kBlockBytes);
    EXPECT_EQ(info->layer_count, kLayers);
    auto got = ReadSync(*tier, key, 0, kLayers, dst);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_EQ(*got, kBlockBytes);
    ASSERT_TRUE(CheckBlockBytes(key, 0, dst));
  }
  // Layers [1, 3): exactly those bytes.
  const auto whole = Block(keys[5], kBlockBytes);
  std::vector<std::byte> two(kBlockBytes / 2);
  auto got = ReadSync(*tier, keys[5], 1, 3, two);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(std::equal(two.begin(), two.end(), whole.begin() + kBlockBytes / 4));
  EXPECT_EQ(WriteSync(*tier, keys[0], whole).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(Counter(*tier, "remote.writes"), static_cast<int64_t>(keys.size()));
  EXPECT_EQ(Counter(*tier, "remote.corrupt"), 0);
}

TEST_F(RemoteTierCluster, UnderNoevictionATenantWithinItsShareKeepsEveryBlock) {
  // The store configured as docs/OPERATIONS.md asks for tenants' protected
  // shares: a small maxmemory per master, and nothing evicted at it.
  for (int port : cluster_->Masters()) {
    ASSERT_TRUE(cluster_->Cli(port, {"CONFIG", "SET", "maxmemory-policy", "noeviction"}).ok());
    ASSERT_TRUE(cluster_->Cli(port, {"CONFIG", "SET", "maxmemory", "12mb"}).ok());
  }
  auto tier = OpenTier(TierOptions(*cluster_));
  ASSERT_NE(tier, nullptr);
  SharedTier shared(*tier);
  const TenantScope alpha_scope(std::string(32, 's'), "alpha"), beta_scope(std::string(32, 's'), "beta");
  TenantTier alpha(shared, alpha_scope, 4 << 20);
  TenantTier beta(shared, beta_scope, 0);
  // Alpha stays within its 4 MiB share.
  const auto mine = Keys(32, 7);
  for (const BlockKey& key : mine) {
    const Status s = WriteSync(alpha, key, Block(key, kBlockBytes), alpha_scope.ScopeNamespace(kNs));
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  // Beta writes far more than the store holds: refused as NoSpace once it
  // is full, never making room out of alpha's blocks.
  size_t refused = 0;
  for (const BlockKey& key : Keys(1000, 8)) {
    const Status s = WriteSync(beta, key, Block(key, kBlockBytes), beta_scope.ScopeNamespace(kNs));
    if (s.code() == StatusCode::kNoSpace)
      ++refused;
    else
      ASSERT_TRUE(s.ok()) << s.ToString();
  }
  EXPECT_GT(refused, 0u) << "36 MB of store cannot take 64 MB";
  EXPECT_EQ(Counter(*tier, "remote.store_full"), static_cast<int64_t>(refused));
  EXPECT_EQ(Counter(*tier, "remote.write_failures"), 0) << "a full store is not a failing one";
  EXPECT_TRUE(tier->available());
  std::vector<std::byte> dst(kBlockBytes);
  for (const BlockKey& key : mine) {
    auto got = ReadSync(alpha, key, 0, kLayers, dst);
    ASSERT_TRUE(got.ok()) << key.ToHex() << ": " << got.status().ToString();
    ASSERT_TRUE(CheckBlockBytes(key, 0, dst)) << key.ToHex();
  }
}

TEST_F(RemoteTierCluster, AnotherNodesBlocksAreFoundByProbingAndReadExact) {
  auto writer = OpenTier(TierOptions(*cluster_));
  auto reader = OpenTier(TierOptions(*cluster_));
  ASSERT_NE(writer, nullptr);
  ASSERT_NE(reader, nullptr);
  const auto keys = Keys(32, 2);
  WriteAll(*writer, keys);
  EXPECT_FALSE(reader->Find(keys[0]).has_value()) << "nothing known before a probe";
  const auto absent = Keys(4, 99);
  std::vector<BlockKey> asked = keys;
  asked.insert(asked.end(), absent.begin(), absent.end());
  reader->Probe(kNs, asked);
  for (const BlockKey& key : absent) EXPECT_FALSE(reader->Find(key).has_value());
  std::vector<std::byte> dst(kBlockBytes);
  for (const BlockKey& key : keys) {
    ASSERT_TRUE(reader->Find(key).has_value()) << key.ToHex();
    auto got = ReadSync(*reader, key, 0, kLayers, dst);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_TRUE(CheckBlockBytes(key, 0, dst));
  }
  EXPECT_EQ(Counter(*reader, "remote.probe_hits"), static_cast<int64_t>(keys.size()));
  // Another namespace's probe finds nothing under these keys.
  auto other = OpenTier(TierOptions(*cluster_));
  other->Probe(NamespaceFingerprint{1, 2}, keys);
  EXPECT_FALSE(other->Find(keys[0]).has_value());
}

// Erase forgets a block at once and deletes its value from the store (on
// a worker): another node's probe then finds only the blocks left.
TEST_F(RemoteTierCluster, AnErasedBlockLeavesTheStore) {
  auto writer = OpenTier(TierOptions(*cluster_));
  ASSERT_NE(writer, nullptr);
  const auto keys = Keys(4, 3);
  WriteAll(*writer, keys);
  ASSERT_TRUE(writer->Erase(keys[0]).ok());
  ASSERT_TRUE(writer->Erase(keys[1]).ok());
  EXPECT_FALSE(writer->Find(keys[0]).has_value()) << "forgotten at once";
  EXPECT_EQ(writer->Erase(keys[0]).code(), StatusCode::kNotFound);
  const auto probe_finds = [&](const BlockKey& key) {
    auto reader = OpenTier(TierOptions(*cluster_));
    reader->Probe(kNs, std::vector<BlockKey>{key});
    return reader->Find(key).has_value();
  };
  EXPECT_TRUE(::kvtier::testing::WaitFor([&] { return !probe_finds(keys[0]) && !probe_finds(keys[1]); }))
      << "the erased values are still in the store";
  EXPECT_TRUE(probe_finds(keys[2]));
  EXPECT_TRUE(probe_finds(keys[3]));
  EXPECT_EQ(Counter(*writer, "remote.erases"), 2);
}

TEST_F(RemoteTierCluster, GoneForeignAndCorruptValuesAreMissesNeverBytes) {
  auto tier = OpenTier(TierOptions(*cluster_));
  ASSERT_NE(tier, nullptr);
  const auto keys = Keys(3, 3);
  WriteAll(*tier, keys);
  const std::string gone = RemoteKeyName(kNs, keys[0]);
  const std::string foreign = RemoteKeyName(kNs, keys[1]);
  const std::string corrupt = RemoteKeyName(kNs, keys[2]);
  auto cli = [&](const std::string& key, std::vector<std::string> args) {
    auto out = cluster_->Cli(cluster_->MasterOf(HashSlot(key)), args);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
  };
  cli(gone, {"DEL", gone});
  // keys[0]'s name now holds... nothing; keys[1]'s holds a valid value of
  // another key (what a stale or colliding name would show); keys[2]'s
  // holds bytes of the right length that are not a value.
  auto mac = ValueMac::Create(kClusterSecret);
  ASSERT_TRUE(mac.ok());
  std::string other =
      EncodeRemoteValue(**mac, RemoteBlock{kNs, BlockKey{7, 7}, kLayers, 0}, Block(BlockKey{7, 7}, kBlockBytes));
  const std::string dir = MakeTempDir();
  {
    std::ofstream(dir + "/foreign", std::ios::binary) << other;
    std::ofstream(dir + "/corrupt", std::ios::binary) << std::string(other.size(), 'x');
  }
  // redis-cli -x reads the value from stdin.
  for (auto [key, file] : {std::pair{foreign, dir + "/foreign"}, std::pair{corrupt, dir + "/corrupt"}}) {
    const CommandResult r = RunCommand({"/bin/sh", "-c",
                                        "/usr/bin/redis-cli -p " + std::to_string(cluster_->MasterOf(HashSlot(key))) +
                                            " -x SET " + key + " < " + file});
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  RemoveTree(dir);
  std::vector<std::byte> dst(kBlockBytes);
  for (const BlockKey& key : keys) {
    std::fill(dst.begin(), dst.end(), std::byte{0});
    auto got = ReadSync(*tier, key, 0, kLayers, dst);
    EXPECT_FALSE(got.ok()) << key.ToHex() << " was served";
    EXPECT_FALSE(tier->Find(key).has_value()) << "a failed value is forgotten";
  }
  EXPECT_EQ(Counter(*tier, "remote.lost"), 1);
  EXPECT_EQ(Counter(*tier, "remote.foreign"), 1);
  EXPECT_EQ(Counter(*tier, "remote.corrupt"), 1);
  // A probe of them learns nothing either.
  auto fresh = OpenTier(TierOptions(*cluster_));
  fresh->Probe(kNs, keys);
  for (const BlockKey& key : keys) EXPECT_FALSE(fresh->Find(key).has_value());
}

// The attack the value MAC is for: a party that can write to the cluster
// (another node, anyone with its password) but holds no cluster secret
// replaces each value with its own payload under the same header, and
// recomputes every checksum the format has (the payload's xxh3, the
// header's). A second node finds them by probing (the header is all a
// probe sees) and reads each as a miss, counted, never served.
TEST_F(RemoteTierCluster, ValuesForgedWithValidChecksumsAreCountedMissesNeverBytes) {
  auto writer = OpenTier(TierOptions(*cluster_));
  ASSERT_NE(writer, nullptr);
  const auto keys = Keys(8, 4);
  WriteAll(*writer, keys);
  auto mac = ValueMac::Create(kClusterSecret);
  ASSERT_TRUE(mac.ok());
  const std::string dir = MakeTempDir();
  for (const BlockKey& key : keys) {
    // What GET returns the attacker: the value as the writer stored it.
    std::string value = EncodeRemoteValue(**mac, RemoteBlock{kNs, key, kLayers, 0}, Block(key, kBlockBytes));
    auto* h = reinterpret_cast<std::byte*>(value.data());
    const auto evil = Block(BlockKey{0xbad, key.lo}, kBlockBytes);
    std::memcpy(h + kRemoteHeaderBytes, evil.data(), evil.size());
    StoreLe64(h + 56, BlockChecksum(evil));
    StoreLe64(h + 96, BlockChecksum(std::span<const std::byte>(h, 96)));
    ASSERT_TRUE(DecodeRemoteHeader(std::as_bytes(std::span(value)), kNs, key).ok()) << "a well-formed forgery";
    const std::string name = RemoteKeyName(kNs, key);
    std::ofstream(dir + "/forged", std::ios::binary | std::ios::trunc) << value;
    const CommandResult r = RunCommand({"/bin/sh", "-c",
                                        "/usr/bin/redis-cli -p " + std::to_string(cluster_->MasterOf(HashSlot(name))) +
                                            " -x SET " + name + " < " + dir + "/forged"});
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  RemoveTree(dir);
  auto reader = OpenTier(TierOptions(*cluster_));
  ASSERT_NE(reader, nullptr);
  reader->Probe(kNs, keys);
  std::vector<std::byte> dst(kBlockBytes);
  for (BlockTier* tier : {static_cast<BlockTier*>(reader.get()), static_cast<BlockTier*>(writer.get())}) {
    for (const BlockKey& key : keys) {
      ASSERT_TRUE(tier->Find(key).has_value()) << "the forged header passes a probe; the read must catch it";
      std::fill(dst.begin(), dst.end(), std::byte{0});
      auto got = ReadSync(*tier, key, 0, kLayers, dst);
      ASSERT_FALSE(got.ok()) << key.ToHex() << ": a forged value was served";
      EXPECT_EQ(got.status().code(), StatusCode::kCorruption) << "a miss to the engine: " << got.status().ToString();
      EXPECT_FALSE(tier->Find(key).has_value()) << "a value that does not authenticate is forgotten";
    }
    EXPECT_EQ(Counter(*tier, "remote.auth_failures"), static_cast<int64_t>(keys.size()));
    EXPECT_EQ(Counter(*tier, "remote.reads"), 0);
  }
  // A layer range is verified whole too.
  auto third = OpenTier(TierOptions(*cluster_));
  third->Probe(kNs, keys);
  std::vector<std::byte> two(kBlockBytes / 2);
  EXPECT_FALSE(ReadSync(*third, keys[0], 1, 3, two).ok());
  EXPECT_EQ(Counter(*third, "remote.auth_failures"), 1);
}

// A node with another cluster secret (a misconfigured copy of the key
// file) reads its peers' values as misses, counted: never as bytes.
TEST_F(RemoteTierCluster, ANodeWithAnotherSecretMissesItsPeersValues) {
  auto writer = OpenTier(TierOptions(*cluster_));
  ASSERT_NE(writer, nullptr);
  const auto keys = Keys(4, 5);
  WriteAll(*writer, keys);
  RemoteTierOptions options = TierOptions(*cluster_);
  options.cluster_secret = std::string(kClusterSecretBytes, 'x');
  auto stranger = OpenTier(options);
  ASSERT_NE(stranger, nullptr);
  stranger->Probe(kNs, keys);
  std::vector<std::byte> dst(kBlockBytes);
  for (const BlockKey& key : keys) EXPECT_FALSE(ReadSync(*stranger, key, 0, kLayers, dst).ok());
  EXPECT_EQ(Counter(*stranger, "remote.auth_failures"), static_cast<int64_t>(keys.size()));
}

TEST_F(RemoteTierCluster, ASlotMovedDuringTheTestIsFollowedByRedirects) {
  auto tier = OpenTier(TierOptions(*cluster_));
  ASSERT_NE(tier, nullptr);
  const auto keys = Keys(24, 4);
  WriteAll(*tier, keys);
  const uint16_t slot = HashSlot(RemoteKeyName(kNs, keys[0]));
  const int from = cluster_->MasterOf(slot);
  int to = 0;
  for (int m : cluster_->Masters()) {
    if (m != from) to = m;
  }
  ASSERT_NE(to, 0);
  // Mid-migration: the key already moved answers ASK at the source.
  ASSERT_TRUE(cluster_->BeginMove(slot, to).ok());
  ASSERT_TRUE(cluster_->MoveKeys(slot, 100).ok());
  std::vector<std::byte> dst(kBlockBytes);
  auto got = ReadSync(*tier, keys[0], 0, kLayers, dst);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(CheckBlockBytes(keys[0], 0, dst));
  EXPECT_GE(Counter(*tier, "remote.cluster.asked"), 1);
  ASSERT_TRUE(cluster_->FinishMove(slot).ok());
  EXPECT_EQ(cluster_->MasterOf(slot), to);
  // Done: the old owner answers MOVED, once; the map then knows.
  got = ReadSync(*tier, keys[0], 0, kLayers, dst);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(CheckBlockBytes(keys[0], 0, dst));
  const int64_t moved = Counter(*tier, "remote.cluster.moved");
  EXPECT_GE(moved, 1);
  got = ReadSync(*tier, keys[0], 0, kLayers, dst);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(Counter(*tier, "remote.cluster.moved"), moved) << "the corrected map routes straight to the new owner";
  // A new block in that slot is written where the slot is now.
  for (const BlockKey& key : keys) {
    got = ReadSync(*tier, key, 0, kLayers, dst);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_TRUE(CheckBlockBytes(key, 0, dst));
  }
}

TEST_F(RemoteTierCluster, AKilledMasterFailsOverWithOnlyMissesBetween) {
  auto tier = OpenTier(TierOptions(*cluster_));
  ASSERT_NE(tier, nullptr);
  const auto keys = Keys(60, 5);
  WriteAll(*tier, keys);
  // Replication is asynchronous: let the replicas catch up (WAIT), so the
  // test can tell a lost block (a miss) from a wrong one.
  for (int master : cluster_->Masters()) ASSERT_TRUE(cluster_->Cli(master, {"WAIT", "1", "2000"}).ok());
  const uint16_t slot = HashSlot(RemoteKeyName(kNs, keys[0]));
  const int victim = cluster_->MasterOf(slot);
  std::set<BlockKey> on_victim;
  for (const BlockKey& key : keys) {
    if (cluster_->MasterOf(HashSlot(RemoteKeyName(kNs, key))) == victim) on_victim.insert(key);
  }
  ASSERT_TRUE(cluster_->Kill(victim).ok());
  const auto killed_at = std::chrono::steady_clock::now();
  int64_t served = 0, missed = 0;
  std::vector<std::byte> dst(kBlockBytes);
  // Read everything in a loop through the failover: each read is a miss or
  // the exact bytes.
  bool recovered = false;
  while (!recovered && std::chrono::steady_clock::now() - killed_at < 20s) {
    recovered = true;
    for (const BlockKey& key : keys) {
      if (!tier->Find(key).has_value()) tier->Probe(kNs, std::span(&key, 1));
      std::fill(dst.begin(), dst.end(), std::byte{0});
      auto got = ReadSync(*tier, key, 0, kLayers, dst);
      if (got.ok()) {
        ASSERT_EQ(*got, kBlockBytes);
        ASSERT_TRUE(CheckBlockBytes(key, 0, dst)) << "wrong bytes served for " << key.ToHex();
        ++served;
      } else {
        ASSERT_EQ(on_victim.count(key), 1u) << "a block of a live master missed: " << got.status().ToString();
        ++missed;
        recovered = false;
      }
    }
    if (!recovered) std::this_thread::sleep_for(100ms);
  }
  const auto took = std::chrono::steady_clock::now() - killed_at;
  EXPECT_TRUE(recovered) << "every block readable again within 20 s of the kill";
  EXPECT_LT(took, 15s);
  EXPECT_GT(missed, 0) << "the dead master's keys should miss for a while";
  EXPECT_NE(cluster_->MasterOf(slot), victim);
  EXPECT_TRUE(tier->available()) << "one master down is not the tier down";
  // Writes land on the new master.
  const auto after = Keys(8, 55);
  WriteAll(*tier, after);
  auto reader = OpenTier(TierOptions(*cluster_));
  reader->Probe(kNs, after);
  for (const BlockKey& key : after) {
    auto got = ReadSync(*reader, key, 0, kLayers, dst);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_TRUE(CheckBlockBytes(key, 0, dst));
  }
  std::printf("failover: %lld reads served, %lld missed, every block back after %lld ms\n",
              static_cast<long long>(served), static_cast<long long>(missed),
              static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()));
}

TEST_F(RemoteTierCluster, TheWholeClusterDownMakesTheTierUnavailableAndFast) {
  auto tier = OpenTier(TierOptions(*cluster_));
  ASSERT_NE(tier, nullptr);
  const auto keys = Keys(4, 6);
  WriteAll(*tier, keys);
  ASSERT_TRUE(cluster_->KillAll().ok());
  std::vector<std::byte> dst(kBlockBytes);
  auto got = ReadSync(*tier, keys[0], 0, kLayers, dst);
  EXPECT_FALSE(got.ok());
  EXPECT_FALSE(tier->available());
  EXPECT_FALSE(tier->Find(keys[1]).has_value()) << "an unreachable tier claims no block";
  const auto bytes = Block(BlockKey{6, 6}, kBlockBytes);
  const auto start = std::chrono::steady_clock::now();
  Status refused = WriteSync(*tier, BlockKey{6, 6}, bytes);
  EXPECT_EQ(refused.code(), StatusCode::kUnavailable) << refused.ToString();
  tier->Probe(kNs, keys);
  // Not a speed figure: a tier that tried the dead cluster would wait for
  // its 2 s timeout here; one that knows it is down answers at once.
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1s) << "a known-dead cluster costs nothing per call";
  EXPECT_EQ(Counter(*tier, "remote.available"), 0);
  EXPECT_GE(Counter(*tier, "remote.unavailable_periods"), 1);
}

TEST(RemoteTierOpen, ANodeThatDoesNotAnswerStartsTheTierUnavailable) {
  RemoteTierOptions o;
  o.cluster_secret = kClusterSecret;
  o.cluster.seeds = {"127.0.0.1:" + std::to_string(FreeLoopbackPort())};
  o.timeout = 500ms;
  auto tier = RemoteTier::Open(o, kClock);
  ASSERT_TRUE(tier.ok()) << tier.status().ToString();
  EXPECT_FALSE((*tier)->available());
  o.cluster.seeds = {"no-port"};
  EXPECT_EQ(RemoteTier::Open(o, kClock).status().code(), StatusCode::kInvalidArgument);
  o.cluster.seeds = {};
  EXPECT_EQ(RemoteTier::Open(o, kClock).status().code(), StatusCode::kInvalidArgument);
}

// While unavailable the tier tries the cluster once per retry_interval of
// its clock: before that a write is refused at once, without a connect;
// once the clock passed it, one write goes out (and finds it still down).
TEST(RemoteTierOpen, AnUnavailableTierTriesAgainOncePerRetryIntervalOnItsClock) {
  RemoteTierOptions o;
  o.cluster_secret = kClusterSecret;
  o.cluster.seeds = {"127.0.0.1:" + std::to_string(FreeLoopbackPort())};
  o.cluster.node_retry = 0ms;  // every try dials: connect_failures counts the tries
  o.timeout = 500ms;
  o.retry_interval = 200ms;
  FakeClock clock;
  auto opened = RemoteTier::Open(o, clock);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  RemoteTier& tier = **opened;
  ASSERT_FALSE(tier.available());
  const int64_t dialled = Counter(tier, "remote.cluster.connect_failures");
  const auto bytes = Block(BlockKey{7, 7}, kBlockBytes);
  auto write = [&] {
    std::promise<Status> done;
    Status accepted = tier.Write(kNs, BlockKey{7, 7}, kLayers, bytes, [&done](Status s) { done.set_value(s); });
    if (accepted.ok()) accepted = done.get_future().get();
    return accepted;
  };
  clock.AdvanceUs(200'000 - 1);
  EXPECT_EQ(write().code(), StatusCode::kUnavailable);
  EXPECT_EQ(Counter(tier, "remote.cluster.connect_failures"), dialled) << "refused without trying";
  clock.AdvanceUs(1);
  EXPECT_EQ(write().code(), StatusCode::kUnavailable);
  EXPECT_GT(Counter(tier, "remote.cluster.connect_failures"), dialled) << "one try once retry_interval passed";
  const int64_t tried = Counter(tier, "remote.cluster.connect_failures");
  EXPECT_EQ(write().code(), StatusCode::kUnavailable);
  EXPECT_EQ(Counter(tier, "remote.cluster.connect_failures"), tried) << "and the next waits another interval";
  EXPECT_FALSE(tier.available());
}

}  // namespace
}  // namespace kvtier::testing

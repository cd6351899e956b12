// The block directory end to end: lookups and copying gets of host blocks
// served from the daemon's shared table without a round trip, reported to
// the daemon afterwards, and never stale ("may miss, never wrong").
//
// Counters read in process (EngineCounter, ServerCounter) send nothing, so
// they show what the daemon has seen so far; StatsCounter is a request, and
// the client's deferred usage report rides in front of it.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/counters.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/test_daemon.h"

namespace kvtier::testing {
namespace {

// Gets `key` into a fresh buffer and checks length and bytes.
void ExpectGet(Client& client, const BlockKey& key, size_t size, uint64_t salt = 0) {
  std::vector<std::byte> dst(size + 100);
  auto got = client.Get(0, key, dst);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, size);
  EXPECT_TRUE(CheckBlockBytes(key, salt, std::span(dst).first(size)));
}

size_t PrefixOf(Client& client, std::span<const BlockKey> keys) {
  auto r = client.Lookup(0, keys);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? r->prefix_blocks : size_t{9999};
}

// A copying Get of a host block is served from the directory: no Pin, exact
// bytes, and the read is reported afterwards as a directory use. A client
// without the directory pins instead.
TEST(Directory, CopyingGetPinsNothingAndIsReportedAsAUse) {
  TestDaemon daemon;
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  const auto keys = TestKeys(TestNamespace(), 4, 101);
  std::vector<size_t> sizes;
  for (size_t i = 0; i < keys.size(); ++i) {
    sizes.push_back(4096 * (i + 1) + 7 * i);
    ASSERT_TRUE(client->Put(0, keys[i], Block(keys[i], sizes[i])).ok());
  }
  ASSERT_EQ(EngineCounter(daemon, "host.directory.entries"), 4);
  const int64_t pins = EngineCounter(daemon, "engine.pins");
  const int64_t uses = EngineCounter(daemon, "engine.directory_uses");
  EXPECT_EQ(uses, 0);

  ExpectGet(*client, keys[0], sizes[0]);
  std::vector<std::vector<std::byte>> out;
  std::vector<std::span<std::byte>> dst;
  for (size_t i = 1; i < keys.size(); ++i) out.emplace_back(sizes[i] + 1);
  for (auto& o : out) dst.emplace_back(o);
  auto got = client->GetBatch(0, std::span(keys).subspan(1), dst);
  ASSERT_EQ(got.size(), 3u);
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i].ok()) << got[i].status().ToString();
    EXPECT_EQ(*got[i], sizes[i + 1]);
    EXPECT_TRUE(CheckBlockBytes(keys[i + 1], 0, std::span(out[i]).first(sizes[i + 1])));
  }
  EXPECT_EQ(EngineCounter(daemon, "engine.pins"), pins) << "a directory read pinned";
  EXPECT_EQ(EngineCounter(daemon, "engine.leases"), 0);

  // The report rides in front of the next request.
  EXPECT_EQ(StatsCounter(*client, "engine.directory_uses"), uses + 4);
  EXPECT_EQ(StatsCounter(*client, "engine.directory_stale_uses"), 0);
  EXPECT_EQ(StatsCounter(*client, "engine.bad_usage_reports"), 0);
  EXPECT_EQ(StatsCounter(*client, "engine.pins"), pins);

  auto socket_only = daemon.ConnectSocketOnly();
  ASSERT_NE(socket_only, nullptr);
  ExpectGet(*socket_only, keys[0], sizes[0]);
  EXPECT_EQ(EngineCounter(daemon, "engine.pins"), pins + 1) << "a socket-only Get must pin";
  EXPECT_EQ(StatsCounter(*socket_only, "engine.directory_uses"), uses + 4) << "a pinned read is no directory use";
}

// Lookups of host blocks, whole hits and misses alike, are answered from the
// directory without a request; the daemon learns of them afterwards.
TEST(Directory, LookupIsAnsweredLocallyAndCountedLater) {
  TestDaemon daemon;
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  const auto keys = TestKeys(TestNamespace(), 6, 102);
  for (size_t i : {0, 1, 3}) ASSERT_TRUE(client->Put(0, keys[i], Block(keys[i], 8192)).ok());
  const int64_t requests = ServerCounter(daemon, "server.requests");
  const int64_t lookups = EngineCounter(daemon, "engine.lookups");
  const int64_t lookup_keys = EngineCounter(daemon, "engine.lookup_keys");
  const int64_t hit_blocks = EngineCounter(daemon, "engine.lookup_hit_blocks");
  EXPECT_EQ(EngineCounter(daemon, "engine.local_lookups"), 0);

  constexpr int kRounds = 20;
  for (int round = 0; round < kRounds; ++round) {
    auto full = client->Lookup(0, std::span(keys).first(2));
    ASSERT_TRUE(full.ok()) << full.status().ToString();
    EXPECT_EQ(full->prefix_blocks, 2u);
    EXPECT_EQ(full->tiers, std::vector<Tier>(2, Tier::kHost));
    auto partial = client->Lookup(0, keys);  // misses at keys[2]
    ASSERT_TRUE(partial.ok()) << partial.status().ToString();
    EXPECT_EQ(partial->prefix_blocks, 2u);
    EXPECT_EQ(partial->tiers, std::vector<Tier>(2, Tier::kHost));
    auto miss = client->Lookup(0, std::span(keys).subspan(2));
    ASSERT_TRUE(miss.ok()) << miss.status().ToString();
    EXPECT_EQ(miss->prefix_blocks, 0u);
    EXPECT_TRUE(miss->tiers.empty());
  }
  // Over the socket these were 3 * kRounds requests. The only frames a
  // local lookup may cause are its deferred counter reports (one per
  // ~100 ms at most): far fewer, however slowly this ran.
  const int64_t sent = ServerCounter(daemon, "server.requests") - requests;
  EXPECT_LT(sent, kRounds) << "local lookups went to the daemon";

  EXPECT_EQ(StatsCounter(*client, "engine.local_lookups"), 3 * kRounds);
  EXPECT_EQ(StatsCounter(*client, "engine.lookups"), lookups + 3 * kRounds);
  EXPECT_EQ(StatsCounter(*client, "engine.lookup_keys"), lookup_keys + kRounds * (2 + 6 + 4));
  EXPECT_EQ(StatsCounter(*client, "engine.lookup_hit_blocks"), hit_blocks + kRounds * (2 + 2 + 0));

  // A socket-only lookup is one request, counted by the daemon itself.
  auto socket_only = daemon.ConnectSocketOnly();
  ASSERT_NE(socket_only, nullptr);
  const int64_t before = ServerCounter(daemon, "server.requests");
  EXPECT_EQ(PrefixOf(*socket_only, keys), 2u);
  EXPECT_EQ(ServerCounter(daemon, "server.requests"), before + 1);
  EXPECT_EQ(StatsCounter(*socket_only, "engine.local_lookups"), 3 * kRounds);
}

// A read through the directory refreshes the block's LRU position like a
// pinned read does: the block read survives, the unread older one goes.
TEST(Directory, DirectoryReadsKeepLruOrder) {
  for (const bool use_directory : {true, false}) {
    SCOPED_TRACE(use_directory ? "directory client" : "socket-only client");
    TestDaemonOptions options;
    options.arena_bytes = 8 << 20;
    TestDaemon daemon(options);
    auto client = use_directory ? daemon.Connect() : daemon.ConnectSocketOnly();
    ASSERT_NE(client, nullptr);
    const auto keys = FillArenaWithMiBBlocks(daemon, *client, 103, /*extra=*/2);
    ASSERT_FALSE(::testing::Test::HasFailure());
    const size_t fit = keys.size() - 2;
    ASSERT_GE(fit, 4u);
    const int64_t pins = EngineCounter(daemon, "engine.pins");

    ExpectGet(*client, keys[0], kMiBBlock);  // the oldest becomes the most recent
    EXPECT_EQ(EngineCounter(daemon, "engine.pins"), pins + (use_directory ? 0 : 1));

    // The use (or the release) rides in front of this Put's request.
    ASSERT_TRUE(client->Put(0, keys[fit], Block(keys[fit], kMiBBlock)).ok());
    EXPECT_EQ(PrefixOf(*client, std::span(keys).first(1)), 1u) << "the block just read was evicted";
    EXPECT_EQ(PrefixOf(*client, std::span(keys).subspan(1, 1)), 0u) << "the LRU victim is still cached";
    std::vector<std::byte> dst(kMiBBlock);
    EXPECT_EQ(client->Get(0, keys[1], dst).status().code(), StatusCode::kNotFound);

    ASSERT_TRUE(client->Put(0, keys[fit + 1], Block(keys[fit + 1], kMiBBlock)).ok());
    EXPECT_EQ(PrefixOf(*client, std::span(keys).first(1)), 1u);
    EXPECT_EQ(PrefixOf(*client, std::span(keys).subspan(2, 1)), 0u);
    EXPECT_EQ(PrefixOf(*client, std::span(keys).subspan(3)), fit - 1) << "keys[3 .. fit+2) all cached";
    ExpectGet(*client, keys[0], kMiBBlock);
    EXPECT_EQ(StatsCounter(*client, "engine.evictions"), 2);
    EXPECT_EQ(StatsCounter(*client, "engine.directory_uses"), use_directory ? 2 : 0);
  }
}

// A daemon without a directory: the client uses the socket for everything.
TEST(Directory, DaemonWithoutDirectoryServesThroughTheSocket) {
  TestDaemonOptions options;
  options.directory_slots = -1;
  TestDaemon daemon(options);
  ASSERT_EQ(daemon.host().directory(), nullptr);
  auto client = daemon.Connect();  // would use a directory if offered
  ASSERT_NE(client, nullptr);
  const auto keys = TestKeys(TestNamespace(), 4, 104);
  for (size_t i = 0; i < 3; ++i) ASSERT_TRUE(client->Put(0, keys[i], Block(keys[i], 5000 + i)).ok());

  const int64_t requests = ServerCounter(daemon, "server.requests");
  auto hit = client->Lookup(0, keys);
  ASSERT_TRUE(hit.ok()) << hit.status().ToString();
  EXPECT_EQ(hit->prefix_blocks, 3u);
  EXPECT_EQ(hit->tiers, std::vector<Tier>(3, Tier::kHost));
  EXPECT_EQ(PrefixOf(*client, std::span(keys).subspan(3)), 0u);
  EXPECT_EQ(ServerCounter(daemon, "server.requests"), requests + 2) << "each lookup is a request";

  const int64_t pins = EngineCounter(daemon, "engine.pins");
  for (size_t i = 0; i < 3; ++i) ExpectGet(*client, keys[i], 5000 + i);
  EXPECT_EQ(EngineCounter(daemon, "engine.pins"), pins + 3);
  std::vector<std::byte> dst(8192);
  EXPECT_EQ(client->Get(0, keys[3], dst).status().code(), StatusCode::kNotFound);

  auto stats = client->Stats();
  ASSERT_TRUE(stats.ok());
  for (const auto& c : *stats) {
    EXPECT_NE(c.name.rfind("host.directory.", 0), 0u) << c.name << " without a directory";
    if (c.name == "engine.local_lookups" || c.name == "engine.directory_uses") {
      EXPECT_EQ(c.value, 0) << c.name;
    }
  }
}

// A table at its load limit refuses blocks; those are served through the
// daemon, and while any is unpublished a directory miss is not final.
TEST(Directory, FullDirectoryFallsBackToTheDaemon) {
  TestDaemonOptions options;
  options.directory_slots = 8;  // holds 6 blocks (3/4)
  TestDaemon daemon(options);
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  const auto keys = TestKeys(TestNamespace(), 10, 105);
  auto size_of = [](size_t i) { return size_t{4096} + 512 * i; };
  for (size_t i = 0; i < keys.size(); ++i) ASSERT_TRUE(client->Put(0, keys[i], Block(keys[i], size_of(i))).ok());
  EXPECT_EQ(EngineCounter(daemon, "host.directory.slots"), 8);
  EXPECT_EQ(EngineCounter(daemon, "host.directory.entries"), 6);
  EXPECT_EQ(EngineCounter(daemon, "host.directory.unpublished"), 4);

  const int64_t pins = EngineCounter(daemon, "engine.pins");
  auto hit = client->Lookup(0, keys);  // keys[6..10) unpublished: asked from the daemon
  ASSERT_TRUE(hit.ok()) << hit.status().ToString();
  EXPECT_EQ(hit->prefix_blocks, 10u);
  EXPECT_EQ(hit->tiers, std::vector<Tier>(10, Tier::kHost));

  std::vector<std::vector<std::byte>> out;
  std::vector<std::span<std::byte>> dst;
  for (size_t i = 0; i < keys.size(); ++i) out.emplace_back(16384);
  for (auto& o : out) dst.emplace_back(o);
  auto got = client->GetBatch(0, keys, dst);
  ASSERT_EQ(got.size(), keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE(got[i].ok()) << i << ": " << got[i].status().ToString();
    EXPECT_EQ(*got[i], size_of(i));
    EXPECT_TRUE(CheckBlockBytes(keys[i], 0, std::span(out[i]).first(size_of(i)))) << i;
  }
  EXPECT_EQ(EngineCounter(daemon, "engine.pins"), pins + 4) << "exactly the unpublished blocks are pinned";
  EXPECT_EQ(StatsCounter(*client, "engine.directory_uses"), 6);
  EXPECT_EQ(StatsCounter(*client, "engine.local_lookups"), 0) << "that lookup was not settled locally";

  // Erasing everything forgets the unpublished blocks too: misses are final again.
  auto erased = client->Erase(0, keys);
  ASSERT_TRUE(erased.ok());
  EXPECT_EQ(*erased, keys.size());
  EXPECT_EQ(EngineCounter(daemon, "host.directory.entries"), 0);
  EXPECT_EQ(EngineCounter(daemon, "host.directory.unpublished"), 0);
  const int64_t pin_misses = EngineCounter(daemon, "engine.pin_misses");
  EXPECT_EQ(PrefixOf(*client, keys), 0u);
  std::vector<std::byte> one(16384);
  EXPECT_EQ(client->Get(0, keys[9], one).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(EngineCounter(daemon, "engine.pin_misses"), pin_misses) << "a final miss was asked from the daemon";
  EXPECT_EQ(StatsCounter(*client, "engine.local_lookups"), 1);

  // Room again: new blocks are published.
  for (size_t i = 0; i < 6; ++i) ASSERT_TRUE(client->Put(0, keys[i], Block(keys[i], size_of(i), 3)).ok());
  EXPECT_EQ(EngineCounter(daemon, "host.directory.entries"), 6);
  EXPECT_EQ(EngineCounter(daemon, "host.directory.unpublished"), 0);
  for (size_t i = 0; i < 6; ++i) ExpectGet(*client, keys[i], size_of(i), 3);
}

// Another client's Erase, or an eviction, takes a block out of every
// client's view at once: no stale hit, no stale bytes.
TEST(Directory, EraseAndEvictionVanishAtOnce) {
  {
    TestDaemon daemon;
    auto writer = daemon.Connect();
    auto reader = daemon.Connect();
    ASSERT_NE(writer, nullptr);
    ASSERT_NE(reader, nullptr);
    const auto keys = TestKeys(TestNamespace(), 4, 106);
    for (const auto& k : keys) ASSERT_TRUE(writer->Put(0, k, Block(k, 16384)).ok());
    ExpectGet(*reader, keys[1], 16384);
    EXPECT_EQ(PrefixOf(*reader, keys), 4u);

    auto erased = writer->Erase(0, std::span(keys).subspan(1, 1));
    ASSERT_TRUE(erased.ok());
    EXPECT_EQ(*erased, 1u);
    const int64_t pin_misses = EngineCounter(daemon, "engine.pin_misses");
    std::vector<std::byte> dst(65536);
    EXPECT_EQ(reader->Get(0, keys[1], dst).status().code(), StatusCode::kNotFound);
    EXPECT_EQ(PrefixOf(*reader, keys), 1u);
    EXPECT_EQ(EngineCounter(daemon, "engine.pin_misses"), pin_misses) << "the directory did not settle the miss";

    // Put again with other bytes and another size: the reader sees the new block.
    ASSERT_TRUE(writer->Put(0, keys[1], Block(keys[1], 20000, 7)).ok());
    ExpectGet(*reader, keys[1], 20000, 7);
    EXPECT_EQ(PrefixOf(*reader, keys), 4u);
  }
  {
    TestDaemonOptions options;
    options.arena_bytes = 8 << 20;
    TestDaemon daemon(options);
    auto writer = daemon.Connect();
    auto reader = daemon.Connect();
    ASSERT_NE(writer, nullptr);
    ASSERT_NE(reader, nullptr);
    const auto keys = FillArenaWithMiBBlocks(daemon, *writer, 107, /*extra=*/1);
    ASSERT_FALSE(::testing::Test::HasFailure());
    const size_t fit = keys.size() - 1;
    EXPECT_EQ(PrefixOf(*reader, std::span(keys).first(fit)), fit);
    ASSERT_TRUE(writer->Put(0, keys[fit], Block(keys[fit], kMiBBlock)).ok());  // evicts keys[0]
    std::vector<std::byte> dst(kMiBBlock);
    EXPECT_EQ(reader->Get(0, keys[0], dst).status().code(), StatusCode::kNotFound);
    EXPECT_EQ(PrefixOf(*reader, keys), 0u);
    EXPECT_EQ(PrefixOf(*reader, std::span(keys).subspan(1)), fit);
    ExpectGet(*reader, keys[fit], kMiBBlock);
  }
}

// Clients copy through the directory while others put, erase and evict, so
// extents are recycled under their reads all the time. Every successful read
// is byte-exact and of the key's size.
TEST(Directory, ConcurrentClientsNeverCopyWrongBytes) {
  TestDaemonOptions options;
  options.arena_bytes = 8 << 20;
  TestDaemon daemon(options);
  constexpr int kClients = 6;
  constexpr int kOpsPerClient = 300;
  const uint32_t seed = static_cast<uint32_t>(std::random_device{}());
  SCOPED_TRACE("seed " + std::to_string(seed));
  const auto keys = TestKeys(TestNamespace(), 64, 108);  // ~15 MiB in all: about twice the arena
  std::vector<std::vector<std::byte>> expected;          // FillBlockBytes(key, 0) of the key's size
  for (const auto& k : keys) expected.push_back(Block(k, 4096 + (k.lo % 8) * (64 << 10) + k.hi % 61));
  std::atomic<int> wrong{0}, errors{0}, hits{0};
  auto check = [&](size_t index, const Result<size_t>& r, std::span<const std::byte> dst) {
    if (r.ok()) {
      hits++;
      const auto& want = expected[index];
      if (*r != want.size() || std::memcmp(dst.data(), want.data(), want.size()) != 0) {
        if (wrong++ < 5) ADD_FAILURE() << "key " << index << ": wrong bytes or size " << *r;
      }
    } else if (r.status().code() != StatusCode::kNotFound) {
      if (errors++ < 5) ADD_FAILURE() << "key " << index << ": " << r.status().ToString();
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kClients; ++t) {
    threads.emplace_back([&, t] {
      SCOPED_TRACE("seed " + std::to_string(seed) + ", client " + std::to_string(t));  // traces are per thread
      // One client without the directory: its pins mix in with the directory
      // reads. Half the clients do not verify checksums (the default), so a
      // torn copy shows as wrong bytes rather than as Corruption.
      ClientOptions client_options = daemon.Options();
      client_options.use_directory = t != kClients - 1;
      client_options.verify_checksums = t % 2 == 0;
      auto connected = Client::Connect(client_options);
      if (!connected.ok()) {
        ADD_FAILURE() << "Connect: " << connected.status().ToString();
        return;
      }
      std::unique_ptr<Client> client = std::move(*connected);
      std::mt19937_64 rng(seed + t);
      std::vector<std::vector<std::byte>> out(4, std::vector<std::byte>(512 << 10));
      for (int op = 0; op < kOpsPerClient; ++op) {
        const size_t i = rng() % keys.size();
        const uint64_t what = rng() % 20;
        if (what < 7) {
          Status s = client->Put(0, keys[i], expected[i]);
          if (!s.ok() && s.code() != StatusCode::kNoSpace && errors++ < 5) ADD_FAILURE() << s.ToString();
        } else if (what < 12) {
          check(i, client->Get(0, keys[i], out[0]), out[0]);
        } else if (what < 16) {
          std::vector<BlockKey> batch;
          std::vector<std::span<std::byte>> dst;
          for (size_t j = 0; j < out.size(); ++j) {
            batch.push_back(keys[(i + j) % keys.size()]);
            dst.emplace_back(out[j]);
          }
          auto got = client->GetBatch(0, batch, dst);
          for (size_t j = 0; j < got.size(); ++j) check((i + j) % keys.size(), got[j], out[j]);
        } else if (what < 18) {
          const size_t n = std::min<size_t>(8, keys.size() - i);
          auto r = client->Lookup(0, std::span(keys).subspan(i, n));
          if (!r.ok() || r->prefix_blocks > n || r->tiers != std::vector<Tier>(r->prefix_blocks, Tier::kHost)) {
            if (errors++ < 5) ADD_FAILURE() << "bad lookup: " << r.status().ToString();
          }
        } else {
          auto r = client->Erase(0, std::span(keys).subspan(i, 1));
          if (!r.ok() && errors++ < 5) ADD_FAILURE() << r.status().ToString();
        }
      }
      // Delivers this client's deferred reports before it goes.
      if (!client->Stats().ok()) errors++;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(errors.load(), 0);
  EXPECT_GT(hits.load(), 0);
  EXPECT_GT(EngineCounter(daemon, "engine.evictions"), 0) << "no extent was recycled";
  const int64_t uses = EngineCounter(daemon, "engine.directory_uses");
  EXPECT_GT(uses, 0) << "nothing was read through the directory";
  // Every block read was either pinned or copied through the directory and
  // reported exactly once (a use, or a stale use if it went meanwhile).
  EXPECT_EQ(uses + EngineCounter(daemon, "engine.directory_stale_uses") + EngineCounter(daemon, "engine.pins"),
            hits.load());
  EXPECT_EQ(EngineCounter(daemon, "engine.bad_usage_reports"), 0);
  EXPECT_EQ(EngineCounter(daemon, "engine.leases"), 0);
}

// Polls `call` (every ~1 ms, up to 5 s) until it fails; returns that status,
// or Ok if it never failed.
template <typename Call>
Status EventuallyFails(Call call) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (;;) {
    Status s = call();
    if (!s.ok() || std::chrono::steady_clock::now() > deadline) return s;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void ExpectServesNothingFromADeadDaemon(Client& client, std::span<const BlockKey> keys, size_t size) {
  Status lookup = EventuallyFails([&] {
    auto r = client.Lookup(0, keys);
    return r.ok() ? Status::Ok() : r.status();
  });
  EXPECT_EQ(lookup.code(), StatusCode::kUnavailable)
      << "lookups kept answering from a dead daemon's directory: " << lookup.ToString();
  std::vector<std::byte> dst(size);
  for (int i = 0; i < 3; ++i) {  // and it stays that way
    EXPECT_EQ(client.Lookup(0, keys).status().code(), StatusCode::kUnavailable);
    EXPECT_EQ(client.Get(0, keys[0], dst).status().code(), StatusCode::kUnavailable);
  }
}

// kvtierd killed: its table (still mapped by the client) says nothing anymore.
TEST(Directory, ClientStopsUsingTheDirectoryOfAKilledDaemon) {
  DaemonProcess daemon(KVTIERD_PATH, "", "[host]\ncapacity_bytes = \"64MiB\"\nlock_memory = \"off\"\n");
  ASSERT_TRUE(daemon.running());
  ClientOptions options;
  options.socket_path = daemon.socket_path();
  options.namespaces = {TestNamespace()};
  auto client = Client::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  const auto keys = TestKeys(TestNamespace(), 2, 109);
  for (const auto& k : keys) ASSERT_TRUE((*client)->Put(0, k, Block(k, 4096)).ok());
  EXPECT_EQ(PrefixOf(**client, keys), 2u);
  ExpectGet(**client, keys[0], 4096);
  ASSERT_EQ(StatsCounter(**client, "engine.local_lookups"), 1) << "the directory was not in use";
  ASSERT_EQ(StatsCounter(**client, "engine.directory_uses"), 1);

  EXPECT_EQ(daemon.SignalAndWait(SIGKILL, 10000), -1);
  ExpectServesNothingFromADeadDaemon(**client, keys, 4096);
}

// The in-process daemon shut down and destroyed while a client lives: the
// client keeps its own mappings and fails its calls Unavailable.
TEST(Directory, ClientOutlivesAnInProcessDaemon) {
  auto daemon = std::make_unique<TestDaemon>();
  auto client = daemon->Connect();
  ASSERT_NE(client, nullptr);
  const auto keys = TestKeys(TestNamespace(), 2, 110);
  for (const auto& k : keys) ASSERT_TRUE(client->Put(0, k, Block(k, 4096)).ok());
  EXPECT_EQ(PrefixOf(*client, keys), 2u);
  ExpectGet(*client, keys[0], 4096);
  daemon.reset();
  ExpectServesNothingFromADeadDaemon(*client, keys, 4096);
}

// With an NVMe tier below, a directory miss is never final: a demoted block
// is found by the daemon, and once promoted it is served from the directory.
TEST(Directory, MissesGoToTheDaemonWhenThereIsALowerTier) {
  const std::string dir = MakeTempDir();
  {
    TestDaemonOptions options;
    options.arena_bytes = 4 << 20;
    options.nvme_path = dir + "/tier.dat";
    options.nvme_bytes = 48 << 20;
    options.nvme_region_bytes = 4 << 20;
    TestDaemon daemon(options);
    auto client = daemon.Connect();
    ASSERT_NE(client, nullptr);
    constexpr size_t kBlockBytes = 64 << 10;               // a whole block of TestNamespace()
    const auto keys = TestKeys(TestNamespace(), 80, 111);  // 5 MiB: the first ones are demoted
    for (const auto& k : keys) ASSERT_TRUE(client->Put(0, k, Block(k, kBlockBytes)).ok());
    daemon.engine().WaitForIdle();
    ASSERT_GT(EngineCounter(daemon, "engine.demotions"), 0);

    auto found = client->Lookup(0, keys);
    ASSERT_TRUE(found.ok()) << found.status().ToString();
    ASSERT_EQ(found->prefix_blocks, keys.size());
    EXPECT_EQ(found->tiers.front(), Tier::kNvme);
    EXPECT_EQ(found->tiers.back(), Tier::kHost);

    const int64_t pins = EngineCounter(daemon, "engine.pins");
    ExpectGet(*client, keys[0], kBlockBytes);  // promoted through a Pin
    EXPECT_EQ(EngineCounter(daemon, "engine.pins"), pins + 1);
    ExpectGet(*client, keys[0], kBlockBytes);  // now a published host block
    EXPECT_EQ(EngineCounter(daemon, "engine.pins"), pins + 1);
    EXPECT_EQ(StatsCounter(*client, "engine.directory_uses"), 1);
  }
  RemoveTree(dir);
}

}  // namespace
}  // namespace kvtier::testing

// Client <-> daemon end to end: the data path through the shared arena.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <string>
#include <chrono>
#include <future>
#include <cstring>
#include <random>
#include <thread>

#include "common/counters.h"
#include "tests/testing/test_daemon.h"

namespace kvtier::testing {
namespace {

TEST(ClientDaemon, PutLookupGetRoundTrip) {
  TestDaemon daemon;
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  auto keys = TestKeys(TestNamespace(), 4, 1);

  auto miss = client->Lookup(0, keys);
  ASSERT_TRUE(miss.ok()) << miss.status().ToString();
  EXPECT_EQ(miss->prefix_blocks, 0u);

  for (size_t i = 0; i < 3; ++i) {
    auto bytes = Block(keys[i], 256 << 10);
    ASSERT_TRUE(client->Put(0, keys[i], bytes).ok());
  }
  auto hit = client->Lookup(0, keys);
  ASSERT_TRUE(hit.ok());
  EXPECT_EQ(hit->prefix_blocks, 3u);
  ASSERT_EQ(hit->tiers.size(), 3u);
  for (Tier t : hit->tiers) EXPECT_EQ(t, Tier::kHost);

  std::vector<std::byte> dst(256 << 10);
  for (size_t i = 0; i < 3; ++i) {
    auto got = client->Get(0, keys[i], dst);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, dst.size());
    EXPECT_TRUE(CheckBlockBytes(keys[i], 0, dst));
  }
  auto missing = client->Get(0, keys[3], dst);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

// The resident bytes of this process's mapping that starts at `base`
// (/proc/self/smaps' Rss), or -1 when there is none.
int64_t ResidentBytesOfMapping(const void* base) {
  std::ifstream smaps("/proc/self/smaps");
  char start[32];
  std::snprintf(start, sizeof start, "%lx-", reinterpret_cast<unsigned long>(base));
  bool in = false;
  for (std::string line; std::getline(smaps, line);) {
    if (line.rfind(start, 0) == 0) in = true;
    if (in && line.rfind("Rss:", 0) == 0) return std::stoll(line.substr(4)) * 1024;
  }
  return -1;
}

// A client that connects while the arena is still being allocated
// prefaults only what the daemon had allocated (its Hello says how much):
// a fault on a page the daemon has not allocated would allocate it,
// charged to the client. Its mapping's resident bytes after the connect
// are far below the arena's 1 GiB (a client that populated its whole
// mapping would have all of it resident); puts work meanwhile.
TEST(ClientDaemon, AClientPrefaultsOnlyWhatTheDaemonAllocated) {
  TestDaemonOptions options;
  options.arena_bytes = 1ull << 30;
  options.allocate_at_start_bytes = 4ull << 20;
  TestDaemon daemon(options);
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  const int64_t resident = ResidentBytesOfMapping(client->arena().data());
  ASSERT_GE(resident, 0) << "no mapping at the client's arena";
  EXPECT_LT(resident, int64_t{512} << 20);
  auto keys = TestKeys(TestNamespace(), 2, 1);
  for (const BlockKey& key : keys) ASSERT_TRUE(client->Put(0, key, Block(key, 256 << 10)).ok());
  std::vector<std::byte> dst(256 << 10);
  for (const BlockKey& key : keys) {
    ASSERT_TRUE(client->Get(0, key, dst).ok());
    EXPECT_TRUE(CheckBlockBytes(key, 0, dst));
  }
}

TEST(ClientDaemon, LookupStopsAtFirstMiss) {
  TestDaemon daemon;
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  auto keys = TestKeys(TestNamespace(), 5, 2);
  for (size_t i : {0, 1, 3, 4}) ASSERT_TRUE(client->Put(0, keys[i], Block(keys[i], 4096)).ok());
  auto hit = client->Lookup(0, keys);
  ASSERT_TRUE(hit.ok());
  EXPECT_EQ(hit->prefix_blocks, 2u);
}

TEST(ClientDaemon, PutIsIdempotent) {
  TestDaemon daemon;
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  auto keys = TestKeys(TestNamespace(), 1, 3);
  ASSERT_TRUE(client->Put(0, keys[0], Block(keys[0], 8192)).ok());
  ASSERT_TRUE(client->Put(0, keys[0], Block(keys[0], 8192, 99)).ok());
  std::vector<std::byte> dst(8192);
  ASSERT_TRUE(client->Get(0, keys[0], dst).ok());
  EXPECT_TRUE(CheckBlockBytes(keys[0], 0, dst)) << "the first put wins";
  EXPECT_EQ(StatsCounter(*client, "engine.commits"), 1);
}

TEST(ClientDaemon, ZeroCopyReserveCommitAndPinnedView) {
  TestDaemon daemon;
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  auto keys = TestKeys(TestNamespace(), 2, 4);
  std::vector<uint64_t> sizes = {100000, 200000};
  auto reservation = client->Reserve(0, keys, sizes);
  ASSERT_TRUE(reservation.ok()) << reservation.status().ToString();
  for (auto& b : reservation->blocks()) {
    ASSERT_TRUE(b.status.ok());
    FillBlockBytes(b.key, 7, b.data);
  }
  EXPECT_EQ(client->Lookup(0, keys)->prefix_blocks, 0u) << "invisible before Commit";
  for (const Status& s : reservation->Commit()) EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(client->Lookup(0, keys)->prefix_blocks, 2u);

  auto views = client->Pin(0, keys);
  ASSERT_EQ(views.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    ASSERT_TRUE(views[i].ok()) << views[i].status().ToString();
    EXPECT_EQ(views[i]->data().size(), sizes[i]);
    EXPECT_TRUE(CheckBlockBytes(keys[i], 7, views[i]->data()));
  }
  EXPECT_EQ(StatsCounter(*client, "engine.pinned_blocks"), 2);
  EXPECT_TRUE(views[0]->Release().ok());
  views.clear();  // RAII releases the other
  // The destructor's release is not waited for; a later call is ordered after it.
  EXPECT_EQ(StatsCounter(*client, "engine.pinned_blocks"), 0);
}

TEST(ClientDaemon, BatchesAndAsyncVariants) {
  TestDaemon daemon;
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  auto keys = TestKeys(TestNamespace(), 8, 5);
  std::vector<std::vector<std::byte>> blocks;
  std::vector<std::span<const std::byte>> spans;
  for (const auto& k : keys) blocks.push_back(Block(k, 65536));
  for (const auto& b : blocks) spans.emplace_back(b);
  auto put = client->PutBatchAsync(0, keys, spans).get();
  for (const Status& s : put) EXPECT_TRUE(s.ok()) << s.ToString();

  auto lookup = client->LookupAsync(0, keys).get();
  ASSERT_TRUE(lookup.ok());
  EXPECT_EQ(lookup->prefix_blocks, keys.size());

  std::vector<std::vector<std::byte>> out(keys.size(), std::vector<std::byte>(65536));
  std::vector<std::span<std::byte>> dst;
  for (auto& o : out) dst.emplace_back(o);
  auto got = client->GetBatchAsync(0, keys, dst).get();
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE(got[i].ok()) << got[i].status().ToString();
    EXPECT_TRUE(CheckBlockBytes(keys[i], 0, out[i]));
  }
  auto sync = client->GetBatch(0, keys, dst);
  for (auto& r : sync) EXPECT_TRUE(r.ok());
}

TEST(ClientDaemon, EraseRemovesAndPinnedEraseWaitsForRelease) {
  TestDaemon daemon;
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  auto keys = TestKeys(TestNamespace(), 2, 6);
  for (const auto& k : keys) ASSERT_TRUE(client->Put(0, k, Block(k, 1 << 20)).ok());
  auto views = client->Pin(0, std::span(keys).first(1));
  ASSERT_TRUE(views[0].ok());
  auto erased = client->Erase(0, keys);
  ASSERT_TRUE(erased.ok());
  EXPECT_EQ(*erased, 2u);
  EXPECT_EQ(client->Lookup(0, keys)->prefix_blocks, 0u);
  EXPECT_TRUE(CheckBlockBytes(keys[0], 0, views[0]->data())) << "a pinned view stays readable";
  const uint64_t used_while_pinned = daemon.host().used_bytes();
  EXPECT_GE(used_while_pinned, 1u << 20);
  EXPECT_TRUE(views[0]->Release().ok());
  EXPECT_EQ(daemon.host().used_bytes(), 0u);
}

TEST(ClientDaemon, NamespacesAreIsolated) {
  TestDaemon daemon;
  auto a = TestNamespace("rev-a");
  auto b = TestNamespace("rev-b");
  auto client = daemon.Connect({a, b});
  ASSERT_NE(client, nullptr);
  ASSERT_EQ(client->namespaces().size(), 2u);
  EXPECT_NE(client->namespaces()[0], client->namespaces()[1]);
  auto keys = TestKeys(a, 1, 7);
  ASSERT_TRUE(client->Put(0, keys[0], Block(keys[0], 4096)).ok());
  EXPECT_EQ(client->Lookup(0, keys)->prefix_blocks, 1u);
  EXPECT_EQ(client->Lookup(1, keys)->prefix_blocks, 0u) << "same key, other namespace: a miss";
}

TEST(ClientDaemon, LruEvictsUnderPressureAndKeepsPinned) {
  TestDaemonOptions options;
  options.arena_bytes = 8 << 20;
  TestDaemon daemon(options);
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  auto keys = TestKeys(TestNamespace(), 12, 8);
  for (size_t i = 0; i < 4; ++i) ASSERT_TRUE(client->Put(0, keys[i], Block(keys[i], 1 << 20)).ok());
  auto pinned = client->Pin(0, std::span(keys).first(1));  // keys[0] pinned
  ASSERT_TRUE(pinned[0].ok());
  std::vector<std::byte> dst(1 << 20);
  ASSERT_TRUE(client->Get(0, keys[1], dst).ok());  // keys[1] most recent
  for (size_t i = 4; i < 12; ++i) ASSERT_TRUE(client->Put(0, keys[i], Block(keys[i], 1 << 20)).ok());
  EXPECT_TRUE(client->Get(0, keys[0], dst).ok()) << "pinned block was evicted";
  EXPECT_TRUE(CheckBlockBytes(keys[0], 0, dst));
  EXPECT_EQ(client->Get(0, keys[2], dst).status().code(), StatusCode::kNotFound) << "LRU victim kept";
  EXPECT_GT(StatsCounter(*client, "engine.evictions"), 0);
}

// Thousands of views dropped at once send thousands of Releases nobody waits
// for; their answers must be drained, or they fill the socket and both
// sides block. A later call has to complete.
TEST(ClientDaemon, ManyDroppedViewsDoNotStallTheConnection) {
  TestDaemon daemon;
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  auto keys = TestKeys(TestNamespace(), 4000, 10);
  std::vector<std::byte> block(4096);
  for (const auto& k : keys) ASSERT_TRUE(client->Put(0, k, block).ok());
  auto finished = std::async(std::launch::async, [&] {
    for (int round = 0; round < 10; ++round) {
      auto views = client->Pin(0, keys);
      for (auto& v : views) EXPECT_TRUE(v.ok());
    }  // every view released by its destructor, unwaited
    return client->Lookup(0, keys);
  });
  ASSERT_EQ(finished.wait_for(std::chrono::seconds(30)), std::future_status::ready)
      << "the connection stalled on unread Release answers";
  auto hit = finished.get();
  ASSERT_TRUE(hit.ok()) << hit.status().ToString();
  EXPECT_EQ(hit->prefix_blocks, keys.size());
  EXPECT_EQ(StatsCounter(*client, "engine.pinned_blocks"), 0);
}

// A copying Get releases its lease without a round trip of its own: the
// Release rides in front of the connection's next request. Here the next
// request needs exactly the space that release frees.
TEST(ClientDaemon, DeferredReleaseRidesAheadOfTheNextRequest) {
  TestDaemonOptions options;
  options.arena_bytes = 8 << 20;
  TestDaemon daemon(options);
  auto client = daemon.ConnectSocketOnly();  // its Get pins (a directory read would not)
  ASSERT_NE(client, nullptr);
  constexpr uint64_t kBlockBytes = kMiBBlock;
  const auto keys = FillArenaWithMiBBlocks(daemon, *client, 14, /*extra=*/1);
  const size_t fit = keys.size() - 1;
  ASSERT_FALSE(::testing::Test::HasFailure());
  // Every block but the last stays pinned through views.
  auto views = client->Pin(0, std::span(keys).first(fit - 1));
  for (auto& v : views) ASSERT_TRUE(v.ok()) << v.status().ToString();
  std::vector<std::byte> dst(kBlockBytes);
  ASSERT_TRUE(client->Get(0, keys[fit - 1], dst).ok());  // pins, copies, defers the release
  // Evicting keys[fit - 1] is the only way to make room.
  Status put = client->Put(0, keys[fit], Block(keys[fit], kBlockBytes));
  EXPECT_TRUE(put.ok()) << put.ToString() << ": the Get's release did not reach the daemon first";
  auto hit = client->Lookup(0, std::span(keys).subspan(fit - 1, 1));
  ASSERT_TRUE(hit.ok());
  EXPECT_EQ(hit->prefix_blocks, 0u) << "keys[fit - 1] should have been evicted";
}

// With no further request, a deferred release still reaches the daemon,
// within milliseconds: a block a client has finished reading must not stay
// unevictable while the client is idle.
TEST(ClientDaemon, DeferredReleaseIsSentWhenTheClientGoesIdle) {
  TestDaemon daemon;
  auto client = daemon.ConnectSocketOnly();  // its Gets pin (a directory read would not)
  ASSERT_NE(client, nullptr);
  auto keys = TestKeys(TestNamespace(), 3, 15);
  std::vector<std::byte> dst(4096);
  for (const auto& k : keys) ASSERT_TRUE(client->Put(0, k, Block(k, dst.size())).ok());
  auto leases = [&daemon] {
    CounterCollector c;
    daemon.engine().VisitCounters(c);
    for (const auto& [name, value] : c.counters()) {
      if (name == "engine.leases") return value;
    }
    return int64_t{-1};
  };
  for (int round = 0; round < 2; ++round) {  // the second round after the sender went quiet
    for (const auto& k : keys) ASSERT_TRUE(client->Get(0, k, dst).ok());
    { auto view = client->Pin(0, std::span(keys).first(1)); }  // dropped view: deferred too
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (leases() != 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_EQ(leases(), 0) << "round " << round << ": deferred releases were never sent";
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

// 8 clients put, look up and get concurrently; every byte read is checked
// ("may miss, never wrong").
TEST(ClientDaemon, EightConcurrentClientsNeverSeeWrongBytes) {
  TestDaemonOptions options;
  options.arena_bytes = 32 << 20;  // small enough to force evictions
  TestDaemon daemon(options);
  constexpr int kClients = 8;
  constexpr int kOpsPerClient = 300;
  const uint32_t seed = static_cast<uint32_t>(std::random_device{}());
  SCOPED_TRACE("seed " + std::to_string(seed));
  auto shared_keys = TestKeys(TestNamespace(), 64, 9);
  std::atomic<int> failures{0}, hits{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      auto client = Client::Connect(daemon.Options());
      if (!client.ok()) {
        failures++;
        return;
      }
      std::mt19937 rng(seed + c);
      std::vector<std::byte> dst(1 << 20);
      for (int op = 0; op < kOpsPerClient; ++op) {
        const BlockKey& key = shared_keys[rng() % shared_keys.size()];
        const size_t size = 4096 + (key.lo % 16) * 65536;  // size is a function of the key
        switch (rng() % 3) {
          case 0: {
            Status s = (*client)->Put(0, key, Block(key, size));
            if (!s.ok() && s.code() != StatusCode::kNoSpace) failures++;
            break;
          }
          case 1: {
            auto r = (*client)->Lookup(0, std::span(&key, 1));
            if (!r.ok()) failures++;
            break;
          }
          default: {
            auto r = (*client)->Get(0, key, dst);
            if (r.ok()) {
              hits++;
              if (*r != size || !CheckBlockBytes(key, 0, std::span(dst).first(size))) failures++;
            } else if (r.status().code() != StatusCode::kNotFound) {
              failures++;
            }
          }
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GT(hits.load(), 0);
}

}  // namespace
}  // namespace kvtier::testing

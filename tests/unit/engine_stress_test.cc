// A concurrent stress of Engine over the host tier: threads reserve,
// commit, pin, release, erase and abort at random on shared and private
// keys; the space invariant (arena use equals what the index holds) and
// every pinned block's bytes are checked. KVTIER_TEST_SEED picks the seed.
#include "daemon/engine/engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/checksum.h"
#include "common/counters.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/test_daemon.h"
#include "tiers/host/arena_allocator.h"
#include "tiers/host/host_tier.h"

namespace kvtier {
namespace {

using ::kvtier::testing::CheckBlockBytes;
using ::kvtier::testing::FakeClock;
using ::kvtier::testing::FillBlockBytes;
using ::kvtier::testing::TestNamespace;

constexpr uint64_t kBlockBytes = 4096;  // one allocator class exactly

BlockKey Key(uint64_t i) { return BlockKey{0x5eed'0000'0000'0002ULL, i}; }

TEST(EngineStressTest, ConcurrentOpsKeepTheSpaceInvariant) {
  uint32_t seed = 4242;
  if (const char* env = std::getenv("KVTIER_TEST_SEED")) seed = std::strtoul(env, nullptr, 10);
  std::printf("EngineStressTest seed=%u\n", seed);
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);

  FakeClock clock;
  auto host = ::kvtier::testing::OpenTestHostTier(48 * kBlockBytes);
  ASSERT_NE(host, nullptr);
  auto created = Engine::Create(EngineOptions{8, EvictionPolicyId::kLru}, *host, clock);
  ASSERT_TRUE(created.ok());
  Engine& engine = **created;
  const NamespaceFingerprint ns = FingerprintNamespace(TestNamespace());

  constexpr int kThreads = 4;
  constexpr int kOps = 20000;
  constexpr uint64_t kPrivateKeys = 24;
  constexpr uint64_t kSharedKeys = 12;
  const uint64_t kSizes[] = {1000, kBlockBytes, 6000, 3 * kBlockBytes};
  std::vector<BlockKey> all_keys;
  for (uint64_t i = 0; i < kSharedKeys + kThreads * kPrivateKeys; ++i) all_keys.push_back(Key(i));

  std::atomic<int> bad_reads{0};
  std::atomic<int> unexpected{0};
  auto worker = [&](int t) {
    const ConnectionId connection = 10 + t;
    std::mt19937 rng(seed + t);
    std::vector<LeaseId> held;
    auto pick_key = [&]() {
      if (rng() % 2 == 0) return Key(rng() % kSharedKeys);
      return Key(kSharedKeys + t * kPrivateKeys + rng() % kPrivateKeys);
    };
    for (int op = 0; op < kOps; ++op) {
      clock.AdvanceUs(1);
      const BlockKey key = pick_key();
      switch (rng() % 6) {
        case 0:
        case 1: {  // put (sometimes abort instead of commit)
          const uint64_t size = kSizes[rng() % 4];
          auto g = engine.Reserve(connection, ns, {&key, 1}, {&size, 1});
          if (!g[0].status.ok()) {
            if (g[0].status.code() != StatusCode::kAlreadyExists && g[0].status.code() != StatusCode::kNoSpace) {
              ++unexpected;
            }
            break;
          }
          FillBlockBytes(key, size, ::kvtier::testing::SlotBytes(*host, g[0].offset, g[0].length));
          if (rng() % 8 == 0) {
            if (engine.Abort(connection, {&key, 1}) != 1) ++unexpected;
          } else if (!engine.Commit(connection, ns, {&key, 1}, {&size, 1})[0].ok()) {
            ++unexpected;
          }
          break;
        }
        case 2: {  // pin and verify
          PinGrant g = engine.Pin(connection, ns, {&key, 1})[0];
          if (!g.status.ok()) {
            if (g.status.code() != StatusCode::kNotFound) ++unexpected;
            break;
          }
          auto bytes = ::kvtier::testing::SlotBytes(*host, g.offset, g.length);
          if (!CheckBlockBytes(key, g.length, bytes) || BlockChecksum(bytes) != g.checksum) {
            ++bad_reads;
          }
          held.push_back(g.lease);
          break;
        }
        case 3: {  // release the oldest held lease
          if (held.empty() || held.size() < 3) break;
          const LeaseId lease = held.front();
          held.erase(held.begin());
          if (!engine.Release(connection, {&lease, 1})[0].ok()) ++unexpected;
          break;
        }
        case 4:
          engine.Erase(ns, {&key, 1});
          break;
        case 5:
          engine.Lookup(ns, {&key, 1});
          break;
      }
    }
    // Half the threads release explicitly, the others by closing the connection.
    if (t % 2 == 0) {
      for (const Status& s : engine.Release(connection, held)) {
        if (!s.ok()) ++unexpected;
      }
    }
    engine.CloseConnection(connection);
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (auto& th : threads) th.join();

  EXPECT_EQ(bad_reads.load(), 0);
  EXPECT_EQ(unexpected.load(), 0);
  auto c = ::kvtier::testing::EngineCounters(engine);
  EXPECT_EQ(c["engine.pinned_blocks"], 0);
  EXPECT_EQ(c["engine.leases"], 0);
  EXPECT_EQ(c["engine.zombie_blocks"], 0);
  EXPECT_EQ(c["engine.reserved_blocks"], 0);
  EXPECT_GT(c["engine.evictions"], 0) << "the arena was meant to overflow";

  // used bytes == sum of live extents: pin every key once to see what lives.
  const ConnectionId checker = 99;
  auto grants = engine.Pin(checker, ns, all_keys);
  uint64_t live_extent_bytes = 0, stored = 0;
  int64_t live = 0;
  std::set<uint64_t> offsets;
  for (size_t i = 0; i < grants.size(); ++i) {
    if (!grants[i].status.ok()) continue;
    ++live;
    live_extent_bytes += ArenaAllocator::ClassSize(grants[i].length);
    stored += grants[i].length;
    EXPECT_TRUE(offsets.insert(grants[i].offset).second) << "two blocks share an offset";
    EXPECT_TRUE(CheckBlockBytes(all_keys[i], grants[i].length,
                                ::kvtier::testing::SlotBytes(*host, grants[i].offset, grants[i].length)))
        << all_keys[i].ToHex();
  }
  EXPECT_EQ(live, c["engine.blocks"]);
  EXPECT_EQ(static_cast<int64_t>(stored), c["engine.stored_bytes"]);
  EXPECT_EQ(host->used_bytes(), live_extent_bytes);
  EXPECT_EQ(c["host.alloc.used_bytes"], static_cast<int64_t>(live_extent_bytes));
  EXPECT_EQ(c["host.alloc.allocations"], live);
  engine.CloseConnection(checker);
  EXPECT_EQ(::kvtier::testing::EngineCounters(engine)["engine.pinned_blocks"], 0);
  EXPECT_EQ(host->used_bytes(), live_extent_bytes);
}

}  // namespace
}  // namespace kvtier

// Tests of Engine, the block index over the host tier: the Reserve ->
// Commit -> Pin -> Release life cycle, errors, zombies, eviction order across
// shards and counters (the concurrent stress is engine_stress_test.cc).
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

BlockKey Key(uint64_t i) { return BlockKey{0x5eed'0000'0000'0001ULL, i}; }

std::map<std::string, int64_t> Counters(const Engine& engine) {
  CounterCollector collector;
  engine.VisitCounters(collector);
  std::map<std::string, int64_t> out;
  for (const auto& [name, value] : collector.counters()) out[name] = value;
  return out;
}

class EngineTest : public ::testing::Test {
 protected:
  // An engine over an arena of `blocks` 4 KiB blocks.
  void Make(uint64_t blocks, uint32_t shards = 1, EvictionPolicyId eviction = EvictionPolicyId::kLru) {
    engine_.reset();
    host_ = ::kvtier::testing::OpenTestHostTier(blocks * kBlockBytes);
    ASSERT_NE(host_, nullptr);
    auto engine = Engine::Create(EngineOptions{shards, eviction}, *host_, clock_);
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    engine_ = std::move(*engine);
  }

  void SetUp() override { Make(16); }

  // Reserve, fill with self-describing bytes (salt), Commit. The clock moves
  // one microsecond first so that every commit has its own time.
  Status Put(ConnectionId connection, const BlockKey& key, uint64_t size = kBlockBytes, uint64_t salt = 1,
             const NamespaceFingerprint* ns = nullptr) {
    const NamespaceFingerprint& fp = ns != nullptr ? *ns : ns_;
    clock_.AdvanceUs(1);
    auto grants = engine_->Reserve(connection, fp, {&key, 1}, {&size, 1});
    if (!grants[0].status.ok()) return grants[0].status;
    FillBlockBytes(key, salt, ::kvtier::testing::SlotBytes(*host_, grants[0].offset, grants[0].length));
    return engine_->Commit(connection, fp, {&key, 1}, {&size, 1})[0];
  }

  PinGrant PinOne(ConnectionId connection, const BlockKey& key) { return engine_->Pin(connection, ns_, {&key, 1})[0]; }

  Status ReleaseOne(ConnectionId connection, LeaseId lease) { return engine_->Release(connection, {&lease, 1})[0]; }

  // A use: pin then release, with the clock moving.
  void Touch(const BlockKey& key) {
    clock_.AdvanceUs(1);
    PinGrant g = PinOne(kReader, key);
    ASSERT_TRUE(g.status.ok()) << g.status.ToString();
    clock_.AdvanceUs(1);
    ASSERT_TRUE(ReleaseOne(kReader, g.lease).ok());
  }

  bool Cached(const BlockKey& key) { return engine_->Lookup(ns_, {&key, 1}).prefix_blocks == 1; }

  int64_t Counter(const std::string& name) {
    auto all = Counters(*engine_);
    auto it = all.find(name);
    EXPECT_NE(it, all.end()) << name;
    return it == all.end() ? -1 : it->second;
  }

  static constexpr ConnectionId kWriter = 1;
  static constexpr ConnectionId kOther = 2;
  static constexpr ConnectionId kReader = 3;

  FakeClock clock_;
  std::unique_ptr<HostTier> host_;
  std::unique_ptr<Engine> engine_;
  const NamespaceFingerprint ns_ = FingerprintNamespace(TestNamespace("rev-1"));
  const NamespaceFingerprint ns2_ = FingerprintNamespace(TestNamespace("rev-2"));
};

// (A bad policy name is the config's error: config_test's BadChoiceIsRejected.)
TEST_F(EngineTest, CreateRejectsBadShardCounts) {
  auto host = ::kvtier::testing::OpenTestHostTier(16 * kBlockBytes);
  ASSERT_NE(host, nullptr);
  for (uint32_t shards : {0u, 257u, 300u}) {
    auto e = Engine::Create(EngineOptions{shards, EvictionPolicyId::kLru}, *host, clock_);
    ASSERT_FALSE(e.ok()) << shards;
    EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(e.status().message().find("shards"), std::string::npos) << e.status().message();
  }
  for (uint32_t shards : {1u, 256u}) {
    EXPECT_TRUE(Engine::Create(EngineOptions{shards, EvictionPolicyId::kLru}, *host, clock_).ok()) << shards;
  }
  EXPECT_TRUE(Engine::Create(EngineOptions{4, EvictionPolicyId::kFifo}, *host, clock_).ok());
}

TEST_F(EngineTest, ReserveCommitLookupPinReleaseCycle) {
  const BlockKey key = Key(1);
  const uint64_t size = 5000;  // class 8 KiB
  auto grants = engine_->Reserve(kWriter, ns_, {&key, 1}, {&size, 1});
  ASSERT_EQ(grants.size(), 1u);
  ASSERT_TRUE(grants[0].status.ok()) << grants[0].status.ToString();
  EXPECT_EQ(grants[0].length, size);
  EXPECT_EQ(host_->used_bytes(), ArenaAllocator::ClassSize(size));
  // Reserved blocks are invisible.
  EXPECT_EQ(engine_->Lookup(ns_, {&key, 1}).prefix_blocks, 0u);
  EXPECT_EQ(PinOne(kReader, key).status.code(), StatusCode::kNotFound);

  auto bytes = ::kvtier::testing::SlotBytes(*host_, grants[0].offset, grants[0].length);
  FillBlockBytes(key, 7, bytes);
  auto commits = engine_->Commit(kWriter, ns_, {&key, 1}, {&size, 1});
  ASSERT_EQ(commits.size(), 1u);
  ASSERT_TRUE(commits[0].ok()) << commits[0].ToString();

  LookupOutcome found = engine_->Lookup(ns_, {&key, 1});
  EXPECT_EQ(found.prefix_blocks, 1u);
  EXPECT_EQ(found.tiers, std::vector<Tier>{Tier::kHost});

  PinGrant pin = PinOne(kReader, key);
  ASSERT_TRUE(pin.status.ok()) << pin.status.ToString();
  EXPECT_EQ(pin.offset, grants[0].offset);
  EXPECT_EQ(pin.length, size);
  EXPECT_NE(pin.lease, 0u);
  EXPECT_TRUE(CheckBlockBytes(key, 7, ::kvtier::testing::SlotBytes(*host_, pin.offset, pin.length)));
  EXPECT_EQ(Counter("engine.pinned_blocks"), 1);
  EXPECT_EQ(Counter("engine.leases"), 1);

  EXPECT_TRUE(ReleaseOne(kReader, pin.lease).ok());
  EXPECT_EQ(Counter("engine.pinned_blocks"), 0);
  EXPECT_EQ(Counter("engine.leases"), 0);
  // Still cached after release.
  EXPECT_TRUE(Cached(key));
  EXPECT_EQ(host_->used_bytes(), ArenaAllocator::ClassSize(size));
}

TEST_F(EngineTest, ChecksumIsXxh3OfTheBytesAndReturnedByPin) {
  const BlockKey a = Key(1), b = Key(2);
  ASSERT_TRUE(Put(kWriter, a, 10000, /*salt=*/1).ok());
  ASSERT_TRUE(Put(kWriter, b, 10000, /*salt=*/2).ok());
  PinGrant pa = PinOne(kReader, a);
  PinGrant pb = PinOne(kReader, b);
  ASSERT_TRUE(pa.status.ok());
  ASSERT_TRUE(pb.status.ok());
  std::vector<std::byte> expected(10000);
  FillBlockBytes(a, 1, expected);
  EXPECT_EQ(pa.checksum, BlockChecksum(expected));
  EXPECT_EQ(pa.checksum, BlockChecksum(::kvtier::testing::SlotBytes(*host_, pa.offset, pa.length)));
  FillBlockBytes(b, 2, expected);
  EXPECT_EQ(pb.checksum, BlockChecksum(expected));
  EXPECT_NE(pa.checksum, pb.checksum);
  // The checksum covers the committed size only, not the class padding.
  EXPECT_EQ(pa.length, 10000u);
}

TEST_F(EngineTest, LookupReturnsLongestConsecutivePrefix) {
  for (uint64_t i : {0, 1, 2, 4}) ASSERT_TRUE(Put(kWriter, Key(i)).ok());
  std::vector<BlockKey> chain = {Key(0), Key(1), Key(2), Key(3), Key(4)};
  LookupOutcome out = engine_->Lookup(ns_, chain);
  EXPECT_EQ(out.prefix_blocks, 3u);
  EXPECT_EQ(out.tiers.size(), 3u);
  std::vector<BlockKey> starts_with_miss = {Key(3), Key(4)};
  EXPECT_EQ(engine_->Lookup(ns_, starts_with_miss).prefix_blocks, 0u);
  std::vector<BlockKey> reordered = {Key(2), Key(0), Key(4)};
  EXPECT_EQ(engine_->Lookup(ns_, reordered).prefix_blocks, 3u);
  EXPECT_EQ(engine_->Lookup(ns_, {}).prefix_blocks, 0u);
}

TEST_F(EngineTest, EverythingIsScopedToTheNamespace) {
  const BlockKey key = Key(1);
  ASSERT_TRUE(Put(kWriter, key).ok());
  EXPECT_EQ(engine_->Lookup(ns2_, {&key, 1}).prefix_blocks, 0u);
  EXPECT_EQ(engine_->Pin(kReader, ns2_, {&key, 1})[0].status.code(), StatusCode::kNotFound);
  EXPECT_EQ(engine_->Erase(ns2_, {&key, 1}), 0u);
  EXPECT_TRUE(Cached(key));

  // A reservation made under ns cannot be committed under ns2.
  const BlockKey other = Key(2);
  const uint64_t size = kBlockBytes;
  ASSERT_TRUE(engine_->Reserve(kWriter, ns_, {&other, 1}, {&size, 1})[0].status.ok());
  EXPECT_EQ(engine_->Commit(kWriter, ns2_, {&other, 1}, {&size, 1})[0].code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(engine_->Commit(kWriter, ns_, {&other, 1}, {&size, 1})[0].ok());
}

TEST_F(EngineTest, ReserveOfExistingKeyIsAlreadyExists) {
  const BlockKey committed = Key(1), writing = Key(2);
  ASSERT_TRUE(Put(kWriter, committed).ok());
  const uint64_t size = kBlockBytes;
  ASSERT_TRUE(engine_->Reserve(kWriter, ns_, {&writing, 1}, {&size, 1})[0].status.ok());
  const uint64_t used = host_->used_bytes();

  for (ConnectionId s : {kWriter, kOther}) {
    auto g = engine_->Reserve(s, ns_, {&committed, 1}, {&size, 1});
    EXPECT_EQ(g[0].status.code(), StatusCode::kAlreadyExists);
    EXPECT_NE(g[0].status.message().find("cached"), std::string::npos) << g[0].status.message();
    g = engine_->Reserve(s, ns_, {&writing, 1}, {&size, 1});
    EXPECT_EQ(g[0].status.code(), StatusCode::kAlreadyExists);
    EXPECT_NE(g[0].status.message().find("being written"), std::string::npos) << g[0].status.message();
  }
  EXPECT_EQ(host_->used_bytes(), used);
  // The failed attempts did not disturb the original reservation.
  EXPECT_TRUE(engine_->Commit(kWriter, ns_, {&writing, 1}, {&size, 1})[0].ok());
}

TEST_F(EngineTest, ReserveRejectsBadSizesPerKey) {
  std::vector<BlockKey> keys = {Key(1), Key(2), Key(3)};
  std::vector<uint64_t> sizes = {0, kBlockBytes, host_->capacity_bytes() + 1};
  auto grants = engine_->Reserve(kWriter, ns_, keys, sizes);
  ASSERT_EQ(grants.size(), 3u);
  EXPECT_EQ(grants[0].status.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(grants[1].status.ok());
  EXPECT_EQ(grants[2].status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Counter("engine.reserved_blocks"), 1);
}

// A block no larger than the arena in bytes can still need an allocator
// class larger than the arena (above 64 KiB classes are 25% apart). Such a
// block can never be stored: it must be refused up front, not after
// evicting every cached block trying to make room.
TEST_F(EngineTest, ReserveOfBlockWhoseClassExceedsTheArenaEvictsNothing) {
  Make(17);  // 68 KiB
  for (uint64_t i = 0; i < 16; ++i) ASSERT_TRUE(Put(kWriter, Key(i)).ok());
  const uint64_t size = 66000;  // <= 68 KiB, but its class is 80 KiB
  ASSERT_LE(size, host_->capacity_bytes());
  ASSERT_GT(ArenaAllocator::ClassSize(size), host_->capacity_bytes());
  const BlockKey big = Key(100);
  auto g = engine_->Reserve(kWriter, ns_, {&big, 1}, {&size, 1});
  EXPECT_EQ(g[0].status.code(), StatusCode::kInvalidArgument) << g[0].status.ToString();
  EXPECT_EQ(Counter("engine.evictions"), 0);
  EXPECT_EQ(Counter("engine.blocks"), 16);
  for (uint64_t i = 0; i < 16; ++i) EXPECT_TRUE(Cached(Key(i))) << i;
}

TEST_F(EngineTest, CommitWithoutReservationIsFailedPrecondition) {
  const BlockKey key = Key(1);
  const uint64_t size = kBlockBytes;
  EXPECT_EQ(engine_->Commit(kWriter, ns_, {&key, 1}, {&size, 1})[0].code(), StatusCode::kFailedPrecondition);

  ASSERT_TRUE(engine_->Reserve(kWriter, ns_, {&key, 1}, {&size, 1})[0].status.ok());
  // Another connection cannot commit it...
  EXPECT_EQ(engine_->Commit(kOther, ns_, {&key, 1}, {&size, 1})[0].code(), StatusCode::kFailedPrecondition);
  EXPECT_FALSE(Cached(key));
  // ...the owner can, once.
  EXPECT_TRUE(engine_->Commit(kWriter, ns_, {&key, 1}, {&size, 1})[0].ok());
  EXPECT_EQ(engine_->Commit(kWriter, ns_, {&key, 1}, {&size, 1})[0].code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(Counter("engine.commit_failures"), 3);
  EXPECT_EQ(Counter("engine.commits"), 1);
}

TEST_F(EngineTest, CommitSizeMismatchDropsReservationAndFreesSpace) {
  const BlockKey key = Key(1);
  const uint64_t size = kBlockBytes, wrong = kBlockBytes - 1;
  ASSERT_TRUE(engine_->Reserve(kWriter, ns_, {&key, 1}, {&size, 1})[0].status.ok());
  EXPECT_EQ(host_->used_bytes(), kBlockBytes);
  Status s = engine_->Commit(kWriter, ns_, {&key, 1}, {&wrong, 1})[0];
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("size mismatch"), std::string::npos) << s.message();
  EXPECT_EQ(host_->used_bytes(), 0u);
  EXPECT_EQ(Counter("engine.reserved_blocks"), 0);
  EXPECT_FALSE(Cached(key));
  // The reservation is gone: committing the right size is now out of order.
  EXPECT_EQ(engine_->Commit(kWriter, ns_, {&key, 1}, {&size, 1})[0].code(), StatusCode::kFailedPrecondition);
  // And the key is free to be written again.
  EXPECT_TRUE(Put(kWriter, key).ok());
}

TEST_F(EngineTest, AbortFreesOnlyOwnReservations) {
  std::vector<BlockKey> keys = {Key(1), Key(2)};
  std::vector<uint64_t> sizes = {kBlockBytes, 3 * kBlockBytes};
  for (const SlotGrant& g : engine_->Reserve(kWriter, ns_, keys, sizes)) ASSERT_TRUE(g.status.ok());
  EXPECT_EQ(host_->used_bytes(), 4 * kBlockBytes);
  // Another connection's Abort does nothing.
  EXPECT_EQ(engine_->Abort(kOther, keys), 0u);
  EXPECT_EQ(host_->used_bytes(), 4 * kBlockBytes);
  // A committed block cannot be aborted.
  ASSERT_TRUE(Put(kWriter, Key(3)).ok());
  std::vector<BlockKey> with_extra = {Key(1), Key(2), Key(3), Key(99)};
  EXPECT_EQ(engine_->Abort(kWriter, with_extra), 2u);
  EXPECT_EQ(host_->used_bytes(), kBlockBytes);
  EXPECT_TRUE(Cached(Key(3)));
  EXPECT_EQ(Counter("engine.reserved_blocks"), 0);
  EXPECT_EQ(Counter("engine.aborts"), 2);
  EXPECT_EQ(engine_->Commit(kWriter, ns_, keys, sizes)[0].code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Put(kOther, Key(1)).ok());
}

TEST_F(EngineTest, CloseConnectionFreesReservationsAndReleasesLeases) {
  const BlockKey reserved = Key(1), pinned = Key(2), others = Key(3);
  const uint64_t size = kBlockBytes;
  ASSERT_TRUE(Put(kOther, pinned).ok());
  ASSERT_TRUE(engine_->Reserve(kWriter, ns_, {&reserved, 1}, {&size, 1})[0].status.ok());
  ASSERT_TRUE(engine_->Reserve(kOther, ns_, {&others, 1}, {&size, 1})[0].status.ok());
  PinGrant lease = PinOne(kWriter, pinned);
  ASSERT_TRUE(lease.status.ok());
  PinGrant other_lease = PinOne(kOther, pinned);
  ASSERT_TRUE(other_lease.status.ok());
  EXPECT_EQ(host_->used_bytes(), 3 * kBlockBytes);

  engine_->CloseConnection(kWriter);
  EXPECT_EQ(host_->used_bytes(), 2 * kBlockBytes);
  EXPECT_EQ(Counter("engine.reserved_blocks"), 1);  // kOther's
  EXPECT_EQ(Counter("engine.leases"), 1);           // kOther's
  EXPECT_EQ(Counter("engine.pinned_blocks"), 1);
  EXPECT_EQ(ReleaseOne(kWriter, lease.lease).code(), StatusCode::kNotFound);
  EXPECT_EQ(engine_->Commit(kWriter, ns_, {&reserved, 1}, {&size, 1})[0].code(), StatusCode::kFailedPrecondition);
  engine_->CloseConnection(kWriter);  // idempotent
  EXPECT_EQ(host_->used_bytes(), 2 * kBlockBytes);

  engine_->CloseConnection(kOther);
  EXPECT_EQ(host_->used_bytes(), kBlockBytes);  // the committed block stays
  EXPECT_EQ(Counter("engine.reserved_blocks"), 0);
  EXPECT_EQ(Counter("engine.leases"), 0);
  EXPECT_EQ(Counter("engine.pinned_blocks"), 0);
  EXPECT_TRUE(Cached(pinned));
  EXPECT_TRUE(Put(kReader, reserved).ok());
  EXPECT_EQ(Counter("engine.connections_closed"), 3);
}

TEST_F(EngineTest, ReleaseErrors) {
  Make(16, /*shards=*/2);
  const BlockKey key = Key(1);
  ASSERT_TRUE(Put(kWriter, key).ok());
  PinGrant g = PinOne(kReader, key);
  ASSERT_TRUE(g.status.ok());

  // Unknown lease, in a valid shard and with a shard index beyond the count.
  const LeaseId unknown = (LeaseId{123456} << 8) | (g.lease & 0xff);
  EXPECT_EQ(ReleaseOne(kReader, unknown).code(), StatusCode::kNotFound);
  const LeaseId beyond = (g.lease & ~LeaseId{0xff}) | 7;
  EXPECT_EQ(ReleaseOne(kReader, beyond).code(), StatusCode::kNotFound);
  const LeaseId max_shard = (g.lease & ~LeaseId{0xff}) | 0xff;
  EXPECT_EQ(ReleaseOne(kReader, max_shard).code(), StatusCode::kNotFound);

  // A foreign connection may not release it; the lease survives that.
  EXPECT_EQ(ReleaseOne(kOther, g.lease).code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(Counter("engine.pinned_blocks"), 1);
  EXPECT_TRUE(ReleaseOne(kReader, g.lease).ok());
  // Double release.
  EXPECT_EQ(ReleaseOne(kReader, g.lease).code(), StatusCode::kNotFound);
  EXPECT_EQ(ReleaseOne(kOther, g.lease).code(), StatusCode::kNotFound);
  EXPECT_EQ(Counter("engine.pinned_blocks"), 0);
  EXPECT_EQ(Counter("engine.release_failures"), 6);

  // A batch gives per-lease outcomes.
  PinGrant g2 = PinOne(kReader, key);
  std::vector<LeaseId> batch = {g2.lease, g2.lease, unknown};
  auto out = engine_->Release(kReader, batch);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_TRUE(out[0].ok());
  EXPECT_EQ(out[1].code(), StatusCode::kNotFound);
  EXPECT_EQ(out[2].code(), StatusCode::kNotFound);
}

TEST_F(EngineTest, MultiplePinsOfOneBlockNeedAllReleases) {
  Make(2);
  const BlockKey key = Key(1);
  ASSERT_TRUE(Put(kWriter, key).ok());
  PinGrant a = PinOne(kReader, key);
  PinGrant b = PinOne(kOther, key);
  ASSERT_TRUE(a.status.ok());
  ASSERT_TRUE(b.status.ok());
  EXPECT_NE(a.lease, b.lease);
  EXPECT_EQ(a.offset, b.offset);
  EXPECT_TRUE(ReleaseOne(kReader, a.lease).ok());
  EXPECT_EQ(Counter("engine.pinned_blocks"), 1);
  // Still pinned by kOther: the newer Key(2) is evicted instead of it.
  EXPECT_TRUE(Put(kWriter, Key(2)).ok());
  EXPECT_TRUE(Put(kWriter, Key(3)).ok());
  EXPECT_TRUE(Cached(key));
  EXPECT_FALSE(Cached(Key(2)));
  EXPECT_TRUE(ReleaseOne(kOther, b.lease).ok());
  EXPECT_EQ(Counter("engine.pinned_blocks"), 0);
  // Unpinned now, and released after Key(3) was written: Key(3) goes first.
  EXPECT_TRUE(Put(kWriter, Key(4)).ok());
  EXPECT_TRUE(Cached(key));
  EXPECT_FALSE(Cached(Key(3)));
  EXPECT_TRUE(Put(kWriter, Key(5)).ok());
  EXPECT_FALSE(Cached(key));
}

TEST_F(EngineTest, EraseOfUnpinnedBlockFreesAtOnce) {
  ASSERT_TRUE(Put(kWriter, Key(1)).ok());
  ASSERT_TRUE(Put(kWriter, Key(2)).ok());
  std::vector<BlockKey> keys = {Key(1), Key(2), Key(3)};
  EXPECT_EQ(engine_->Erase(ns_, keys), 2u);
  EXPECT_EQ(host_->used_bytes(), 0u);
  EXPECT_EQ(Counter("engine.blocks"), 0);
  EXPECT_EQ(Counter("engine.stored_bytes"), 0);
  EXPECT_EQ(Counter("engine.erases"), 2);
  EXPECT_EQ(engine_->Erase(ns_, keys), 0u);
  // A reservation is not erasable.
  const uint64_t size = kBlockBytes;
  ASSERT_TRUE(engine_->Reserve(kWriter, ns_, {&keys[0], 1}, {&size, 1})[0].status.ok());
  EXPECT_EQ(engine_->Erase(ns_, keys), 0u);
  EXPECT_TRUE(engine_->Commit(kWriter, ns_, {&keys[0], 1}, {&size, 1})[0].ok());
}

TEST_F(EngineTest, EraseOfPinnedBlockMakesAZombieUntilLastRelease) {
  const BlockKey key = Key(1);
  ASSERT_TRUE(Put(kWriter, key, kBlockBytes, /*salt=*/1).ok());
  PinGrant old_pin = PinOne(kReader, key);
  PinGrant old_pin2 = PinOne(kOther, key);
  ASSERT_TRUE(old_pin.status.ok());
  ASSERT_TRUE(old_pin2.status.ok());

  EXPECT_EQ(engine_->Erase(ns_, {&key, 1}), 1u);
  // Invisible at once...
  EXPECT_FALSE(Cached(key));
  EXPECT_EQ(PinOne(kReader, key).status.code(), StatusCode::kNotFound);
  EXPECT_EQ(Counter("engine.blocks"), 0);
  EXPECT_EQ(Counter("engine.stored_bytes"), 0);
  EXPECT_EQ(Counter("engine.zombie_blocks"), 1);
  // ...but the bytes stay for the lease holders.
  EXPECT_EQ(host_->used_bytes(), kBlockBytes);
  EXPECT_TRUE(CheckBlockBytes(key, 1, ::kvtier::testing::SlotBytes(*host_, old_pin.offset, old_pin.length)));

  // The key can be written again while the zombie is pinned.
  ASSERT_TRUE(Put(kWriter, key, kBlockBytes, /*salt=*/2).ok());
  EXPECT_EQ(host_->used_bytes(), 2 * kBlockBytes);
  PinGrant new_pin = PinOne(kReader, key);
  ASSERT_TRUE(new_pin.status.ok());
  EXPECT_NE(new_pin.offset, old_pin.offset);
  EXPECT_NE(new_pin.checksum, old_pin.checksum);
  EXPECT_TRUE(CheckBlockBytes(key, 2, ::kvtier::testing::SlotBytes(*host_, new_pin.offset, new_pin.length)));
  EXPECT_TRUE(CheckBlockBytes(key, 1, ::kvtier::testing::SlotBytes(*host_, old_pin.offset, old_pin.length)));

  // Releasing the old leases frees the zombie only at the last one, and does
  // not touch the new block.
  EXPECT_TRUE(ReleaseOne(kReader, old_pin.lease).ok());
  EXPECT_EQ(host_->used_bytes(), 2 * kBlockBytes);
  EXPECT_EQ(Counter("engine.zombie_blocks"), 1);
  EXPECT_TRUE(ReleaseOne(kOther, old_pin2.lease).ok());
  EXPECT_EQ(host_->used_bytes(), kBlockBytes);
  EXPECT_EQ(Counter("engine.zombie_blocks"), 0);
  EXPECT_EQ(Counter("engine.pinned_blocks"), 1);  // the new block, still pinned
  EXPECT_TRUE(Cached(key));
  EXPECT_TRUE(CheckBlockBytes(key, 2, ::kvtier::testing::SlotBytes(*host_, new_pin.offset, new_pin.length)));
  EXPECT_TRUE(ReleaseOne(kReader, new_pin.lease).ok());
  EXPECT_EQ(Counter("engine.pinned_blocks"), 0);
  EXPECT_EQ(Counter("engine.leases"), 0);
}

TEST_F(EngineTest, ReleasingZombieLeaseLeavesUnpinnedNewBlockEvictableOnce) {
  Make(4);
  const BlockKey key = Key(1);
  ASSERT_TRUE(Put(kWriter, key, kBlockBytes, 1).ok());
  PinGrant old_pin = PinOne(kReader, key);
  ASSERT_EQ(engine_->Erase(ns_, {&key, 1}), 1u);
  ASSERT_TRUE(Put(kWriter, key, kBlockBytes, 2).ok());  // unpinned, evictable
  EXPECT_TRUE(ReleaseOne(kReader, old_pin.lease).ok());
  EXPECT_EQ(host_->used_bytes(), kBlockBytes);
  // Fill the arena past capacity twice over: the new block is evicted exactly
  // once, and every eviction names a real block.
  for (uint64_t i = 10; i < 18; ++i) ASSERT_TRUE(Put(kWriter, Key(i)).ok()) << i;
  EXPECT_FALSE(Cached(key));
  EXPECT_EQ(Counter("engine.blocks"), 4);
  EXPECT_EQ(Counter("engine.evictions"), 5);
  EXPECT_EQ(host_->used_bytes(), 4 * kBlockBytes);
}

// Eviction order, with one shard and with eight (the global order must stay
// LRU by last-use time across shards).
class EngineEvictionTest : public EngineTest, public ::testing::WithParamInterface<uint32_t> {};

TEST_P(EngineEvictionTest, LruEvictsLeastRecentlyUsedAcrossShards) {
  Make(16, GetParam(), EvictionPolicyId::kLru);
  for (uint64_t i = 0; i < 16; ++i) ASSERT_TRUE(Put(kWriter, Key(i)).ok()) << i;
  EXPECT_EQ(host_->used_bytes(), 16 * kBlockBytes);
  // Uses, oldest first: 9, 0, 5 become the most recent.
  Touch(Key(9));
  Touch(Key(0));
  Touch(Key(5));
  // Lookups are not uses.
  std::vector<BlockKey> all;
  for (uint64_t i = 0; i < 16; ++i) all.push_back(Key(i));
  EXPECT_EQ(engine_->Lookup(ns_, all).prefix_blocks, 16u);

  std::set<uint64_t> evicted;
  const std::vector<uint64_t> expected_order = {1, 2, 3, 4, 6, 7, 8, 10, 11, 12, 13, 14, 15, 9, 0, 5};
  uint64_t next_key = 100;
  for (size_t step = 0; step < expected_order.size(); ++step) {
    ASSERT_TRUE(Put(kWriter, Key(next_key++)).ok());
    evicted.insert(expected_order[step]);
    for (uint64_t i = 0; i < 16; ++i) {
      EXPECT_EQ(Cached(Key(i)), evicted.count(i) == 0) << "key " << i << " after evicting " << step + 1 << " blocks";
    }
  }
  EXPECT_EQ(Counter("engine.evictions"), 16);
  EXPECT_EQ(Counter("engine.blocks"), 16);
}

TEST_P(EngineEvictionTest, FifoEvictsInCommitOrder) {
  Make(8, GetParam(), EvictionPolicyId::kFifo);
  for (uint64_t i = 0; i < 8; ++i) ASSERT_TRUE(Put(kWriter, Key(i)).ok());
  for (uint64_t i = 0; i < 8; ++i) {
    ASSERT_TRUE(Put(kWriter, Key(100 + i)).ok());
    for (uint64_t j = 0; j < 8; ++j) EXPECT_EQ(Cached(Key(j)), j > i) << "key " << j << " step " << i;
  }
}

// FIFO ignores uses: a block that was pinned and released keeps its place
// in insertion order.
TEST_P(EngineEvictionTest, FifoIgnoresPinAndRelease) {
  Make(8, GetParam(), EvictionPolicyId::kFifo);
  for (uint64_t i = 0; i < 8; ++i) ASSERT_TRUE(Put(kWriter, Key(i)).ok());
  Touch(Key(0));
  Touch(Key(1));
  // The order in which the first eight keys leave the cache.
  std::vector<uint64_t> evicted;
  for (uint64_t i = 0; i < 8; ++i) {
    ASSERT_TRUE(Put(kWriter, Key(100 + i)).ok());
    for (uint64_t j = 0; j < 8; ++j) {
      if (!Cached(Key(j)) && std::find(evicted.begin(), evicted.end(), j) == evicted.end()) {
        evicted.push_back(j);
      }
    }
  }
  EXPECT_EQ(evicted, (std::vector<uint64_t>{0, 1, 2, 3, 4, 5, 6, 7}))
      << "FIFO must evict in commit order; a pin/release must not move a block to the back";
}

TEST_P(EngineEvictionTest, PinnedBlocksAreNeverEvicted) {
  Make(8, GetParam(), EvictionPolicyId::kLru);
  for (uint64_t i = 0; i < 8; ++i) ASSERT_TRUE(Put(kWriter, Key(i)).ok());
  std::vector<LeaseId> leases;
  for (uint64_t i : {0, 3, 6}) {  // the oldest among them
    PinGrant g = PinOne(kReader, Key(i));
    ASSERT_TRUE(g.status.ok());
    leases.push_back(g.lease);
  }
  for (uint64_t i = 100; i < 120; ++i) ASSERT_TRUE(Put(kWriter, Key(i)).ok());
  for (uint64_t i : {0, 3, 6}) EXPECT_TRUE(Cached(Key(i))) << i;
  for (uint64_t i : {1, 2, 4, 5, 7}) EXPECT_FALSE(Cached(Key(i))) << i;
  EXPECT_EQ(Counter("engine.pinned_blocks"), 3);
  for (LeaseId l : leases) EXPECT_TRUE(ReleaseOne(kReader, l).ok());
}

INSTANTIATE_TEST_SUITE_P(Shards, EngineEvictionTest, ::testing::Values(1u, 8u),
                         [](const auto& info) { return std::to_string(info.param) + "shards"; });

TEST_F(EngineTest, NoSpaceWhenEverythingIsPinned) {
  Make(4, 4);
  std::vector<LeaseId> leases;
  for (uint64_t i = 0; i < 4; ++i) {
    ASSERT_TRUE(Put(kWriter, Key(i)).ok());
    PinGrant g = PinOne(kReader, Key(i));
    ASSERT_TRUE(g.status.ok());
    leases.push_back(g.lease);
  }
  Status s = Put(kWriter, Key(10));
  EXPECT_EQ(s.code(), StatusCode::kNoSpace);
  EXPECT_NE(s.message().find("pinned"), std::string::npos) << s.message();
  EXPECT_FALSE(Cached(Key(10)));
  EXPECT_EQ(Counter("engine.reserved_blocks"), 0);  // the failed claim is gone
  EXPECT_EQ(Counter("engine.eviction_failures"), 1);
  EXPECT_EQ(Counter("engine.reserve_failures"), 1);
  for (uint64_t i = 0; i < 4; ++i) EXPECT_TRUE(Cached(Key(i)));
  // One release makes room (by evicting that block).
  ASSERT_TRUE(ReleaseOne(kReader, leases[2]).ok());
  EXPECT_TRUE(Put(kWriter, Key(10)).ok());
  EXPECT_FALSE(Cached(Key(2)));
}

TEST_F(EngineTest, NoSpaceWhenEverythingIsReserved) {
  Make(4, 2);
  std::vector<BlockKey> keys = {Key(0), Key(1), Key(2), Key(3)};
  std::vector<uint64_t> sizes(4, kBlockBytes);
  for (const SlotGrant& g : engine_->Reserve(kWriter, ns_, keys, sizes)) ASSERT_TRUE(g.status.ok());
  const BlockKey extra = Key(4);
  auto g = engine_->Reserve(kOther, ns_, {&extra, 1}, {&sizes[0], 1});
  EXPECT_EQ(g[0].status.code(), StatusCode::kNoSpace);
  EXPECT_NE(g[0].status.message().find("pinned"), std::string::npos) << g[0].status.message();
  EXPECT_EQ(Counter("engine.reserved_blocks"), 4);
  EXPECT_EQ(engine_->Abort(kWriter, keys), 4u);
  EXPECT_TRUE(Put(kOther, extra).ok());
}

TEST_F(EngineTest, BatchReserveLargerThanArenaFailsTheTail) {
  // A batch larger than the arena: the reservations of the batch itself are
  // not evictable, so the tail gets NoSpace.
  Make(2);
  std::vector<BlockKey> keys = {Key(0), Key(1), Key(2)};
  std::vector<uint64_t> sizes(3, kBlockBytes);
  auto grants = engine_->Reserve(kWriter, ns_, keys, sizes);
  EXPECT_TRUE(grants[0].status.ok());
  EXPECT_TRUE(grants[1].status.ok());
  EXPECT_EQ(grants[2].status.code(), StatusCode::kNoSpace);
  EXPECT_NE(grants[0].offset, grants[1].offset);
}

TEST_F(EngineTest, Counters) {
  Make(4);
  auto c = Counters(*engine_);
  for (const char* name : {"engine.blocks", "engine.stored_bytes", "engine.pinned_blocks", "engine.reserved_blocks",
                           "engine.zombie_blocks", "engine.leases", "engine.evictions", "engine.lookups", "engine.pins",
                           "host.alloc.used_bytes", "host.arena.capacity_bytes"}) {
    EXPECT_EQ(c.count(name), 1u) << name;
  }
  EXPECT_EQ(c["engine.blocks"], 0);

  ASSERT_TRUE(Put(kWriter, Key(0), 1000).ok());
  ASSERT_TRUE(Put(kWriter, Key(1), 3000).ok());
  const BlockKey r = Key(2);
  const uint64_t size = 2000;
  ASSERT_TRUE(engine_->Reserve(kWriter, ns_, {&r, 1}, {&size, 1})[0].status.ok());
  PinGrant g = PinOne(kReader, Key(1));
  ASSERT_TRUE(g.status.ok());
  EXPECT_EQ(PinOne(kReader, Key(9)).status.code(), StatusCode::kNotFound);
  engine_->Lookup(ns_, std::vector<BlockKey>{Key(0), Key(1), Key(5)});

  c = Counters(*engine_);
  EXPECT_EQ(c["engine.blocks"], 2);
  EXPECT_EQ(c["engine.stored_bytes"], 4000);
  EXPECT_EQ(c["engine.pinned_blocks"], 1);
  EXPECT_EQ(c["engine.reserved_blocks"], 1);
  EXPECT_EQ(c["engine.leases"], 1);
  EXPECT_EQ(c["engine.evictions"], 0);
  EXPECT_EQ(c["engine.pins"], 1);
  EXPECT_EQ(c["engine.pin_misses"], 1);
  EXPECT_EQ(c["engine.lookups"], 1);
  EXPECT_EQ(c["engine.lookup_keys"], 3);
  EXPECT_EQ(c["engine.lookup_hit_blocks"], 2);
  EXPECT_EQ(c["engine.commits"], 2);
  EXPECT_EQ(c["engine.reserves"], 3);
  EXPECT_EQ(c["host.alloc.used_bytes"], 3 * 4096);

  // Overflow: Key(0) (unpinned, oldest) goes.
  ASSERT_TRUE(Put(kWriter, Key(3), 4096).ok());
  ASSERT_TRUE(Put(kWriter, Key(4), 4096).ok());
  c = Counters(*engine_);
  EXPECT_EQ(c["engine.evictions"], 1);
  EXPECT_EQ(c["engine.blocks"], 3);
  EXPECT_EQ(c["engine.stored_bytes"], 3000 + 4096 + 4096);
  EXPECT_EQ(ReleaseOne(kReader, g.lease).ok(), true);
  c = Counters(*engine_);
  EXPECT_EQ(c["engine.pinned_blocks"], 0);
  EXPECT_EQ(c["engine.releases"], 1);
}

// Four threads Reserve/Commit/Pin/Release/Erase on private and shared keys
// of an arena that is too small, so eviction runs all the time. Every pinned
// read is byte-exact; at the end the arena's used bytes equal the extents of
// the live blocks exactly.

}  // namespace
}  // namespace kvtier

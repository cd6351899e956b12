// Tests of the CorruptionCheck (daemon/engine/corruption_check.h) without
// an Engine: index shards over a test arena, a real mover for the
// hashing, and the test's own hooks (a pin as Pinner::PinLocked takes it,
// a release as Engine::Release does). A reported block is hashed again:
// dropped only when its bytes, whole or a layer, disagree with what its
// commit recorded; an intact one is kept; a pinned one becomes a zombie;
// only the host copy of the reported namespace is checked; too many keys
// and a full queue are refused with nothing checked; every pin goes.
#include "daemon/engine/corruption_check.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <future>
#include <memory>
#include <vector>

#include "common/checksum.h"
#include "daemon/engine/block_index.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/index_shards.h"
#include "tests/testing/test_daemon.h"

namespace kvtier {
namespace {

using ::kvtier::testing::FakeClock;

constexpr uint32_t kLayers = 4;
constexpr uint64_t kBlockBytes = kLayers * (4 << 10);
constexpr size_t kShards = 2;
constexpr ConnectionId kWriter = 7;
constexpr ConnectionId kReader = 8;
constexpr NamespaceFingerprint kNs{0xc0cc, 0x1};
constexpr NamespaceFingerprint kOtherNs{0xc0cc, 0x2};

BlockKey Key(uint64_t i) { return BlockKey{0xc0cc, i}; }

class CorruptionCheckTest : public ::testing::Test {
 protected:
  void SetUp() override {
    arena_ = ::kvtier::testing::OpenTestHostTier(16 * kBlockBytes);
    ASSERT_NE(arena_, nullptr);
    shards_ = ::kvtier::testing::MakeShards(*arena_, kShards);
  }
  void TearDown() override {
    // The mover first, as in the engine (host_io_ goes before the check):
    // it runs what is still queued and joins, and a job ends (io_finished)
    // after its `done`, which the test may have seen already.
    io_.reset();
    check_.reset();
  }

  CorruptionCheck& Make(size_t max_jobs = 16) {
    io_ = std::make_unique<Mover>("test.host_io", 1, 0, max_jobs);
    CorruptionCheck::Hooks hooks;
    hooks.io_started = [this] { ++io_started_; };
    hooks.io_finished = [this] { ++io_finished_; };
    hooks.pin = [this](BlockIndex& shard, const BlockKey& key, uint64_t now_us) {
      ++pins_;
      return ::kvtier::testing::PinCommitted(shard, kHostTierConnection, key, now_us, /*with_layers=*/true);
    };
    hooks.release = [this](LeaseId lease) {
      BlockIndex& shard = *shards_[LeaseShard(lease)];
      MutexLock lock(shard.mu);
      Result<LeaseRecord> record = shard.leases.Take(kHostTierConnection, lease);
      ASSERT_TRUE(record.ok()) << record.status().ToString();
      shard.Unpin(*record, clock_.NowUs());
      ++releases_;
    };
    check_ = std::make_unique<CorruptionCheck>(shards_, *arena_, clock_, *io_, counters_, std::move(hooks));
    return *check_;
  }

  BlockIndex& ShardOf(const BlockKey& key) { return *shards_[ShardIndexOf(key, kShards)]; }
  // Commits `key` of `ns` with bytes that say which block it is and the
  // checksums of the block and its layers; `bad_layer` (< kLayers)
  // records a wrong checksum for that layer.
  void Put(const BlockKey& key, const NamespaceFingerprint& ns = kNs, uint32_t bad_layer = kLayers) {
    const std::vector<std::byte> bytes =
        ::kvtier::testing::LayeredBlockBytes(key.lo, kBlockBytes, kBlockBytes / kLayers);
    std::vector<uint64_t> layers(kLayers);
    const uint64_t checksum = ChecksumWithLayers(bytes, layers);
    if (bad_layer < kLayers) layers[bad_layer] ^= 1;
    BlockIndex& shard = ShardOf(key);
    MutexLock lock(shard.mu);
    ASSERT_TRUE(shard.Reserve(key, ns, kBlockBytes, kWriter).ok());
    auto it = shard.index.find(key);
    Result<HostTier::Extent> extent = arena_->Allocate(kBlockBytes);
    ASSERT_TRUE(extent.ok());
    std::memcpy(arena_->Bytes(*extent).data(), bytes.data(), bytes.size());
    it->second.extent = *extent;
    it->second.allocated = true;
    shard.CommitReserved(it, kWriter, checksum, std::move(layers), next_handle_++, 1);
  }
  // Flips a byte of `key`'s bytes in the arena (rot after the commit).
  void Rot(const BlockKey& key) {
    BlockIndex& shard = ShardOf(key);
    MutexLock lock(shard.mu);
    std::span<std::byte> bytes = arena_->Bytes(shard.index.at(key).extent);
    bytes[bytes.size() / 2] ^= std::byte{0xff};
  }
  bool Cached(const BlockKey& key) {
    BlockIndex& shard = ShardOf(key);
    MutexLock lock(shard.mu);
    auto it = shard.index.find(key);
    return it != shard.index.end() && it->second.cached();
  }
  size_t Zombies() {
    size_t n = 0;
    for (auto& shard : shards_) {
      MutexLock lock(shard->mu);
      n += shard->zombies.size();
    }
    return n;
  }
  // Reports `keys` of `ns` and waits for the answer.
  Result<size_t> Report(std::vector<BlockKey> keys, const NamespaceFingerprint& ns = kNs) {
    std::promise<Result<size_t>> answer;
    check_->Check(ns, keys, [&answer](Result<size_t> dropped) { answer.set_value(std::move(dropped)); });
    return answer.get_future().get();
  }
  static int64_t Load(const std::atomic<int64_t>& c) { return c.load(std::memory_order_relaxed); }

  FakeClock clock_;
  std::unique_ptr<HostTier> arena_;
  std::vector<std::unique_ptr<BlockIndex>> shards_;
  EngineCounters counters_;
  std::unique_ptr<Mover> io_;
  std::unique_ptr<CorruptionCheck> check_;
  uint64_t next_handle_ = 1;
  std::atomic<int> io_started_{0}, io_finished_{0}, pins_{0}, releases_{0};
};

TEST_F(CorruptionCheckTest, AnIntactBlockIsKeptAndTheReportRefuted) {
  Make();
  Put(Key(1));
  const Result<size_t> dropped = Report({Key(1)});
  ASSERT_TRUE(dropped.ok()) << dropped.status().ToString();
  EXPECT_EQ(*dropped, 0u);
  EXPECT_TRUE(Cached(Key(1)));
  EXPECT_EQ(Load(counters_.corrupt_reports), 1);
  EXPECT_EQ(Load(counters_.corrupt_reports_refuted), 1);
  EXPECT_EQ(Load(counters_.corrupt_drops), 0);
  EXPECT_EQ(pins_, 1);
  EXPECT_EQ(releases_, 1);
  EXPECT_EQ(io_started_, 1);
  io_.reset();  // joins the mover: its job has ended (io_finished runs after `done`)
  EXPECT_EQ(io_finished_, 1);
}

TEST_F(CorruptionCheckTest, ABlockWhoseBytesChangedSinceItsCommitIsDropped) {
  Make();
  Put(Key(1));
  Put(Key(2));
  Rot(Key(2));
  const Result<size_t> dropped = Report({Key(1), Key(2)});
  ASSERT_TRUE(dropped.ok()) << dropped.status().ToString();
  EXPECT_EQ(*dropped, 1u);
  EXPECT_TRUE(Cached(Key(1)));
  EXPECT_FALSE(Cached(Key(2)));
  EXPECT_EQ(Zombies(), 0u) << "only the check's pin held it: freed at its release";
  EXPECT_EQ(Load(counters_.corrupt_reports), 2);
  EXPECT_EQ(Load(counters_.corrupt_drops), 1);
  EXPECT_EQ(Load(counters_.corrupt_reports_refuted), 1);
  EXPECT_EQ(releases_, 2);
}

TEST_F(CorruptionCheckTest, ALayerThatDisagreesDropsTheBlockThoughTheWholeMatches) {
  Make();
  Put(Key(1), kNs, /*bad_layer=*/2);
  const Result<size_t> dropped = Report({Key(1)});
  ASSERT_TRUE(dropped.ok());
  EXPECT_EQ(*dropped, 1u);
  EXPECT_FALSE(Cached(Key(1)));
}

TEST_F(CorruptionCheckTest, ADroppedBlockAReaderPinnedStaysUntilItsLastRelease) {
  Make();
  Put(Key(1));
  {
    BlockIndex& shard = ShardOf(Key(1));
    MutexLock lock(shard.mu);
    ::kvtier::testing::PinCommitted(shard, kReader, Key(1), 1, false);
  }
  Rot(Key(1));
  const Result<size_t> dropped = Report({Key(1)});
  ASSERT_TRUE(dropped.ok());
  EXPECT_EQ(*dropped, 1u);
  EXPECT_FALSE(Cached(Key(1))) << "invisible to later readers";
  EXPECT_EQ(Zombies(), 1u) << "the reader's pin keeps its bytes";
}

TEST_F(CorruptionCheckTest, OnlyTheHostCopyOfTheReportedNamespaceIsChecked) {
  Make();
  Put(Key(1), kOtherNs);
  Rot(Key(1));
  bool answered = false;
  const std::vector<BlockKey> keys = {Key(1), Key(2)};  // another namespace's; not in the host tier
  check_->Check(kNs, keys, [&](Result<size_t> dropped) {
    ASSERT_TRUE(dropped.ok());
    EXPECT_EQ(*dropped, 0u);
    answered = true;
  });
  EXPECT_TRUE(answered) << "answered inline: nothing to hash";
  EXPECT_TRUE(Cached(Key(1)));
  EXPECT_EQ(pins_, 0);
  EXPECT_EQ(io_started_, 0);
  EXPECT_EQ(Load(counters_.corrupt_reports), 0);
}

TEST_F(CorruptionCheckTest, TooManyKeysAreRefusedWithNothingChecked) {
  Make();
  Put(Key(1));
  Rot(Key(1));
  std::vector<BlockKey> keys(CorruptionCheck::kMaxReportedKeys + 1, Key(1));
  const Result<size_t> dropped = Report(keys);
  EXPECT_EQ(dropped.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Cached(Key(1)));
  EXPECT_EQ(pins_, 0);
  keys.resize(CorruptionCheck::kMaxReportedKeys);
  EXPECT_EQ(*Report(keys), 1u) << "at most kMaxReportedKeys: checked (the same block once dropped)";
}

TEST_F(CorruptionCheckTest, AFullQueueIsBusyWithNothingChecked) {
  Make(/*max_jobs=*/1);
  Put(Key(1));
  Rot(Key(1));
  std::promise<void> gate;
  ASSERT_TRUE(io_->TrySubmit([opened = gate.get_future().share()] { opened.wait(); }));
  const Result<size_t> dropped = Report({Key(1)});
  EXPECT_EQ(dropped.status().code(), StatusCode::kBusy);
  EXPECT_TRUE(Cached(Key(1)));
  EXPECT_EQ(pins_, 0);
  gate.set_value();
}

}  // namespace
}  // namespace kvtier

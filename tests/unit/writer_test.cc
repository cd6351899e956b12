// Tests of the Writer, a client's put into the host arena, driven without
// an Engine: real index shards over a real arena, a real Evictor (no tier
// below: its victims are dropped) behind the allocate hook, a fixed layer
// split for the namespace. A reserve then commit publishes a block with
// its checksum; a key taken, a size the arena can never hold, a commit
// that does not match its reservation and a verify_commits mismatch each
// fail as the contract says, and what failed gives its space back.
#include "daemon/engine/writer.h"

#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <vector>

#include "common/checksum.h"
#include "daemon/engine/block_index.h"
#include "daemon/engine/evictor.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/index_shards.h"
#include "tests/testing/test_daemon.h"

namespace kvtier {
namespace {

constexpr uint32_t kLayers = 4;
constexpr uint64_t kLayerBytes = 4 << 10;
constexpr uint64_t kBlockBytes = kLayers * kLayerBytes;
constexpr uint64_t kSmallBytes = 4 << 10;  // not the namespace's block size: one layer
constexpr size_t kBlocks = 8;
constexpr NamespaceFingerprint kNs{0x3e17, 0x5};
constexpr NamespaceFingerprint kOtherNs{0x3e17, 0x6};
constexpr ConnectionId kConn = 4;
constexpr ConnectionId kOtherConn = 5;
constexpr size_t kShards = 2;

BlockKey Key(uint64_t i) { return BlockKey{0x3e17, i}; }

std::vector<std::byte> BlockBytes(uint64_t i, uint64_t size = kBlockBytes) {
  return ::kvtier::testing::LayeredBlockBytes(i, size, kLayerBytes);
}

std::vector<uint64_t> LayerSums(const std::vector<std::byte>& bytes) {
  std::vector<uint64_t> layers(kLayers);
  ChecksumWithLayers(bytes, layers);
  return layers;
}

class WriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    host_ = ::kvtier::testing::OpenTestHostTier(kBlocks * kBlockBytes);
    ASSERT_NE(host_, nullptr);
    shards_ = ::kvtier::testing::MakeShards(*host_, kShards);
    evictor_ = std::make_unique<Evictor>(shards_, *host_, below_, lineage_, clock_, /*lookahead_us=*/0, counters_,
                                         Evictor::Hooks{[] {}, [](size_t, const NamespaceFingerprint&, const BlockKey&,
                                                                  HostTier::Extent, uint64_t, uint64_t) {}});
  }

  Writer& Make(bool verify_commits = false) {
    Writer::Hooks hooks;
    hooks.allocate = [this](uint64_t bytes) { return evictor_->Allocate(bytes); };
    hooks.layer_count = [](const NamespaceFingerprint&, uint64_t size) { return size == kBlockBytes ? kLayers : 1u; };
    hooks.next_handle = [this] { return next_handle_++; };
    writer_ = std::make_unique<Writer>(shards_, *host_, lineage_, clock_, verify_commits, counters_, std::move(hooks));
    return *writer_;
  }

  // Reserves block `i` for `connection` and writes its bytes in place.
  SlotGrant Put(uint64_t i, ConnectionId connection = kConn, uint64_t size = kBlockBytes) {
    const BlockKey key = Key(i);
    const uint64_t sizes[] = {size};
    SlotGrant grant = writer_->Reserve(connection, kNs, {&key, 1}, sizes)[0];
    if (grant.status.ok()) {
      const std::vector<std::byte> bytes = BlockBytes(i, size);
      std::copy(bytes.begin(), bytes.end(), ::kvtier::testing::SlotBytes(*host_, grant.offset, size).begin());
    }
    return grant;
  }
  Status CommitOne(uint64_t i, ConnectionId connection = kConn, uint64_t size = kBlockBytes,
                   std::vector<uint64_t> checksums = {}, std::vector<uint64_t> layer_checksums = {},
                   const NamespaceFingerprint& ns = kNs) {
    const BlockKey key = Key(i);
    const uint64_t sizes[] = {size};
    return writer_->Commit(connection, ns, {&key, 1}, sizes, checksums, layer_checksums)[0];
  }
  std::optional<BlockEntry> Entry(const BlockKey& key) {
    BlockIndex& shard = *shards_[ShardIndexOf(key, kShards)];
    MutexLock lock(shard.mu);
    auto it = shard.index.find(key);
    if (it == shard.index.end()) return std::nullopt;
    return it->second;
  }

  ::kvtier::testing::FakeClock clock_;
  EngineCounters counters_;
  Lineage lineage_{1024};
  std::unique_ptr<HostTier> host_;
  std::vector<std::unique_ptr<BlockIndex>> shards_;
  std::vector<std::unique_ptr<TierLevel>> below_;  // none: victims are dropped
  std::unique_ptr<Evictor> evictor_;
  BlockHandle next_handle_ = 1;
  std::unique_ptr<Writer> writer_;
};

TEST_F(WriterTest, AReserveThenCommitPublishesTheBlockWithTheWritersHash) {
  Make();
  const SlotGrant grant = Put(1);
  ASSERT_TRUE(grant.status.ok()) << grant.status.ToString();
  EXPECT_EQ(grant.length, kBlockBytes);
  ASSERT_TRUE(Entry(Key(1)).has_value());
  EXPECT_EQ(Entry(Key(1))->state(), BlockState::kReserved) << "invisible until committed";
  EXPECT_EQ(host_->used_bytes(), kBlockBytes);

  ASSERT_TRUE(CommitOne(1).ok());
  const std::optional<BlockEntry> entry = Entry(Key(1));
  ASSERT_TRUE(entry.has_value());
  EXPECT_EQ(entry->state(), BlockState::kCommitted);
  EXPECT_EQ(entry->checksum, BlockChecksum(BlockBytes(1))) << "no checksum sent: the writer hashes the bytes";
  EXPECT_TRUE(entry->layer_checksums.empty()) << "layers are never hashed unless sent";
  EXPECT_EQ(entry->extent.offset, grant.offset);
  EXPECT_EQ(counters_.reserves.load(), 1);
  EXPECT_EQ(counters_.commits.load(), 1);
  EXPECT_EQ(counters_.host_committed_bytes.load(), static_cast<int64_t>(kBlockBytes));
  EXPECT_EQ(counters_.commit_checksums_sent.load(), 0);
}

TEST_F(WriterTest, ASentChecksumIsRecordedAsSentWithoutVerifyCommits) {
  Make(/*verify_commits=*/false);
  ASSERT_TRUE(Put(1).status.ok());
  ASSERT_TRUE(CommitOne(1, kConn, kBlockBytes, {0x5e47}).ok()) << "not hashed, so not checked";
  EXPECT_EQ(Entry(Key(1))->checksum, 0x5e47u);
  EXPECT_EQ(counters_.commit_checksums_sent.load(), 1);
}

TEST_F(WriterTest, AKeyCommittedOrBeingWrittenIsAlreadyExists) {
  Make();
  ASSERT_TRUE(Put(1).status.ok());
  EXPECT_EQ(Put(1, kOtherConn).status.code(), StatusCode::kAlreadyExists) << "being written";
  EXPECT_EQ(Put(1, kConn).status.code(), StatusCode::kAlreadyExists) << "even by its own writer";
  ASSERT_TRUE(CommitOne(1).ok());
  EXPECT_EQ(Put(1, kOtherConn).status.code(), StatusCode::kAlreadyExists) << "committed";
  EXPECT_EQ(host_->used_bytes(), kBlockBytes) << "a refused reserve allocates nothing";
  EXPECT_EQ(counters_.reserve_failures.load(), 0) << "a key taken is not a failure to reserve";
}

TEST_F(WriterTest, ASizeTheArenaCanNeverHoldIsInvalidArgument) {
  Make();
  EXPECT_EQ(Put(1, kConn, 0).status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Put(2, kConn, host_->capacity_bytes() + 1).status.code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(Entry(Key(1)).has_value());
  EXPECT_FALSE(Entry(Key(2)).has_value());
  EXPECT_EQ(counters_.reserve_failures.load(), 2);
}

TEST_F(WriterTest, ACommitOfAnotherSizeIsInvalidArgumentAndItsSpaceReturns) {
  Make();
  ASSERT_TRUE(Put(1).status.ok());
  EXPECT_EQ(CommitOne(1, kConn, kBlockBytes - 1).code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(Entry(Key(1)).has_value()) << "the reservation is dropped";
  EXPECT_EQ(host_->used_bytes(), 0u);
  EXPECT_EQ(counters_.commit_failures.load(), 1);
  EXPECT_TRUE(Put(1).status.ok()) << "the key may be written again";
}

TEST_F(WriterTest, ACommitWithoutThisConnectionsReservationIsFailedPrecondition) {
  Make();
  EXPECT_EQ(CommitOne(1).code(), StatusCode::kFailedPrecondition) << "never reserved";
  ASSERT_TRUE(Put(2).status.ok());
  EXPECT_EQ(CommitOne(2, kOtherConn).code(), StatusCode::kFailedPrecondition) << "another connection's";
  EXPECT_EQ(CommitOne(2, kConn, kBlockBytes, {}, {}, kOtherNs).code(), StatusCode::kFailedPrecondition)
      << "under another namespace";
  EXPECT_EQ(Entry(Key(2))->state(), BlockState::kReserved) << "the writer's reservation stays";
  EXPECT_TRUE(CommitOne(2).ok());
  EXPECT_EQ(CommitOne(2).code(), StatusCode::kFailedPrecondition) << "committed already";
  EXPECT_EQ(counters_.commit_failures.load(), 4);
}

TEST_F(WriterTest, VerifyCommitsFailsAWrongChecksumAsCorruptionAndItsSpaceReturns) {
  Make(/*verify_commits=*/true);
  ASSERT_TRUE(Put(1).status.ok());
  ASSERT_TRUE(Put(2).status.ok());
  const BlockKey keys[] = {Key(1), Key(2)};
  const uint64_t sizes[] = {kBlockBytes, kBlockBytes};
  const uint64_t checksums[] = {BlockChecksum(BlockBytes(1)), BlockChecksum(BlockBytes(2)) ^ 1};
  const std::vector<Status> out = writer_->Commit(kConn, kNs, keys, sizes, checksums);
  EXPECT_TRUE(out[0].ok()) << out[0].ToString();
  EXPECT_EQ(out[1].code(), StatusCode::kCorruption);
  EXPECT_EQ(Entry(Key(1))->checksum, checksums[0]);
  EXPECT_FALSE(Entry(Key(2)).has_value()) << "the reservation is dropped";
  EXPECT_EQ(host_->used_bytes(), kBlockBytes);
  EXPECT_EQ(counters_.commit_failures.load(), 1);
}

TEST_F(WriterTest, VerifyCommitsFailsWrongLayerChecksumsAsCorruption) {
  Make(/*verify_commits=*/true);
  ASSERT_TRUE(Put(1).status.ok());
  std::vector<uint64_t> layers = LayerSums(BlockBytes(1));
  layers[2] ^= 1;
  EXPECT_EQ(CommitOne(1, kConn, kBlockBytes, {BlockChecksum(BlockBytes(1))}, layers).code(), StatusCode::kCorruption);
  EXPECT_FALSE(Entry(Key(1)).has_value());
  EXPECT_EQ(host_->used_bytes(), 0u);

  ASSERT_TRUE(Put(1).status.ok());
  ASSERT_TRUE(CommitOne(1, kConn, kBlockBytes, {}, LayerSums(BlockBytes(1))).ok())
      << "no whole checksum sent: hashed, and the layers checked in the same pass";
  EXPECT_EQ(Entry(Key(1))->layer_checksums, LayerSums(BlockBytes(1)));
}

TEST_F(WriterTest, LayerChecksumsAreRecordedOnlyWhenExactlyTheRightNumberIsSent) {
  Make();
  // Two blocks of the namespace's layout around one of another size,
  // which carries none of its own.
  ASSERT_TRUE(Put(1).status.ok());
  ASSERT_TRUE(Put(2, kConn, kSmallBytes).status.ok());
  ASSERT_TRUE(Put(3).status.ok());
  const BlockKey keys[] = {Key(1), Key(2), Key(3)};
  const uint64_t sizes[] = {kBlockBytes, kSmallBytes, kBlockBytes};
  std::vector<uint64_t> sent = LayerSums(BlockBytes(1));
  const std::vector<uint64_t> third = LayerSums(BlockBytes(3));
  sent.insert(sent.end(), third.begin(), third.end());
  for (const Status& s : writer_->Commit(kConn, kNs, keys, sizes, {}, sent)) EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(Entry(Key(1))->layer_checksums, LayerSums(BlockBytes(1)));
  EXPECT_TRUE(Entry(Key(2))->layer_checksums.empty()) << "one layer: its checksum is the block's";
  EXPECT_EQ(Entry(Key(3))->layer_checksums, third);

  // One too few: ignored, the blocks commit without them.
  ASSERT_TRUE(Put(4).status.ok());
  std::vector<uint64_t> short_by_one = LayerSums(BlockBytes(4));
  short_by_one.pop_back();
  ASSERT_TRUE(CommitOne(4, kConn, kBlockBytes, {}, short_by_one).ok());
  EXPECT_TRUE(Entry(Key(4))->layer_checksums.empty());
  EXPECT_EQ(Entry(Key(4))->checksum, BlockChecksum(BlockBytes(4)));
}

TEST_F(WriterTest, AbortDropsOnlyThisConnectionsReservations) {
  Make();
  ASSERT_TRUE(Put(1).status.ok());
  ASSERT_TRUE(Put(2).status.ok());
  ASSERT_TRUE(Put(3, kOtherConn).status.ok());
  ASSERT_TRUE(Put(4).status.ok());
  ASSERT_TRUE(CommitOne(4).ok());
  const BlockKey keys[] = {Key(1), Key(3), Key(4), Key(5)};
  EXPECT_EQ(writer_->Abort(kConn, keys), 1u);
  EXPECT_FALSE(Entry(Key(1)).has_value());
  EXPECT_EQ(Entry(Key(2))->state(), BlockState::kReserved) << "not named";
  EXPECT_EQ(Entry(Key(3))->state(), BlockState::kReserved) << "another connection's";
  EXPECT_EQ(Entry(Key(4))->state(), BlockState::kCommitted) << "committed blocks are not aborted";
  EXPECT_EQ(host_->used_bytes(), 3 * kBlockBytes);
  EXPECT_EQ(counters_.aborts.load(), 1);
}

TEST_F(WriterTest, AReserveIsNoSpaceWhenTheEvictorHasNothingToGive) {
  Make();
  for (uint64_t i = 0; i < kBlocks; ++i) ASSERT_TRUE(Put(i).status.ok());  // the arena, all being written
  EXPECT_EQ(Put(kBlocks).status.code(), StatusCode::kNoSpace);
  EXPECT_FALSE(Entry(Key(kBlocks)).has_value()) << "the claim is dropped";
  EXPECT_EQ(counters_.reserve_failures.load(), 1);

  // Committed blocks can be evicted: the next reserve makes room.
  ASSERT_TRUE(CommitOne(0).ok());
  const SlotGrant grant = Put(kBlocks);
  ASSERT_TRUE(grant.status.ok()) << grant.status.ToString();
  EXPECT_FALSE(Entry(Key(0)).has_value()) << "evicted (no tier below: dropped)";
}

TEST_F(WriterTest, AChainedReserveRecordsItsLinksInTheLineage) {
  Make();
  const BlockKey keys[] = {Key(1), Key(2)};
  const uint64_t sizes[] = {kBlockBytes, kBlockBytes};
  for (const SlotGrant& g : writer_->Reserve(kConn, kNs, keys, sizes, ReserveChain{true, Key(0)})) {
    EXPECT_TRUE(g.status.ok()) << g.status.ToString();
  }
  ASSERT_TRUE(lineage_.Find(Key(1)).has_value());
  EXPECT_EQ(lineage_.Find(Key(1))->parent, Key(0));
  EXPECT_EQ(lineage_.Find(Key(2))->parent, Key(1));
  EXPECT_EQ(counters_.chain_links.load(), 2);

  const BlockKey unchained[] = {Key(3)};
  const uint64_t one[] = {kBlockBytes};
  EXPECT_TRUE(writer_->Reserve(kConn, kNs, unchained, one)[0].status.ok());
  EXPECT_FALSE(lineage_.Find(Key(3)).has_value()) << "no links without a chain";
}

}  // namespace
}  // namespace kvtier

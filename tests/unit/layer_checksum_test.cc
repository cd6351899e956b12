// Per-layer checksums: the one-pass functions (common/checksum.h), and the
// engine recording a checksum per layer of a block at Commit next to the
// block's own -- as the writer sent them (checked with verify_commits),
// never hashed otherwise -- and handing them out with layer-range pins
// (with the whole block's checksum and place, for blocks without them)
// and to verifying loads.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "common/checksum.h"
#include "common/load_board.h"
#include "daemon/engine/engine.h"
#include "daemon/server/request_handler.h"
#include "proto/wire.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/test_daemon.h"
#include "tiers/host/host_tier.h"

namespace kvtier {
namespace {

using ::kvtier::testing::FakeClock;
using ::kvtier::testing::FillBlockBytes;
using ::kvtier::testing::SlotBytes;

std::vector<std::byte> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> out(n);
  for (auto& b : out) b = static_cast<std::byte>(rng());
  return out;
}

// The definition: the checksum of each layer's bytes.
std::vector<uint64_t> Expected(std::span<const std::byte> block, size_t layers) {
  std::vector<uint64_t> out;
  const size_t layer_bytes = block.size() / layers;
  for (size_t i = 0; i < layers; ++i) out.push_back(BlockChecksum(block.subspan(i * layer_bytes, layer_bytes)));
  return out;
}

TEST(LayerChecksums, OnePassGivesTheBlockAndEveryLayer) {
  // Layers below, at and above the 16 KiB chunk, not multiples of it, and
  // blocks above the streaming-copy threshold.
  for (size_t layer_bytes : {size_t{64}, size_t{4096}, kCopyChunkBytes, kCopyChunkBytes + 24, size_t{100000}}) {
    for (size_t layers : {1, 2, 3, 36}) {
      SCOPED_TRACE(std::to_string(layers) + " x " + std::to_string(layer_bytes));
      const auto block = RandomBytes(layers * layer_bytes, static_cast<uint32_t>(layers * layer_bytes));
      std::vector<uint64_t> sums(layers);
      EXPECT_EQ(ChecksumWithLayers(block, sums), BlockChecksum(block));
      EXPECT_EQ(sums, Expected(block, layers));
      std::vector<std::byte> copy(block.size());
      std::vector<uint64_t> copied(layers);
      EXPECT_EQ(CopyWithLayerChecksums(copy, block, copied), BlockChecksum(block));
      EXPECT_EQ(copied, sums);
      EXPECT_EQ(copy, block);
      EXPECT_EQ(FirstBadLayer(block, sums), layers);
      const size_t cut = block.size() / 3;
      const std::span<const std::byte> pieces[] = {std::span(block).first(cut), std::span(block).subspan(cut)};
      EXPECT_EQ(ChecksumOfPieces(pieces), BlockChecksum(block));
      copy[copy.size() - 1] ^= std::byte{1};
      EXPECT_EQ(FirstBadLayer(copy, sums), layers - 1);
    }
  }
}

TEST(LayerChecksums, Avx2AndPortableAgree) {
  if (!internal::Avx2Available()) GTEST_SKIP() << "no AVX2 here: only the portable path runs";
  const auto block = RandomBytes(9 * 40000, 5);
  std::vector<uint64_t> a(9), b(9);
  std::vector<std::byte> da(block.size()), db(block.size());
  EXPECT_EQ(internal::LayerChecksumsAvx2(da.data(), block.data(), block.size(), a.data(), 9),
            internal::LayerChecksumsPortable(db.data(), block.data(), block.size(), b.data(), 9));
  EXPECT_EQ(a, b);
  EXPECT_EQ(da, db);
}

TEST(LayerChecksums, LoadBoardTableIsAfterTheBlocks) {
  EXPECT_EQ(LoadBoardBytes(3), LoadBoardBytes(3, 0));
  EXPECT_EQ(LoadBoardBytes(3, 4), LoadBoardBytes(3) + 3 * 4 * 8);
  std::vector<uint64_t> memory(LoadBoardBytes(3, 4) / 8);
  auto* base = reinterpret_cast<std::byte*>(memory.data());
  LoadBoardWriter writer(base, 3, 4, 1024, /*checksums=*/true);
  EXPECT_TRUE(writer.has_checksums());
  writer.SetLayerChecksum(2, 3, 0xabc);
  writer.SetLayerChecksum(0, 0, 0x123);
  LoadBoardReader reader(base, 3, 4);
  EXPECT_EQ(reader.layer_checksum(2, 3), 0xabcu);
  EXPECT_EQ(reader.layer_checksum(0, 0), 0x123u);
  EXPECT_EQ(reinterpret_cast<const LoadBoardHeader*>(base)->version, kLoadBoardChecksumsVersion);
  LoadBoardWriter plain(base, 3, 4, 1024);
  EXPECT_FALSE(plain.has_checksums());
  EXPECT_EQ(reinterpret_cast<const LoadBoardHeader*>(base)->version, kLoadBoardVersion);
}

constexpr uint32_t kLayers = 4;
constexpr uint64_t kLayerBytes = 4096;
constexpr uint64_t kBlockBytes = kLayers * kLayerBytes;
constexpr ConnectionId kWriter = 1;
constexpr ConnectionId kReader = 2;

BlockKey Key(uint64_t i) { return BlockKey{0x1a7e5, i}; }

// Per-layer checksums at Commit, over a real Engine and HostTier.
class CommitLayerChecksumTest : public ::testing::Test {
 protected:
  void Make(bool verify_commits) {
    engine_.reset();
    host_ = ::kvtier::testing::OpenTestHostTier(32 * kBlockBytes);
    ASSERT_NE(host_, nullptr);
    EngineOptions options{2, EvictionPolicyId::kLru};
    options.verify_commits = verify_commits;
    auto engine = Engine::Create(options, *host_, clock_);
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    engine_ = std::move(*engine);
    engine_->RegisterNamespace(ns_, NamespaceLayout{kLayers, kBlockBytes});
  }
  void SetUp() override { Make(/*verify_commits=*/false); }

  // Reserves `key` (`size` bytes) and fills it; returns its bytes.
  std::span<std::byte> ReserveAndFill(const BlockKey& key, uint64_t size = kBlockBytes) {
    auto grant = engine_->Reserve(kWriter, ns_, {&key, 1}, {&size, 1})[0];
    EXPECT_TRUE(grant.status.ok()) << grant.status.ToString();
    auto bytes = SlotBytes(*host_, grant.offset, grant.length);
    FillBlockBytes(key, 3, bytes);
    return bytes;
  }
  Status Commit(const BlockKey& key, std::vector<uint64_t> checksums, std::vector<uint64_t> layers,
                uint64_t size = kBlockBytes) {
    return engine_->Commit(kWriter, ns_, {&key, 1}, {&size, 1}, checksums, layers)[0];
  }
  // The layer checksums a pin of layers [first, last) of `key` hands out;
  // the grant also names the whole block and its checksum.
  std::vector<uint64_t> PinnedLayers(const BlockKey& key, uint32_t first, uint32_t last) {
    PinGrant g = engine_->Pin(kReader, ns_, {&key, 1}, LayerSpan{first, last})[0];
    EXPECT_TRUE(g.status.ok()) << g.status.ToString();
    if (!g.status.ok()) return {};
    const auto block = SlotBytes(*host_, g.block_offset, g.block_length);
    EXPECT_EQ(g.checksum, BlockChecksum(block)) << "the whole block's checksum";
    EXPECT_EQ(g.block_length, kBlockBytes);
    EXPECT_EQ(g.offset, g.block_offset + first * kLayerBytes);
    EXPECT_TRUE(engine_->Release(kReader, {&g.lease, 1})[0].ok());
    return g.layer_checksums;
  }
  std::vector<uint64_t> Slice(const std::vector<uint64_t>& v, size_t first, size_t last) {
    return std::vector<uint64_t>(v.begin() + first, v.begin() + last);
  }

  FakeClock clock_;
  std::unique_ptr<HostTier> host_;
  std::unique_ptr<Engine> engine_;
  const NamespaceFingerprint ns_{0x5eed, 0x1a7};
};

TEST_F(CommitLayerChecksumTest, SentLayerChecksumsAreRecordedAtCommit) {
  const auto bytes = ReserveAndFill(Key(1));
  const auto expected = Expected(bytes, kLayers);
  ASSERT_TRUE(Commit(Key(1), {BlockChecksum(bytes)}, expected).ok());
  EXPECT_EQ(PinnedLayers(Key(1), 0, kLayers), expected);
  EXPECT_EQ(PinnedLayers(Key(1), 1, 3), Slice(expected, 1, 3));
  EXPECT_EQ(PinnedLayers(Key(1), 3, 4), Slice(expected, 3, 4));
  const BlockKey key = Key(1);
  PinGrant g = engine_->Pin(kReader, ns_, {&key, 1})[0];
  ASSERT_TRUE(g.status.ok());
  EXPECT_EQ(g.checksum, BlockChecksum(bytes)) << "the block's own checksum as before";
  EXPECT_TRUE(g.layer_checksums.empty()) << "a plain whole pin carries no layer checksums";
  EXPECT_TRUE(engine_->Release(kReader, {&g.lease, 1})[0].ok());
}

TEST_F(CommitLayerChecksumTest, SentLayerChecksumsAreRecordedAsSent) {
  const auto bytes = ReserveAndFill(Key(1));
  auto sent = Expected(bytes, kLayers);
  sent[2] ^= 1;  // wrong, but verify_commits is off: taken as sent, as the block's is
  ASSERT_TRUE(Commit(Key(1), {BlockChecksum(bytes)}, sent).ok());
  EXPECT_EQ(PinnedLayers(Key(1), 0, kLayers), sent);
}

TEST_F(CommitLayerChecksumTest, LayerChecksumsWithoutTheBlocksAreRecordedAndTheBlockHashed) {
  // A layer-wise save: the writer took each layer's checksum as it saved
  // it; the engine hashes the block as it does for any commit without one.
  const auto bytes = ReserveAndFill(Key(1));
  ASSERT_TRUE(Commit(Key(1), {}, Expected(bytes, kLayers)).ok());
  EXPECT_EQ(PinnedLayers(Key(1), 0, kLayers), Expected(bytes, kLayers));
}

TEST_F(CommitLayerChecksumTest, WithoutLayerChecksumsTheEngineHashesNoLayer) {
  // What a writer that does not verify sends: the block's checksum alone.
  // Nothing more is hashed (it costs that writer nothing); layer grants
  // then carry only the whole block's checksum and place (checked above).
  const auto bytes = ReserveAndFill(Key(1));
  ASSERT_TRUE(Commit(Key(1), {BlockChecksum(bytes)}, {}).ok());
  EXPECT_TRUE(PinnedLayers(Key(1), 1, 3).empty());
  ReserveAndFill(Key(2));
  ASSERT_TRUE(Commit(Key(2), {}, {}).ok());
  EXPECT_TRUE(PinnedLayers(Key(2), 0, kLayers).empty());
}

TEST_F(CommitLayerChecksumTest, AWrongCountOfLayerChecksumsIsIgnored) {
  const auto bytes = ReserveAndFill(Key(1));
  ASSERT_TRUE(Commit(Key(1), {BlockChecksum(bytes)}, {1, 2, 3}).ok());
  EXPECT_TRUE(PinnedLayers(Key(1), 0, kLayers).empty());
}

TEST_F(CommitLayerChecksumTest, VerifiedCommitChecksTheLayersSent) {
  Make(/*verify_commits=*/true);
  const auto bytes = ReserveAndFill(Key(1));
  auto sent = Expected(bytes, kLayers);
  ASSERT_TRUE(Commit(Key(1), {BlockChecksum(bytes)}, sent).ok());
  const auto other = ReserveAndFill(Key(2));
  auto wrong = Expected(other, kLayers);
  wrong[0] += 1;
  EXPECT_EQ(Commit(Key(2), {BlockChecksum(other)}, wrong).code(), StatusCode::kCorruption);
}

TEST_F(CommitLayerChecksumTest, ABlockOfAnotherSizeIsOneLayer) {
  const uint64_t size = 5000;
  const auto bytes = ReserveAndFill(Key(1), size);
  ASSERT_TRUE(Commit(Key(1), {}, {}, size).ok());
  PinGrant g = engine_->Pin(kReader, ns_, std::vector<BlockKey>{Key(1)}, LayerSpan{0, 1})[0];
  ASSERT_TRUE(g.status.ok()) << g.status.ToString();
  EXPECT_EQ(g.layer_checksums, std::vector<uint64_t>{BlockChecksum(bytes)}) << "its one layer's is the block's";
  EXPECT_EQ(g.length, size);
  EXPECT_TRUE(engine_->Release(kReader, {&g.lease, 1})[0].ok());
}

TEST_F(CommitLayerChecksumTest, AVerifyingLoadGetsEveryLayerOfItsHostHits) {
  const auto bytes = ReserveAndFill(Key(1));
  ASSERT_TRUE(Commit(Key(1), {}, Expected(bytes, kLayers)).ok());
  const auto other = ReserveAndFill(Key(2));
  ASSERT_TRUE(Commit(Key(2), {}, {}).ok());  // no layer checksums
  const BlockKey keys[] = {Key(1), Key(2)};
  auto load = engine_->BeginLoad(kReader, ns_, keys, {.verify = true});
  ASSERT_TRUE(load.ok()) << load.status().ToString();
  EXPECT_EQ(load->board_bytes, LoadBoardBytes(2, kLayers));
  ASSERT_EQ(load->layer_checksums.size(), 2u);
  EXPECT_EQ(load->layer_checksums[0].layers, Expected(bytes, kLayers));
  EXPECT_EQ(load->layer_checksums[0].block, BlockChecksum(bytes));
  EXPECT_TRUE(load->layer_checksums[1].layers.empty()) << "checked whole by the client";
  EXPECT_TRUE(load->layer_checksums[0].settled && load->layer_checksums[1].settled);
  EXPECT_EQ(load->layer_checksums[1].block, BlockChecksum(other));
  EXPECT_TRUE(load->blocks[0].ok() && load->blocks[1].ok());
  LoadBoardReader board(SlotBytes(*host_, load->board_offset, load->board_bytes).data(), 2, kLayers);
  for (uint32_t l = 0; l < kLayers; ++l) EXPECT_EQ(board.layer_checksum(0, l), Expected(bytes, kLayers)[l]);
  EXPECT_TRUE(engine_->EndLoad(kReader, load->load).ok());
  const BlockKey key = Key(1);
  auto plain = engine_->BeginLoad(kReader, ns_, {&key, 1});
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->board_bytes, LoadBoardBytes(1)) << "no table unless asked";
  EXPECT_TRUE(plain->layer_checksums.empty());
  EXPECT_TRUE(engine_->EndLoad(kReader, plain->load).ok());
}

TEST_F(CommitLayerChecksumTest, HandlerPassesLayerChecksumsBothWays) {
  HandlerContext context;
  context.engine = engine_.get();
  context.arena_bytes = host_->capacity_bytes();
  context.max_frame_bytes = 1 << 20;
  RequestHandler handler(context, kWriter);
  v1::Request hello;
  hello.set_id(1);
  hello.mutable_hello()->set_protocol_version(wire::kProtocolVersion);
  // A namespace of this layout, registered by the handler's Hello.
  NamespaceDescriptor d = ::kvtier::testing::TestNamespace();
  d.block_tokens = 16;
  d.layer_count = kLayers;
  d.bytes_per_token_per_layer = kLayerBytes / 16;
  wire::ToProto(d, hello.mutable_hello()->add_namespaces());
  v1::Response r;
  handler.Handle(hello, r);
  ASSERT_EQ(r.status().code(), 0) << r.status().message();
  const NamespaceFingerprint ns = FingerprintNamespace(d);
  const BlockKey key = Key(9);
  const uint64_t size = kBlockBytes;
  auto grant = engine_->Reserve(kWriter, ns, {&key, 1}, {&size, 1})[0];
  ASSERT_TRUE(grant.status.ok());
  auto bytes = SlotBytes(*host_, grant.offset, grant.length);
  FillBlockBytes(key, 4, bytes);
  auto sent = Expected(bytes, kLayers);
  sent[1] ^= 0x10;  // distinguishable from the engine's own hash
  v1::Request commit = wire::MakeCommit(0, std::vector<BlockKey>{key}, std::vector<uint64_t>{size},
                                        std::vector<uint64_t>{BlockChecksum(bytes)});
  commit.mutable_commit()->mutable_layer_checksums()->Add(sent.begin(), sent.end());
  commit.set_id(2);
  handler.Handle(commit, r);
  ASSERT_EQ(r.status().code(), 0) << r.status().message();
  ASSERT_EQ(r.commit().statuses(0).code(), 0) << r.commit().statuses(0).message();
  v1::Request pin = wire::MakePinLayers(0, std::vector<BlockKey>{key}, 1, 3);
  pin.set_id(3);
  handler.Handle(pin, r);
  ASSERT_EQ(r.status().code(), 0) << r.status().message();
  ASSERT_EQ(r.pin().blocks_size(), 1);
  ASSERT_EQ(r.pin().blocks(0).layer_checksums_size(), 2);
  EXPECT_EQ(r.pin().blocks(0).layer_checksums(0), sent[1]);
  EXPECT_EQ(r.pin().blocks(0).layer_checksums(1), sent[2]);
}

}  // namespace
}  // namespace kvtier

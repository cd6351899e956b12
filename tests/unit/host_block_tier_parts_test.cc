// The host tier's BlockTier face (daemon/engine/host_block_tier.h) on the
// engine's parts without an Engine: real index shards over a real arena,
// a real Writer (its room straight from the arena), the Pinner and
// Promoter of tests/testing/pin_parts.h, and a mover of its own for the
// completions. A written block is found with its namespace's layer split
// and reads back whole or by layers with their checksums; a write whose
// layers or checksum are wrong leaves nothing behind; Erase drops only
// the host tier's block; every completion is counted as I/O in flight and
// ended.
#include "daemon/engine/host_block_tier.h"

#include <gtest/gtest.h>

#include <future>
#include <memory>
#include <span>
#include <vector>

#include "common/checksum.h"
#include "daemon/engine/block_index.h"
#include "daemon/engine/lineage.h"
#include "tests/testing/pin_parts.h"

namespace kvtier {
namespace {

constexpr NamespaceFingerprint kNs{0x914, 0x4b};
constexpr ConnectionId kConn = 9;

class HostBlockTierPartsTest : public ::testing::Test, protected ::kvtier::testing::PinParts {
 protected:
  HostBlockTierPartsTest() {
    Writer::Hooks writes;
    writes.allocate = [this](uint64_t bytes) { return host_->Allocate(bytes); };
    writes.layer_count = LayerCount;
    writes.next_handle = [this] { return next_handle_++; };
    writer_ = std::make_unique<Writer>(shards_, *host_, lineage_, clock_, /*verify_commits=*/false, counters_,
                                       std::move(writes));
    HostBlockTier::Hooks hooks;
    hooks.io_started = [this] { ++io_started_; };
    hooks.io_finished = [this] { ++io_finished_; };
    hooks.layer_count = LayerCount;
    tier_ = std::make_unique<HostBlockTier>(shards_, *host_, clock_, *writer_, *pinner_, *io_, std::move(hooks));
  }
  ~HostBlockTierPartsTest() override {
    io_.reset();  // runs the completions still queued, as the engine's host_io_ goes first
    EXPECT_EQ(io_started_.load(), io_finished_.load());
  }

  Status Write(uint64_t i, uint32_t layers = kLayers, std::optional<uint64_t> checksum = std::nullopt) {
    const std::vector<std::byte> bytes = BlockBytes(i);
    std::promise<Status> done;
    const Status accepted = tier_->Write(
        kNs, Key(i), layers, bytes, [&done](Status s) { done.set_value(s); }, checksum);
    if (!accepted.ok()) return accepted;
    return done.get_future().get();
  }
  // Layers [first, last) of block `i`, with their checksums.
  Result<BlockTier::LayerRead> Read(uint64_t i, uint32_t first, uint32_t last, std::vector<std::byte>& out) {
    out.assign((last - first) * kLayerBytes, std::byte{0});
    std::promise<Result<BlockTier::LayerRead>> done;
    const Status accepted = tier_->ReadWithLayerChecksums(
        Key(i), first, last, out, [&done](Result<BlockTier::LayerRead> r) { done.set_value(std::move(r)); });
    if (!accepted.ok()) return accepted;
    return done.get_future().get();
  }
  static std::vector<std::byte> Layers(uint64_t i, uint32_t first, uint32_t last) {
    const std::vector<std::byte> bytes = BlockBytes(i);
    return std::vector<std::byte>(bytes.begin() + first * kLayerBytes, bytes.begin() + last * kLayerBytes);
  }

  Lineage lineage_{64};
  std::unique_ptr<Writer> writer_;
  // Only the pointer: reset first in the destructor, then the face.
  std::unique_ptr<Mover> io_ = std::make_unique<Mover>("test.host_io", 1, 0, 64);
  std::unique_ptr<HostBlockTier> tier_;
};

TEST_F(HostBlockTierPartsTest, AWrittenBlockIsFoundAndReadsBackWholeOrByLayers) {
  ASSERT_TRUE(Write(1).ok());
  const std::optional<BlockTier::BlockInfo> info = tier_->Find(Key(1));
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->ns, kNs);
  EXPECT_EQ(info->payload_bytes, kBlockBytes);
  EXPECT_EQ(info->layer_count, kLayers);
  EXPECT_EQ(info->payload_checksum, BlockChecksum(BlockBytes(1)));
  std::optional<BlockEntry> entry = Entry(Key(1));
  ASSERT_TRUE(entry.has_value());
  EXPECT_EQ(entry->state(), BlockState::kCommitted) << "a client's block like any other";
  EXPECT_EQ(entry->layer_checksums, LayerSums(BlockBytes(1))) << "hashed as the bytes were copied";
  EXPECT_EQ(tier_->used_bytes(), kBlockBytes);
  EXPECT_EQ(tier_->write_totals().device_bytes, kBlockBytes);

  std::vector<std::byte> out;
  Result<BlockTier::LayerRead> whole = Read(1, 0, kLayers, out);
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  EXPECT_EQ(whole->bytes, kBlockBytes);
  EXPECT_EQ(out, BlockBytes(1));
  EXPECT_EQ(whole->layer_checksums, LayerSums(BlockBytes(1)));
  Result<BlockTier::LayerRead> middle = Read(1, 1, 3, out);
  ASSERT_TRUE(middle.ok()) << middle.status().ToString();
  EXPECT_EQ(out, Layers(1, 1, 3));
  const std::vector<uint64_t> sums = LayerSums(BlockBytes(1));
  EXPECT_EQ(middle->layer_checksums, std::vector<uint64_t>(sums.begin() + 1, sums.begin() + 3));
  EXPECT_EQ(Entry(Key(1))->state(), BlockState::kCommitted) << "each read's pin was released";

  std::vector<std::byte> too_small(kLayerBytes);
  EXPECT_EQ(tier_->Read(Key(1), 0, 2, too_small, [](Result<size_t>) {}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(tier_->Read(Key(1), 2, 5, out, [](Result<size_t>) {}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(tier_->Read(Key(2), 0, 1, out, [](Result<size_t>) {}).code(), StatusCode::kNotFound);
}

TEST_F(HostBlockTierPartsTest, AWriteWithTheWrongLayersOrChecksumLeavesNothing) {
  EXPECT_EQ(Write(1, /*layers=*/1).code(), StatusCode::kInvalidArgument) << "the namespace's layout has 4";
  EXPECT_EQ(Write(2, kLayers, BlockChecksum(BlockBytes(3))).code(), StatusCode::kCorruption);
  EXPECT_FALSE(Entry(Key(1)).has_value());
  EXPECT_FALSE(Entry(Key(2)).has_value()) << "the reservation was aborted";
  EXPECT_EQ(host_->used_bytes(), 0u);
  ASSERT_TRUE(Write(2, kLayers, BlockChecksum(BlockBytes(2))).ok());
  EXPECT_EQ(Write(2).code(), StatusCode::kAlreadyExists);
}

TEST_F(HostBlockTierPartsTest, ABlockAClientPinnedIsReadToo) {
  ASSERT_TRUE(Write(1).ok());
  const std::vector<PinGrant> pins = pinner_->Pin(kConn, kNs, std::vector<BlockKey>{Key(1)});
  ASSERT_TRUE(pins[0].status.ok());
  std::vector<std::byte> out;
  ASSERT_TRUE(Read(1, 0, kLayers, out).ok());
  EXPECT_EQ(out, BlockBytes(1));
  EXPECT_EQ(Entry(Key(1))->state(), BlockState::kPinned) << "the client's pin stays";
  EXPECT_TRUE(pinner_->Release(kConn, {&pins[0].lease, 1})[0].ok());
}

TEST_F(HostBlockTierPartsTest, EraseDropsOnlyTheHostTiersBlock) {
  Store(1, kNs);  // a copy below
  ASSERT_TRUE(Write(1).ok());
  EXPECT_TRUE(tier_->Erase(Key(1)).ok());
  EXPECT_FALSE(tier_->Find(Key(1)).has_value());
  EXPECT_FALSE(Entry(Key(1)).has_value());
  EXPECT_EQ(host_->used_bytes(), 0u) << "its space is back";
  EXPECT_TRUE(map_.Find(Key(1)).has_value()) << "the tier below keeps its copy";
  EXPECT_EQ(tier_->Erase(Key(1)).code(), StatusCode::kNotFound);
  std::vector<std::byte> out;
  EXPECT_EQ(Read(1, 0, 1, out).status().code(), StatusCode::kNotFound) << "a read never promotes";
  EXPECT_EQ(below_.reads.load(), 0);
}

TEST_F(HostBlockTierPartsTest, BytesThatRottedAreCorruptionAndTheBlockIsDropped) {
  ASSERT_TRUE(Write(1).ok());
  const std::optional<BlockEntry> entry = Entry(Key(1));
  ASSERT_TRUE(entry.has_value());
  ::kvtier::testing::SlotBytes(*host_, entry->extent.offset, entry->extent.length)[5] ^= std::byte{0x01};
  std::vector<std::byte> out;
  EXPECT_EQ(Read(1, 0, 1, out).status().code(), StatusCode::kCorruption);
  EXPECT_FALSE(tier_->Find(Key(1)).has_value());
  EXPECT_FALSE(Entry(Key(1)).has_value());
}

}  // namespace
}  // namespace kvtier

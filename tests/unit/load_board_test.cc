// Tests of the load board (common/load_board.h) as the daemon writes it and
// the client reads it (client_lib/board_view.h, what LayerLoad's status,
// usable_prefix, LayerSpan and device copies go by), on a board in plain
// memory: a block whole in the daemon's device pool (kInDevice) is final
// and loaded, and has no arena bytes.
#include "common/load_board.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "client_lib/board_view.h"

namespace kvtier {
namespace {

using internal::BoardBlockStatus;
using internal::BoardLayerPlace;
using internal::LayerPlace;

constexpr uint32_t kBlocks = 4;
constexpr uint32_t kLayers = 3;
constexpr uint64_t kLayerBytes = 4096;

class LoadBoardTest : public ::testing::Test {
 protected:
  LoadBoardTest()
      : memory_(LoadBoardBytes(kBlocks) / sizeof(uint64_t)),
        writer_(Bytes(), kBlocks, kLayers, kLayerBytes),
        reader_(Bytes(), kBlocks) {}

  std::byte* Bytes() { return reinterpret_cast<std::byte*>(memory_.data()); }

  // Blocks from 0 on before the first whose status is not Ok, as
  // LayerLoad::usable_prefix counts them.
  size_t UsablePrefix(bool device_pool) const {
    size_t n = 0;
    while (n < kBlocks && BoardBlockStatus(reader_, static_cast<uint32_t>(n), device_pool).ok()) ++n;
    return n;
  }

  std::vector<uint64_t> memory_;  // 8-byte aligned, as the arena extent is
  LoadBoardWriter writer_;
  LoadBoardReader reader_;
};

TEST_F(LoadBoardTest, FormatsVersionTwoWithNothingReady) {
  const auto* header = reinterpret_cast<const LoadBoardHeader*>(Bytes());
  EXPECT_EQ(header->version, 2u);
  EXPECT_EQ(header->blocks, kBlocks);
  EXPECT_EQ(header->layers, kLayers);
  EXPECT_EQ(header->layer_bytes, kLayerBytes);
  EXPECT_EQ(reader_.layers_ready(), 0u);
  EXPECT_EQ(reader_.resolved(), 0u);
  for (uint32_t b = 0; b < kBlocks; ++b) {
    EXPECT_EQ(reader_.state(b), BoardBlockState::kLoading);
    EXPECT_TRUE(BoardBlockStatus(reader_, b, /*device_pool=*/false).ok()) << "loading is ok";
    EXPECT_EQ(BoardLayerPlace(reader_, b, 0, false).status().code(), StatusCode::kNotFound) << "not in place yet";
  }
}

TEST_F(LoadBoardTest, ABlockInDeviceIsResolvedAndLoadedAtOnce) {
  writer_.SetOffset(0, 8192);
  writer_.SetInDevice(1, 1 << 20);
  writer_.SetOffset(2, 65536);
  writer_.SetOffset(3, 131072);
  EXPECT_EQ(reader_.state(1), BoardBlockState::kInDevice);
  EXPECT_EQ(reader_.offset(1), uint64_t{1} << 20);
  EXPECT_EQ(reader_.resolved(), 1u) << "final like kLoaded";
  EXPECT_EQ(reader_.layers_ready(), 0u) << "the arena blocks are still loading";

  // A load that asked for the device pool: Ok, and every layer is in the
  // pool at once at offset + l * layer_bytes, before layers_ready says so.
  EXPECT_TRUE(BoardBlockStatus(reader_, 1, /*device_pool=*/true).ok());
  for (uint32_t l = 0; l < kLayers; ++l) {
    auto place = BoardLayerPlace(reader_, 1, l, true);
    ASSERT_TRUE(place.ok()) << place.status().ToString();
    EXPECT_EQ(place->memory, LayerPlace::Memory::kDevicePool);
    EXPECT_EQ(place->block_offset, uint64_t{1} << 20);
  }
  EXPECT_EQ(BoardLayerPlace(reader_, 0, 0, true).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(UsablePrefix(true), kBlocks) << "an in-device block counts as loaded";

  // The arena blocks land layer by layer; the in-device one stays where it is.
  for (uint32_t l = 0; l < kLayers; ++l) {
    writer_.PublishLayers(l + 1);
    for (uint32_t b : {0u, 2u, 3u}) {
      auto place = BoardLayerPlace(reader_, b, l, true);
      ASSERT_TRUE(place.ok()) << b << "/" << l << ": " << place.status().ToString();
      EXPECT_EQ(place->memory, LayerPlace::Memory::kArena);
    }
    EXPECT_EQ(BoardLayerPlace(reader_, 1, l, true)->memory, LayerPlace::Memory::kDevicePool);
  }
  EXPECT_EQ(BoardLayerPlace(reader_, 2, 1, true)->block_offset, 65536u);
  for (uint32_t b : {0u, 2u, 3u}) writer_.SetLoaded(b);
  EXPECT_EQ(reader_.resolved(), kBlocks) << "the load is over";
  EXPECT_EQ(UsablePrefix(true), kBlocks);
}

TEST_F(LoadBoardTest, ABlockInDeviceOnALoadThatDidNotAskIsNeverUsed) {
  writer_.SetOffset(0, 0);
  writer_.SetInDevice(1, 4096);
  writer_.PublishLayers(kLayers);
  Status s = BoardBlockStatus(reader_, 1, /*device_pool=*/false);
  EXPECT_EQ(s.code(), StatusCode::kProtocolError) << s.ToString();
  EXPECT_EQ(BoardLayerPlace(reader_, 1, 0, false).status().code(), StatusCode::kProtocolError)
      << "its offset is not an arena offset: no span of it";
  EXPECT_EQ(UsablePrefix(false), 1u);
}

TEST_F(LoadBoardTest, AFailedBlockAnswersItsCodeEvenWithItsLayersCounted) {
  writer_.SetOffset(0, 0);
  writer_.SetInDevice(1, 4096);
  writer_.SetFailed(2, StatusCode::kCorruption);
  writer_.SetFailed(3, StatusCode::kOk);  // a daemon bug: still not ok
  writer_.PublishLayers(kLayers);
  EXPECT_EQ(reader_.resolved(), 3u);
  EXPECT_EQ(BoardBlockStatus(reader_, 2, true).code(), StatusCode::kCorruption);
  EXPECT_EQ(BoardLayerPlace(reader_, 2, 0, true).status().code(), StatusCode::kCorruption);
  EXPECT_EQ(BoardBlockStatus(reader_, 3, true).code(), StatusCode::kInternal);
  EXPECT_EQ(UsablePrefix(true), 2u) << "blocks 0 (arena) and 1 (device) are usable, 2 is not";
}

TEST_F(LoadBoardTest, AStateTheFormatDoesNotHaveIsAProtocolError) {
  auto* blocks = reinterpret_cast<LoadBoardBlock*>(Bytes() + sizeof(LoadBoardHeader));
  blocks[0].state.store(7);  // the client can scribble on its own board
  writer_.PublishLayers(kLayers);
  EXPECT_EQ(BoardBlockStatus(reader_, 0, true).code(), StatusCode::kProtocolError);
  EXPECT_EQ(BoardLayerPlace(reader_, 0, 0, true).status().code(), StatusCode::kProtocolError);
  EXPECT_EQ(UsablePrefix(true), 0u);
}

}  // namespace
}  // namespace kvtier

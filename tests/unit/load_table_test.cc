// Tests of LoadTable and LoadRecord: the per-connection cap on open loads,
// a slot invisible until filled, ids never reused, and a record's board
// showing a layer only once every block has it in place or failed.
#include "daemon/engine/load_table.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>

namespace kvtier {
namespace {

TEST(LoadTableTest, AConnectionHoldsAtMostItsCapAndOthersAreUnaffected) {
  LoadTable table(2);
  Result<uint64_t> a = table.Open(1);
  Result<uint64_t> b = table.Open(1);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(*a, *b);
  Result<uint64_t> c = table.Open(1);
  EXPECT_EQ(c.status().code(), StatusCode::kBusy) << "a slot still opening counts";
  EXPECT_TRUE(table.Open(2).ok()) << "another connection's loads are its own";
  table.Abandon(1, *a);
  EXPECT_TRUE(table.Open(1).ok()) << "an abandoned slot is free again";
  EXPECT_EQ(table.OpenCount(), 3);
}

TEST(LoadTableTest, ALoadIsFoundOnlyOnceFilledAndOnlyByItsConnection) {
  LoadTable table(4);
  const uint64_t id = *table.Open(1);
  EXPECT_EQ(table.Take(1, id), nullptr) << "still opening";
  auto load = std::make_shared<LoadRecord>();
  table.Fill(1, id, load);
  EXPECT_EQ(table.Take(2, id), nullptr) << "another connection's id";
  EXPECT_EQ(table.Ids(1), (std::vector<uint64_t>{id}));
  EXPECT_EQ(table.Take(1, id), load);
  EXPECT_EQ(table.Take(1, id), nullptr) << "taken once";
  EXPECT_TRUE(table.Ids(1).empty());
  EXPECT_EQ(table.OpenCount(), 0);
}

TEST(LoadTableTest, IdsAreNeverReused) {
  LoadTable table(1);
  std::vector<uint64_t> ids;
  for (int i = 0; i < 5; ++i) {
    const uint64_t id = *table.Open(1);
    ids.push_back(id);
    table.Abandon(1, id);
  }
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(std::unique(ids.begin(), ids.end()), ids.end());
}

TEST(LoadRecordTest, ALayerIsPublishedOnlyWhenEveryBlockHasIt) {
  constexpr uint32_t kBlocks = 2, kLayers = 3;
  std::vector<std::byte> board_bytes(LoadBoardBytes(kBlocks, 0));
  LoadRecord load;
  load.layers = kLayers;
  load.board = LoadBoardWriter(board_bytes.data(), kBlocks, kLayers, 4096, false);
  load.pending.assign(kLayers, kBlocks);
  load.counted.assign(kBlocks * kLayers, 0);
  LoadBoardReader reader(board_bytes.data(), kBlocks);
  load.Count(0, 0);
  load.Count(0, 0);  // counted once
  load.Advance();
  EXPECT_EQ(reader.layers_ready(), 0u) << "block 1 lacks layer 0";
  load.Count(1, 1);
  load.Advance();
  EXPECT_EQ(reader.layers_ready(), 0u) << "layer 1 alone does not make layer 0 ready";
  load.Count(1, 0);
  load.Advance();
  EXPECT_EQ(reader.layers_ready(), 1u);
  load.Count(0, 1);
  load.Advance();
  EXPECT_EQ(reader.layers_ready(), 2u);
}

}  // namespace
}  // namespace kvtier

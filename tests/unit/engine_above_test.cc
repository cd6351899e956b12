// The tier above the host (daemon/engine/above_mover.h), with a MapTier in the
// HBM tier's role (capacity, in-place holds), so the placement runs on
// machines without a GPU: loads into GPU memory hold blocks in place,
// their hits are copied up, Lookup reports the tier, a pin of a block
// held only there reads it back, Erase reaches it, and its evictions
// demote into the host tier unless another tier holds the block.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "common/load_board.h"
#include "daemon/engine/engine.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/map_tier.h"
#include "tests/testing/test_daemon.h"

namespace kvtier {
namespace {

using ::kvtier::testing::CheckBlockBytes;
using ::kvtier::testing::FakeClock;
using ::kvtier::testing::MapTier;
using ::kvtier::testing::SlotBytes;

constexpr uint32_t kLayers = 4;
constexpr uint64_t kLayerBytes = 4 << 10;
constexpr uint64_t kBlockBytes = kLayers * kLayerBytes;
constexpr NamespaceFingerprint kNs{0xab0e, 0x7e5};
constexpr ConnectionId kConn = 3;

BlockKey Key(uint64_t i) { return BlockKey{0xab, i}; }

class EngineAboveTest : public ::testing::Test {
 protected:
  // The tier above holds two blocks.
  void SetUp() override { Open(2 * kBlockBytes); }

  void Open(uint64_t above_bytes) {
    engine_.reset();
    above_ = std::make_unique<MapTier>(above_bytes, "hbm");
    host_ = ::kvtier::testing::OpenTestHostTier(64 * kBlockBytes);
    ASSERT_NE(host_, nullptr);
    auto engine = Engine::Create(EngineOptions{4, EvictionPolicyId::kLru}, *host_, clock_, {}, above_.get());
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    engine_ = std::move(*engine);
    engine_->RegisterNamespace(kNs, NamespaceLayout{kLayers, kBlockBytes});
  }
  void TearDown() override { engine_.reset(); }

  void Put(const BlockKey& key) {
    ASSERT_TRUE(::kvtier::testing::PutFilledBlock(*engine_, *host_, kConn, kNs, key, kBlockBytes).ok());
  }
  // A load of `key` into GPU memory (in place), ended at once; the block
  // it found is offered up. Returns the board state of the block.
  BoardBlockState LoadInPlace(const BlockKey& key) {
    auto start = engine_->BeginLoad(kConn, kNs, {&key, 1}, {.in_place = true});
    EXPECT_TRUE(start.ok()) << start.status().ToString();
    if (!start.ok()) return BoardBlockState::kFailed;
    engine_->WaitForIdle();
    const BoardBlockState state = Board(*start).state(0);
    EXPECT_TRUE(engine_->EndLoad(kConn, start->load).ok());
    engine_->WaitForIdle();
    return state;
  }
  LoadBoardReader Board(const Engine::LoadStart& start) {
    return LoadBoardReader(SlotBytes(*host_, start.board_offset, start.board_bytes).data(),
                           static_cast<uint32_t>(start.blocks.size()));
  }
  // The block is in the host tier with its bytes (pinned and checked).
  bool InHostExact(const BlockKey& key) { return engine_->host_tier().Find(key).has_value() && PinExact(key); }
  // A Pin of `key` (which may promote it) gets its exact bytes.
  bool PinExact(const BlockKey& key) {
    auto grants = engine_->Pin(kConn, kNs, {&key, 1});
    if (!grants[0].status.ok()) return false;
    const bool exact = CheckBlockBytes(key, 0, SlotBytes(*host_, grants[0].offset, grants[0].length));
    engine_->Release(kConn, {&grants[0].lease, 1});
    return exact;
  }
  int64_t Counter(const std::string& name) { return ::kvtier::testing::EngineCounters(*engine_)[name]; }

  FakeClock clock_;
  std::unique_ptr<MapTier> above_;
  std::unique_ptr<HostTier> host_;
  std::unique_ptr<Engine> engine_;
};

TEST_F(EngineAboveTest, AHitOfALoadIntoGpuMemoryIsCopiedUpAndNextHeldInPlace) {
  Put(Key(1));
  EXPECT_EQ(::kvtier::testing::LookupTier(*engine_, kNs, Key(1)), Tier::kHost);
  EXPECT_EQ(LoadInPlace(Key(1)), BoardBlockState::kLoaded);  // from the arena
  ASSERT_TRUE(above_->Find(Key(1)).has_value());
  EXPECT_EQ(Counter("engine.hbm_copies_up"), 1);
  EXPECT_EQ(::kvtier::testing::LookupTier(*engine_, kNs, Key(1)), Tier::kHbm);

  const BlockKey key = Key(1);
  auto start = engine_->BeginLoad(kConn, kNs, {&key, 1}, {.in_place = true});
  ASSERT_TRUE(start.ok());
  LoadBoardReader board = Board(*start);
  ASSERT_EQ(board.state(0), BoardBlockState::kInDevice);
  EXPECT_EQ(board.layers_ready(), kLayers);
  EXPECT_EQ(board.resolved(), 1u);
  EXPECT_TRUE(CheckBlockBytes(key, 0, above_->InPlaceBytes(board.offset(0))));
  EXPECT_EQ(above_->holds(), 1);
  EXPECT_EQ(Counter("engine.hbm_in_place_blocks"), 1);
  ASSERT_TRUE(engine_->EndLoad(kConn, start->load).ok());
  EXPECT_EQ(above_->holds(), 0);
  EXPECT_EQ(above_->bad_releases(), 0);
}

TEST_F(EngineAboveTest, LoadsIntoHostMemoryNeitherCopyUpNorGetBlocksInPlace) {
  Put(Key(1));
  const BlockKey key = Key(1);
  auto start = engine_->BeginLoad(kConn, kNs, {&key, 1});
  ASSERT_TRUE(start.ok());
  engine_->WaitForIdle();
  EXPECT_EQ(Board(*start).state(0), BoardBlockState::kLoaded);
  ASSERT_TRUE(engine_->EndLoad(kConn, start->load).ok());
  engine_->WaitForIdle();
  EXPECT_FALSE(above_->Find(key).has_value());

  // Held above and in the host tier: an arena load still reads the arena.
  EXPECT_EQ(LoadInPlace(key), BoardBlockState::kLoaded);
  ASSERT_TRUE(above_->Find(key).has_value());
  start = engine_->BeginLoad(kConn, kNs, {&key, 1});
  ASSERT_TRUE(start.ok());
  engine_->WaitForIdle();
  EXPECT_EQ(Board(*start).state(0), BoardBlockState::kLoaded);
  EXPECT_EQ(above_->holds(), 0);
  ASSERT_TRUE(engine_->EndLoad(kConn, start->load).ok());
}

TEST_F(EngineAboveTest, AnEvictionAboveDemotesIntoTheHostTierWhatNoOtherTierHolds) {
  for (uint64_t i = 1; i <= 3; ++i) Put(Key(i));
  EXPECT_EQ(LoadInPlace(Key(1)), BoardBlockState::kLoaded);
  EXPECT_EQ(LoadInPlace(Key(2)), BoardBlockState::kLoaded);
  // Key(1) now lives only above (the least recently used there).
  ASSERT_TRUE(engine_->host_tier().Erase(Key(1)).ok());
  ASSERT_FALSE(engine_->host_tier().Find(Key(1)).has_value());

  EXPECT_EQ(LoadInPlace(Key(3)), BoardBlockState::kLoaded);  // makes room: Key(1) goes
  EXPECT_FALSE(above_->Find(Key(1)).has_value());
  EXPECT_TRUE(above_->Find(Key(3)).has_value());
  EXPECT_EQ(Counter("engine.hbm_evictions"), 1);
  EXPECT_EQ(Counter("engine.hbm_demotions_to_host"), 1);
  EXPECT_TRUE(InHostExact(Key(1)));

  // Key(2) is in the host tier too: evicting it costs no write.
  EXPECT_EQ(LoadInPlace(Key(1)), BoardBlockState::kLoaded);
  EXPECT_FALSE(above_->Find(Key(2)).has_value());
  EXPECT_EQ(Counter("engine.hbm_evictions"), 2);
  EXPECT_EQ(Counter("engine.hbm_demotions_to_host"), 1);
}

TEST_F(EngineAboveTest, InPlaceUsesKeepABlockRecent) {
  for (uint64_t i = 1; i <= 3; ++i) Put(Key(i));
  EXPECT_EQ(LoadInPlace(Key(1)), BoardBlockState::kLoaded);
  EXPECT_EQ(LoadInPlace(Key(2)), BoardBlockState::kLoaded);
  EXPECT_EQ(LoadInPlace(Key(1)), BoardBlockState::kInDevice);  // Key(2) is now the older
  EXPECT_EQ(LoadInPlace(Key(3)), BoardBlockState::kLoaded);
  EXPECT_TRUE(above_->Find(Key(1)).has_value());
  EXPECT_FALSE(above_->Find(Key(2)).has_value());
}

TEST_F(EngineAboveTest, APinOfABlockHeldOnlyAboveReadsItBackIntoTheHostTier) {
  Put(Key(1));
  EXPECT_EQ(LoadInPlace(Key(1)), BoardBlockState::kLoaded);
  ASSERT_TRUE(engine_->host_tier().Erase(Key(1)).ok());
  EXPECT_EQ(::kvtier::testing::LookupTier(*engine_, kNs, Key(1)), Tier::kHbm);
  EXPECT_TRUE(PinExact(Key(1)));  // promoted from above
  EXPECT_TRUE(InHostExact(Key(1)));
  EXPECT_TRUE(above_->Find(Key(1)).has_value());

  // A layer-wise load into host memory streams it from above as well.
  ASSERT_TRUE(engine_->host_tier().Erase(Key(1)).ok());
  const BlockKey key = Key(1);
  auto start = engine_->BeginLoad(kConn, kNs, {&key, 1});
  ASSERT_TRUE(start.ok());
  engine_->WaitForIdle();
  LoadBoardReader board = Board(*start);
  ASSERT_EQ(board.state(0), BoardBlockState::kLoaded);
  EXPECT_TRUE(CheckBlockBytes(key, 0, SlotBytes(*host_, board.offset(0), kBlockBytes)));
  ASSERT_TRUE(engine_->EndLoad(kConn, start->load).ok());
}

TEST_F(EngineAboveTest, EraseReachesTheTierAboveAndAHeldRangeOutlivesIt) {
  Put(Key(1));
  EXPECT_EQ(LoadInPlace(Key(1)), BoardBlockState::kLoaded);
  const BlockKey key = Key(1);
  auto start = engine_->BeginLoad(kConn, kNs, {&key, 1}, {.in_place = true});
  ASSERT_TRUE(start.ok());
  const uint64_t offset = Board(*start).offset(0);
  ASSERT_EQ(Board(*start).state(0), BoardBlockState::kInDevice);

  EXPECT_EQ(engine_->Erase(kNs, {&key, 1}), 1u);
  EXPECT_FALSE(above_->Find(key).has_value());
  EXPECT_EQ(::kvtier::testing::LookupTier(*engine_, kNs, key), Tier::kNone);
  EXPECT_TRUE(CheckBlockBytes(key, 0, above_->InPlaceBytes(offset)));  // the load still reads it
  ASSERT_TRUE(engine_->EndLoad(kConn, start->load).ok());
  EXPECT_TRUE(above_->InPlaceBytes(offset).empty());
  EXPECT_EQ(above_->used_bytes(), 0u);
}

TEST_F(EngineAboveTest, ABlockErasedWhileItsCopyUpIsQueuedDoesNotComeBack) {
  Put(Key(1));
  const BlockKey key = Key(1);
  auto start = engine_->BeginLoad(kConn, kNs, {&key, 1}, {.in_place = true});
  ASSERT_TRUE(start.ok());
  // The offer may be queued or done by now; either way, after the Erase
  // the block is nowhere.
  EXPECT_EQ(engine_->Erase(kNs, {&key, 1}), 1u);
  ASSERT_TRUE(engine_->EndLoad(kConn, start->load).ok());
  engine_->WaitForIdle();
  EXPECT_FALSE(above_->Find(key).has_value());
  EXPECT_EQ(::kvtier::testing::LookupTier(*engine_, kNs, key), Tier::kNone);
}

TEST_F(EngineAboveTest, ABlockLargerThanTheTierAboveStaysBelowIt) {
  Open(kBlockBytes / 2);
  Put(Key(1));
  EXPECT_EQ(LoadInPlace(Key(1)), BoardBlockState::kLoaded);
  EXPECT_FALSE(above_->Find(Key(1)).has_value());
  EXPECT_EQ(Counter("engine.hbm_copy_up_skips"), 1);
  EXPECT_EQ(Counter("engine.hbm_copies_up"), 0);
}

}  // namespace
}  // namespace kvtier

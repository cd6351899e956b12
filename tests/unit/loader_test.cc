// Tests of the Loader, which runs layer-wise loads, driven without an
// Engine: a real arena for the boards (read back as a client reads them,
// LoadBoardReader), and a scripted claim hook in place of the engine's
// pins: per key it settles a host hit or a miss at once, leaves the key
// waiting (as a block being promoted or demoted), or claims it for
// promotion from a tier below; the test resolves the waiting keys later as
// a promotion's end would (Resolve). The other hooks record what the
// Loader asked of the engine.
#include "daemon/engine/loader.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/load_board.h"
#include "daemon/engine/block_index.h"
#include "tests/testing/test_daemon.h"

namespace kvtier {
namespace {

constexpr uint32_t kLayers = 4;
constexpr uint64_t kLayerBytes = 4 << 10;
constexpr uint64_t kBlockBytes = kLayers * kLayerBytes;
constexpr NamespaceFingerprint kNs{0x10ad, 0xe2};
constexpr NamespaceFingerprint kNoLayout{0x10ad, 0x0};
constexpr ConnectionId kConn = 3;
constexpr size_t kBelowLevel = 1;

BlockKey Key(uint64_t i) { return BlockKey{0x10ad, i}; }

// What the scripted claim does with a key.
enum class Claim { kHit, kHitWrongSize, kMiss, kWait, kBelow, kBelowOtherSize };

std::vector<uint64_t> LayerSums(uint64_t i) {
  std::vector<uint64_t> sums;
  for (uint32_t l = 0; l < kLayers; ++l) sums.push_back(0x5000 + i * 16 + l);
  return sums;
}

class LoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    host_ = ::kvtier::testing::OpenTestHostTier(1 << 20);
    ASSERT_NE(host_, nullptr);
    loader_ = std::make_unique<Loader>(*host_, counters_, MakeHooks());
  }

  Loader::Hooks MakeHooks() {
    Loader::Hooks hooks;
    hooks.allocate = [this](uint64_t bytes) { return host_->Allocate(bytes); };
    hooks.layout = [](const NamespaceFingerprint& ns) -> std::optional<NamespaceLayout> {
      if (ns == kNs) return NamespaceLayout{kLayers, kBlockBytes};
      return std::nullopt;
    };
    hooks.claim = [this](const std::shared_ptr<PinBatch>& batch, const NamespaceFingerprint& ns,
                         std::span<const BlockKey> keys) { return ClaimScripted(batch, keys); };
    hooks.reported = [](size_t level) { return level == kBelowLevel ? Tier::kNvme : Tier::kNone; };
    hooks.promote = [this](const BlockKey& key, const Located&) { promoted_.push_back(key); };
    hooks.stream = [this](const std::shared_ptr<LoadRecord>&, std::span<const PinClaim> claims) {
      for (const PinClaim& c : claims) streamed_.emplace_back(c.index, c.key);
    };
    hooks.release = [this](ConnectionId connection, std::span<const LeaseId> leases) {
      EXPECT_EQ(connection, kConn);
      released_.insert(released_.end(), leases.begin(), leases.end());
    };
    hooks.pinned = [this] { ++pinned_calls_; };
    hooks.late = [this](const NamespaceFingerprint&, std::span<const BlockKey> keys, double budget_us) {
      late_asked_.emplace_back(keys.begin(), keys.end());
      late_budget_us_ = budget_us;
      std::vector<bool> late;
      for (const BlockKey& key : keys) late.push_back(late_.count(key.lo) != 0);
      return late;
    };
    if (with_above_) {
      hooks.hold_above = [this](const NamespaceFingerprint&, const BlockKey& key, uint32_t layer_count,
                                uint64_t payload_bytes) -> std::optional<BlockTier::InPlace> {
        EXPECT_EQ(layer_count, kLayers);
        EXPECT_EQ(payload_bytes, kBlockBytes);
        auto it = above_.find(key);
        if (it == above_.end()) return std::nullopt;
        return BlockTier::InPlace{it->second, {}};
      };
      hooks.release_above = [this](const BlockKey& key, uint64_t offset) { released_above_.emplace_back(key, offset); };
      hooks.offer_above = [this](const NamespaceFingerprint&, const BlockKey& key) { offered_.push_back(key); };
    }
    return hooks;
  }

  // A pin of block `i`: its lease is 100 + i, its offset (1 + i) blocks in.
  static PinGrant Grant(uint64_t i, uint64_t length, bool with_layers) {
    PinGrant grant{Status::Ok(), (1 + i) * kBlockBytes, length, 100 + i, 0xc0de + i, 0, 0, {}};
    if (with_layers) grant.layer_checksums = LayerSums(i);
    return grant;
  }

  // As Engine::ClaimPins does for a load, from script_ (keys by their
  // number); what waits is kept in waiting_ for the test to resolve.
  PinClaims ClaimScripted(const std::shared_ptr<PinBatch>& batch, std::span<const BlockKey> keys) {
    with_layers_seen_ = batch->with_layers;
    claimed_.insert(claimed_.end(), keys.begin(), keys.end());
    batch->grants.resize(keys.size());
    batch->waiting.assign(keys.size(), false);
    PinClaims claims;
    for (size_t i = 0; i < keys.size(); ++i) {
      const uint64_t n = keys[i].lo;
      auto wait = [&] {
        batch->outstanding.fetch_add(1);
        batch->waiting[i] = true;
        waiting_[n] = {batch, i};
      };
      switch (script_.at(n)) {
        case Claim::kHit:
          batch->grants[i] = Grant(n, kBlockBytes, batch->with_layers && sums_at_hit_);
          break;
        case Claim::kHitWrongSize:
          batch->grants[i] = Grant(n, kBlockBytes / 2, false);
          break;
        case Claim::kMiss:
          batch->grants[i].status = NotFound("scripted: not cached");
          break;
        case Claim::kWait:
          wait();
          break;
        case Claim::kBelow:
        case Claim::kBelowOtherSize: {
          wait();
          const bool of_layout = script_.at(n) == Claim::kBelow;
          BlockTier::BlockInfo info;
          info.ns = kNs;
          info.layer_count = of_layout ? kLayers : 1;
          info.payload_bytes = of_layout ? kBlockBytes : kBlockBytes / 2;
          claims.promote.push_back(PinClaim{i, keys[i], Located{kBelowLevel, info}});
          break;
        }
      }
    }
    return claims;
  }

  // Resolves waiting key `n` with `grant`, as the end of its promotion does.
  void Land(uint64_t n, PinGrant grant) {
    auto [batch, index] = waiting_.at(n);
    waiting_.erase(n);
    Resolve(batch, index, std::move(grant));
  }

  Result<Loader::LoadStart> Begin(std::vector<Claim> script, bool verify = false, bool in_place = false,
                                  uint64_t deadline_us = 0) {
    std::vector<BlockKey> keys;
    for (size_t i = 0; i < script.size(); ++i) {
      script_[i] = script[i];
      keys.push_back(Key(i));
    }
    return loader_->Begin(kConn, kNs, keys, LoadFlags{in_place, verify, deadline_us});
  }

  LoadBoardReader Board(const Loader::LoadStart& start, bool verify = false) const {
    const HostTier::Extent extent{start.board_offset, start.board_bytes};
    return LoadBoardReader(host_->Bytes(extent).data(), static_cast<uint32_t>(start.blocks.size()),
                           verify ? kLayers : 0);
  }

  std::unique_ptr<HostTier> host_;
  EngineCounters counters_;
  bool with_above_ = false;
  bool sums_at_hit_ = true;
  std::map<BlockKey, uint64_t> above_;  // blocks held above, at their offsets there
  std::unique_ptr<Loader> loader_;
  std::map<uint64_t, Claim> script_;
  std::map<uint64_t, std::pair<std::shared_ptr<PinBatch>, size_t>> waiting_;
  bool with_layers_seen_ = false;
  std::vector<BlockKey> promoted_;
  std::vector<std::pair<size_t, BlockKey>> streamed_;
  std::vector<LeaseId> released_;
  std::vector<std::pair<BlockKey, uint64_t>> released_above_;
  std::vector<BlockKey> offered_;
  int pinned_calls_ = 0;
  std::set<uint64_t> late_;  // keys (by number) the scripted estimate says cannot arrive in time
  std::vector<std::vector<BlockKey>> late_asked_;
  double late_budget_us_ = 0;
  std::vector<BlockKey> claimed_;
};

TEST_F(LoaderTest, BlocksThatCannotArriveByTheDeadlineFailAtOnceAndAreNotRead) {
  late_ = {2, 3};
  Result<Loader::LoadStart> start =
      Begin({Claim::kHit, Claim::kBelow, Claim::kBelow, Claim::kBelow, Claim::kHit}, false, false, 250000);
  ASSERT_TRUE(start.ok()) << start.status().ToString();
  // Asked about every block not held above, with the deadline as the budget.
  ASSERT_EQ(late_asked_.size(), 1u);
  EXPECT_EQ(late_asked_[0].size(), 5u);
  EXPECT_EQ(late_budget_us_, 250000.0);
  EXPECT_TRUE(start->blocks[1].ok());
  for (size_t i : {2, 3}) {
    EXPECT_EQ(start->blocks[i].code(), StatusCode::kTimedOut) << i;
    EXPECT_NE(start->blocks[i].message().find("deadline"), std::string::npos) << start->blocks[i].message();
  }
  // Neither pinned nor claimed nor read: only block 1 streams.
  EXPECT_EQ(claimed_, (std::vector<BlockKey>{Key(0), Key(1), Key(4)}));
  EXPECT_EQ(streamed_, (std::vector<std::pair<size_t, BlockKey>>{{1, Key(1)}}));
  const LoadBoardReader board = Board(*start);
  for (uint32_t i : {2u, 3u}) {
    EXPECT_EQ(board.state(i), BoardBlockState::kFailed);
    EXPECT_EQ(board.code(i), StatusCode::kTimedOut);
  }
  EXPECT_EQ(board.layers_ready(), 0u);  // block 1 is on its way
  Land(1, Grant(1, kBlockBytes, false));
  EXPECT_EQ(board.layers_ready(), kLayers);  // the late ones hold nothing back
  EXPECT_EQ(board.resolved(), 5u);
  EXPECT_EQ(counters_.load_late_blocks.load(), 2);
  EXPECT_EQ(counters_.load_failed_blocks.load(), 2);
  ASSERT_TRUE(loader_->End(kConn, start->load).ok());
  EXPECT_EQ(released_, (std::vector<LeaseId>{100, 101, 104}));
}

TEST_F(LoaderTest, WithoutADeadlineNothingIsAskedAndEveryBlockIsRead) {
  late_ = {1};
  Result<Loader::LoadStart> start = Begin({Claim::kBelow, Claim::kBelow});
  ASSERT_TRUE(start.ok()) << start.status().ToString();
  EXPECT_TRUE(late_asked_.empty());
  EXPECT_EQ(streamed_.size(), 2u);
  EXPECT_EQ(counters_.load_late_blocks.load(), 0);
}

TEST_F(LoaderTest, HostHitsAreSettledAtOnceAndTheBoardSaysInPlace) {
  Result<Loader::LoadStart> start = Begin({Claim::kHit, Claim::kHit, Claim::kHit});
  ASSERT_TRUE(start.ok()) << start.status().ToString();
  EXPECT_EQ(start->layers, kLayers);
  EXPECT_EQ(start->layer_bytes, kLayerBytes);
  EXPECT_EQ(start->source, Tier::kHost);
  EXPECT_EQ(start->below_bytes_per_layer, 0u);
  EXPECT_EQ(start->board_bytes, LoadBoardBytes(3));
  for (const Status& s : start->blocks) EXPECT_TRUE(s.ok()) << s.ToString();
  const LoadBoardReader board = Board(*start);
  EXPECT_EQ(board.layers_ready(), kLayers);
  EXPECT_EQ(board.resolved(), 3u);
  for (uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(board.state(i), BoardBlockState::kLoaded);
    EXPECT_EQ(board.offset(i), (1 + i) * kBlockBytes);
  }
  EXPECT_TRUE(streamed_.empty());
  EXPECT_TRUE(released_.empty());  // the pins are the load's until it ends
  EXPECT_EQ(pinned_calls_, 1);
  EXPECT_EQ(counters_.loads.load(), 1);
  EXPECT_EQ(counters_.load_blocks.load(), 3);
  EXPECT_EQ(loader_->OpenCount(), 1);

  ASSERT_TRUE(loader_->End(kConn, start->load).ok());
  EXPECT_EQ(released_, (std::vector<LeaseId>{100, 101, 102}));
  EXPECT_EQ(loader_->OpenCount(), 0);
  EXPECT_EQ(loader_->End(kConn, start->load).code(), StatusCode::kNotFound);
}

TEST_F(LoaderTest, ABlockThatResolvesLaterUpdatesTheBoard) {
  Result<Loader::LoadStart> start = Begin({Claim::kHit, Claim::kBelow, Claim::kWait});
  ASSERT_TRUE(start.ok()) << start.status().ToString();
  EXPECT_EQ(start->source, Tier::kNvme);
  EXPECT_EQ(start->below_bytes_per_layer, kLayerBytes);
  ASSERT_EQ(streamed_.size(), 1u);  // of the layout: streamed layer by layer
  EXPECT_EQ(streamed_[0], std::make_pair(size_t{1}, Key(1)));
  EXPECT_TRUE(promoted_.empty());
  for (const Status& s : start->blocks) EXPECT_TRUE(s.ok()) << s.ToString();

  const LoadBoardReader board = Board(*start);
  EXPECT_EQ(board.layers_ready(), 0u);
  EXPECT_EQ(board.state(0), BoardBlockState::kLoaded);
  EXPECT_EQ(board.state(1), BoardBlockState::kLoading);
  EXPECT_EQ(board.state(2), BoardBlockState::kLoading);

  Land(1, Grant(1, kBlockBytes, false));
  EXPECT_EQ(board.state(1), BoardBlockState::kLoaded);
  EXPECT_EQ(board.offset(1), 2 * kBlockBytes);
  EXPECT_EQ(board.layers_ready(), 0u);  // block 2 has none of its layers yet
  Land(2, Grant(2, kBlockBytes, false));
  EXPECT_EQ(board.state(2), BoardBlockState::kLoaded);
  EXPECT_EQ(board.layers_ready(), kLayers);
  EXPECT_EQ(board.resolved(), 3u);
  EXPECT_EQ(counters_.load_failed_blocks.load(), 0);

  ASSERT_TRUE(loader_->End(kConn, start->load).ok());
  EXPECT_EQ(released_, (std::vector<LeaseId>{100, 101, 102}));
}

TEST_F(LoaderTest, AFailedBlockFailsAlone) {
  Result<Loader::LoadStart> start =
      Begin({Claim::kHit, Claim::kMiss, Claim::kWait, Claim::kHitWrongSize, Claim::kBelowOtherSize, Claim::kWait});
  ASSERT_TRUE(start.ok()) << start.status().ToString();
  EXPECT_TRUE(start->blocks[0].ok());
  EXPECT_EQ(start->blocks[1].code(), StatusCode::kNotFound);
  EXPECT_EQ(start->blocks[3].code(), StatusCode::kInvalidArgument);  // not a whole block of the layout
  EXPECT_EQ(released_, (std::vector<LeaseId>{103}));                 // so its pin goes at once
  // Found below but not of the layout: promoted whole, not streamed.
  EXPECT_EQ(promoted_, (std::vector<BlockKey>{Key(4)}));
  EXPECT_TRUE(streamed_.empty());

  const LoadBoardReader board = Board(*start);
  EXPECT_EQ(board.state(1), BoardBlockState::kFailed);
  EXPECT_EQ(board.code(1), StatusCode::kNotFound);
  EXPECT_EQ(board.state(3), BoardBlockState::kFailed);
  EXPECT_EQ(board.code(3), StatusCode::kInvalidArgument);

  PinGrant failed;
  failed.status = NotFound("scripted: the read failed");
  Land(2, failed);
  Land(4, Grant(4, kBlockBytes / 2, false));  // the whole promotion of another size: pinned, refused
  EXPECT_EQ(board.state(2), BoardBlockState::kFailed);
  EXPECT_EQ(board.code(2), StatusCode::kNotFound);
  EXPECT_EQ(board.state(4), BoardBlockState::kFailed);
  EXPECT_EQ(board.code(4), StatusCode::kInvalidArgument);
  EXPECT_EQ(released_, (std::vector<LeaseId>{103, 104}));
  EXPECT_EQ(board.layers_ready(), 0u);  // block 5 still loading
  Land(5, Grant(5, kBlockBytes, false));
  EXPECT_EQ(board.state(5), BoardBlockState::kLoaded);
  EXPECT_EQ(board.state(0), BoardBlockState::kLoaded);
  EXPECT_EQ(board.layers_ready(), kLayers);  // failed blocks do not hold the others back
  EXPECT_EQ(counters_.load_failed_blocks.load(), 4);
}

TEST_F(LoaderTest, EndFreesTheBoardOnlyOnceNoReadIsInFlight) {
  const uint64_t used_before = host_->used_bytes();
  Result<Loader::LoadStart> start = Begin({Claim::kHit, Claim::kWait});
  ASSERT_TRUE(start.ok()) << start.status().ToString();
  EXPECT_GT(host_->used_bytes(), used_before);  // the board

  ASSERT_TRUE(loader_->End(kConn, start->load).ok());
  EXPECT_EQ(released_, (std::vector<LeaseId>{100}));
  EXPECT_GT(host_->used_bytes(), used_before);  // block 1's read may still write the board
  EXPECT_EQ(loader_->OpenCount(), 0);

  // Its pin lands after the end: released at once, and the board goes.
  Land(1, Grant(1, kBlockBytes, false));
  EXPECT_EQ(released_, (std::vector<LeaseId>{100, 101}));
  EXPECT_EQ(host_->used_bytes(), used_before);
}

TEST_F(LoaderTest, AConnectionHoldsAtMostMaxLoads) {
  std::vector<uint64_t> ids;
  for (size_t i = 0; i < Loader::kMaxLoadsPerConnection; ++i) {
    Result<Loader::LoadStart> start = Begin({Claim::kHit});
    ASSERT_TRUE(start.ok()) << start.status().ToString();
    ids.push_back(start->load);
  }
  EXPECT_EQ(Begin({Claim::kHit}).status().code(), StatusCode::kBusy);
  EXPECT_EQ(loader_->OpenCount(), static_cast<int64_t>(Loader::kMaxLoadsPerConnection));
  EXPECT_TRUE(loader_->Begin(kConn + 1, kNs, std::vector<BlockKey>{Key(0)}, LoadFlags{}).ok());  // another connection

  ASSERT_TRUE(loader_->End(kConn, ids.back()).ok());
  EXPECT_TRUE(Begin({Claim::kHit}).ok());
  loader_->EndAll(kConn);
  EXPECT_EQ(loader_->OpenCount(), 1);  // the other connection's
  EXPECT_EQ(loader_->End(kConn, ids.front()).code(), StatusCode::kNotFound);
  EXPECT_EQ(released_.size(), Loader::kMaxLoadsPerConnection + 1);  // every pin of kConn's loads
}

TEST_F(LoaderTest, BadLoadsAreRefusedAndOpenNothing) {
  const uint64_t used_before = host_->used_bytes();
  script_[0] = Claim::kHit;
  EXPECT_EQ(loader_->Begin(kConn, kNoLayout, std::vector<BlockKey>{Key(0)}, LoadFlags{}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(loader_->Begin(kConn, kNs, {}, LoadFlags{}).status().code(), StatusCode::kInvalidArgument);
  std::vector<BlockKey> too_many(Loader::kMaxLoadBlocks + 1, Key(0));
  EXPECT_EQ(loader_->Begin(kConn, kNs, too_many, LoadFlags{}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(loader_->OpenCount(), 0);
  EXPECT_EQ(host_->used_bytes(), used_before);
  EXPECT_EQ(counters_.loads.load(), 0);
}

TEST_F(LoaderTest, NoRoomForTheBoardIsNoSpaceAndFreesTheSlot) {
  Loader::Hooks hooks = MakeHooks();
  hooks.allocate = [](uint64_t) -> Result<HostTier::Extent> { return NoSpace("scripted: the arena is full"); };
  Loader full(*host_, counters_, hooks);
  script_[0] = Claim::kHit;
  EXPECT_EQ(full.Begin(kConn, kNs, std::vector<BlockKey>{Key(0)}, LoadFlags{}).status().code(), StatusCode::kNoSpace);
  EXPECT_EQ(full.OpenCount(), 0);
}

TEST_F(LoaderTest, VerifyPutsLayerChecksumsInTheAnswerAndOnTheBoard) {
  Result<Loader::LoadStart> start = Begin({Claim::kHit, Claim::kBelow, Claim::kWait}, /*verify=*/true);
  ASSERT_TRUE(start.ok()) << start.status().ToString();
  EXPECT_TRUE(with_layers_seen_);  // the pins ask for every layer's checksum
  EXPECT_EQ(start->board_bytes, LoadBoardBytes(3, kLayers));
  ASSERT_EQ(start->layer_checksums.size(), 3u);
  EXPECT_TRUE(start->layer_checksums[0].settled);
  EXPECT_EQ(start->layer_checksums[0].block, 0xc0deu);
  EXPECT_EQ(start->layer_checksums[0].layers, LayerSums(0));
  EXPECT_FALSE(start->layer_checksums[1].settled);  // on the board when it lands
  EXPECT_FALSE(start->layer_checksums[2].settled);

  const LoadBoardReader board = Board(*start, /*verify=*/true);
  for (uint32_t l = 0; l < kLayers; ++l) EXPECT_EQ(board.layer_checksum(0, l), LayerSums(0)[l]);
  Land(1, Grant(1, kBlockBytes, /*with_layers=*/true));
  EXPECT_EQ(board.state(1), BoardBlockState::kLoaded);
  for (uint32_t l = 0; l < kLayers; ++l) EXPECT_EQ(board.layer_checksum(1, l), LayerSums(1)[l]);
  // A block that lands later without them cannot be checked layer by layer.
  Land(2, Grant(2, kBlockBytes, /*with_layers=*/false));
  EXPECT_EQ(board.state(2), BoardBlockState::kFailed);
  EXPECT_EQ(board.code(2), StatusCode::kUnimplemented);
  EXPECT_EQ(released_, (std::vector<LeaseId>{102}));
  EXPECT_EQ(board.layers_ready(), kLayers);
}

TEST_F(LoaderTest, AHostHitWithoutLayerChecksumsIsCheckedWhole) {
  sums_at_hit_ = false;  // its writer sent none
  Result<Loader::LoadStart> start = Begin({Claim::kHit}, /*verify=*/true);
  ASSERT_TRUE(start.ok()) << start.status().ToString();
  EXPECT_TRUE(start->blocks[0].ok());
  EXPECT_TRUE(start->layer_checksums[0].settled);
  EXPECT_EQ(start->layer_checksums[0].block, 0xc0deu);
  EXPECT_TRUE(start->layer_checksums[0].layers.empty());
  EXPECT_EQ(Board(*start, true).state(0), BoardBlockState::kLoaded);
}

TEST_F(LoaderTest, InPlaceBlocksAreHeldAboveAndTheOthersOfferedOnceLoaded) {
  with_above_ = true;
  loader_ = std::make_unique<Loader>(*host_, counters_, MakeHooks());
  above_[Key(1)] = 0xabc000;
  Result<Loader::LoadStart> start = Begin({Claim::kHit, Claim::kWait, Claim::kWait}, false, /*in_place=*/true);
  ASSERT_TRUE(start.ok()) << start.status().ToString();
  const LoadBoardReader board = Board(*start);
  EXPECT_EQ(board.state(1), BoardBlockState::kInDevice);
  EXPECT_EQ(board.offset(1), 0xabc000u);
  EXPECT_EQ(waiting_.count(1), 0u);  // held above: never claimed
  EXPECT_EQ(offered_, (std::vector<BlockKey>{Key(0)}));
  Land(2, Grant(2, kBlockBytes, false));
  EXPECT_EQ(offered_, (std::vector<BlockKey>{Key(0), Key(2)}));
  EXPECT_EQ(board.layers_ready(), kLayers);

  ASSERT_TRUE(loader_->End(kConn, start->load).ok());
  EXPECT_EQ(released_above_, (std::vector<std::pair<BlockKey, uint64_t>>{{Key(1), 0xabc000}}));
  EXPECT_EQ(released_, (std::vector<LeaseId>{100, 102}));
}

TEST_F(LoaderTest, WithoutATierAboveNoLoadIsInPlace) {
  Result<Loader::LoadStart> start = Begin({Claim::kHit}, false, /*in_place=*/true);
  ASSERT_TRUE(start.ok()) << start.status().ToString();
  EXPECT_EQ(Board(*start).state(0), BoardBlockState::kLoaded);
  EXPECT_TRUE(offered_.empty());
}

}  // namespace
}  // namespace kvtier

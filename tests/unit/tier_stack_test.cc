// The tier stack (tiers/tier.h, Engine over LowerTiers): a three-tier
// stack, host -> NVMe (memory device) -> a tier defined only in the tests
// (tests/testing/map_tier.h), and the same with a fourth level above the
// host (another map tier, in the HBM tier's place).
// Blocks demote down to the third tier and come back up byte-exact, with
// no production code written for that tier; each tier's admission decides
// where an evicted block goes; a block loaded into GPU memory goes up to
// the level above and back down from it.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "common/checksum.h"
#include "common/load_board.h"
#include "common/worker_pool.h"
#include "daemon/engine/engine.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/map_tier.h"
#include "tests/testing/memory_device.h"
#include "tests/testing/memory_nvme.h"
#include "tests/testing/test_daemon.h"
#include "tiers/tier.h"

namespace kvtier {
namespace {

using ::kvtier::testing::CheckBlockBytes;
using ::kvtier::testing::FakeClock;
using ::kvtier::testing::MapTier;
using ::kvtier::testing::MemoryDevice;
using ::kvtier::testing::SlotBytes;

constexpr uint64_t kBlockBytes = 64 << 10;  // 4 layers of 16 KiB
constexpr uint32_t kLayers = 4;
constexpr NamespaceFingerprint kNs{0x5eed, 0x7143};

BlockKey Key(uint64_t i) { return BlockKey{0x3713, i}; }

class TierStackTest : public ::testing::Test {
 protected:
  // host: 8 blocks; NVMe: 4 regions of 1 MiB (about 60 records, fewer
  // once reclaim keeps a region ahead); below it the map tier.
  // With `above`, a map tier of 4 blocks stacked above the host.
  void Build(AdmissionPolicyId nvme_admission, bool above = false) {
    dir_ = ::kvtier::testing::MakeTempDir();
    memory_ = std::make_unique<MemoryDevice>(4 << 20);
    host_ = ::kvtier::testing::OpenTestHostTier(8 * kBlockBytes);
    ASSERT_NE(host_, nullptr);
    NvmeTierOptions nvme_options = ::kvtier::testing::SmallNvmeOptions();
    nvme_options.reinsert_share = 0;  // every block of a reclaimed region leaves it
    auto nvme = ::kvtier::testing::OpenMemoryNvmeTier(*memory_, dir_, clock_, nvme_options);
    ASSERT_TRUE(nvme.ok()) << nvme.status().ToString();
    nvme_ = std::move(*nvme);
    std::vector<LowerTier> stack{LowerTier{nvme_.get(), nvme_admission, {}, 0, Tier::kNvme},
                                 LowerTier{&map_, AdmissionPolicyId::kAll, {}, 0, Tier::kRemote}};
    if (above) above_ = std::make_unique<MapTier>(4 * kBlockBytes, "hbm");
    auto engine =
        Engine::Create(EngineOptions{4, EvictionPolicyId::kLru}, *host_, clock_, std::move(stack), above_.get());
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    engine_ = std::move(*engine);
    engine_->RegisterNamespace(kNs, NamespaceLayout{kLayers, kBlockBytes});
  }
  void TearDown() override {
    engine_.reset();
    nvme_.reset();
    if (!dir_.empty()) ::kvtier::testing::RemoveTree(dir_);
  }

  // Puts block i, then lets every move it caused finish (the NVMe tier's
  // eviction scan, the demotions it hands down), so the test is
  // deterministic.
  void PutAndSettle(uint64_t i) {
    clock_.AdvanceUs(1);
    ASSERT_TRUE(::kvtier::testing::PutFilledBlock(*engine_, *host_, 1, kNs, Key(i), kBlockBytes).ok()) << i;
    Settle();
  }
  void Settle() {
    for (int round = 0; round < 2; ++round) {
      engine_->WaitForIdle();
      nvme_->WaitForIdle();
    }
  }

  // Pins block i and checks its bytes; releases it.
  void ExpectByteExact(uint64_t i) {
    const BlockKey key = Key(i);
    auto grants = engine_->Pin(1, kNs, std::span(&key, 1));
    ASSERT_TRUE(grants[0].status.ok()) << i << ": " << grants[0].status.ToString();
    EXPECT_TRUE(CheckBlockBytes(key, 0, SlotBytes(*host_, grants[0].offset, grants[0].length))) << i;
    EXPECT_EQ(grants[0].checksum, BlockChecksum(SlotBytes(*host_, grants[0].offset, grants[0].length)));
    engine_->Release(1, std::span(&grants[0].lease, 1));
  }

  std::map<std::string, int64_t> Counters() { return ::kvtier::testing::EngineCounters(*engine_); }

  // A load of block i into GPU memory (in place), ended once settled: the
  // state the board gave it.
  BoardBlockState LoadInPlace(uint64_t i) {
    const BlockKey key = Key(i);
    auto start = engine_->BeginLoad(1, kNs, {&key, 1}, {.in_place = true});
    EXPECT_TRUE(start.ok()) << start.status().ToString();
    if (!start.ok()) return BoardBlockState::kFailed;
    Settle();
    const BoardBlockState state =
        LoadBoardReader(SlotBytes(*host_, start->board_offset, start->board_bytes).data(), 1).state(0);
    EXPECT_TRUE(engine_->EndLoad(1, start->load).ok());
    Settle();
    return state;
  }
  Tier TierOf(uint64_t i) { return ::kvtier::testing::LookupTier(*engine_, kNs, Key(i)); }

  std::string dir_;
  FakeClock clock_;
  std::unique_ptr<MemoryDevice> memory_;
  std::unique_ptr<HostTier> host_;
  std::unique_ptr<NvmeTier> nvme_;
  MapTier map_;
  std::unique_ptr<MapTier> above_;  // declared before engine_: outlives it
  std::unique_ptr<Engine> engine_;
};

TEST_F(TierStackTest, BlocksDemoteToTheThirdTierAndComeBackByteExact) {
  Build(AdmissionPolicyId::kAll);
  constexpr uint64_t kBlocks = 160;  // more than host and NVMe hold together
  for (uint64_t i = 0; i < kBlocks; ++i) PutAndSettle(i);

  std::vector<BlockKey> keys;
  for (uint64_t i = 0; i < kBlocks; ++i) keys.push_back(Key(i));
  const LookupOutcome found = engine_->Lookup(kNs, keys);
  ASSERT_EQ(found.prefix_blocks, kBlocks) << "every block is in some tier";
  std::map<Tier, int> per_tier;
  for (Tier t : found.tiers) ++per_tier[t];
  EXPECT_GT(per_tier[Tier::kHost], 0);
  EXPECT_GT(per_tier[Tier::kNvme], 0);
  EXPECT_GT(per_tier[Tier::kRemote], 0) << "the third level reports as its registration says";
  // The oldest blocks left the NVMe tier: only the third tier has them.
  EXPECT_EQ(found.tiers[0], Tier::kRemote);
  EXPECT_FALSE(nvme_->Find(Key(0)).has_value());
  EXPECT_TRUE(map_.Find(Key(0)).has_value());

  auto c = Counters();
  EXPECT_EQ(c["engine.maptier_demotions_in"], int64_t(map_.blocks()));
  EXPECT_GT(c["nvme.evictions_offered"], 0);
  EXPECT_EQ(c["nvme.eviction_read_failures"], 0);
  EXPECT_EQ(c["engine.nvme_evictions_dropped"], 0);

  // Back up: a pin of a block only the third tier holds promotes it into
  // the host tier, byte-exact, and the lookup says so.
  for (uint64_t i = 0; i < 4; ++i) {
    ASSERT_EQ(found.tiers[i], Tier::kRemote) << i;
    ExpectByteExact(i);
    EXPECT_EQ(engine_->Lookup(kNs, std::span(&keys[i], 1)).tiers[0], Tier::kHost) << i;
  }
  EXPECT_GE(Counters()["maptier.reads"], 4);
  // And every block reads back byte-exact from wherever it is.
  for (uint64_t i = 0; i < kBlocks; ++i) ExpectByteExact(i);
  // That sweep ran without settling: the NVMe tier read each region out
  // before reclaiming it, so nothing was lost on the way down.
  EXPECT_EQ(Counters()["nvme.evictions_missed"], 0);
}

TEST_F(TierStackTest, LayerReadsComeFromTheThirdTier) {
  Build(AdmissionPolicyId::kAll);
  for (uint64_t i = 0; i < 160; ++i) PutAndSettle(i);
  const BlockKey key = Key(1);
  ASSERT_TRUE(map_.Find(key).has_value());
  auto grants = engine_->Pin(1, kNs, std::span(&key, 1), LayerSpan{1, 3});
  ASSERT_TRUE(grants[0].status.ok()) << grants[0].status.ToString();
  ASSERT_EQ(grants[0].length, 2 * kBlockBytes / kLayers);
  const std::vector<std::byte> whole = ::kvtier::testing::Block(key, kBlockBytes);
  auto got = SlotBytes(*host_, grants[0].offset, grants[0].length);
  EXPECT_EQ(std::memcmp(got.data(), whole.data() + kBlockBytes / kLayers, got.size()), 0);
  engine_->Release(1, std::span(&grants[0].lease, 1));
}

TEST_F(TierStackTest, ABlockTheNvmeAdmissionRefusesGoesToTheTierBelowIt) {
  // second_hit refuses first sightings: the map tier (admitting all) takes
  // them straight from the host tier.
  Build(AdmissionPolicyId::kSecondHit);
  for (uint64_t i = 0; i < 20; ++i) PutAndSettle(i);
  std::vector<BlockKey> keys;
  for (uint64_t i = 0; i < 20; ++i) keys.push_back(Key(i));
  const LookupOutcome found = engine_->Lookup(kNs, keys);
  ASSERT_EQ(found.prefix_blocks, 20u);
  EXPECT_EQ(found.tiers[0], Tier::kRemote);
  EXPECT_FALSE(nvme_->Find(Key(0)).has_value());
  EXPECT_EQ(Counters()["engine.admission_drops"], 0) << "a lower tier took every refused block";
  ExpectByteExact(0);
}

TEST_F(TierStackTest, EraseReachesEveryTier) {
  Build(AdmissionPolicyId::kAll);
  for (uint64_t i = 0; i < 160; ++i) PutAndSettle(i);
  std::vector<BlockKey> keys{Key(0), Key(100), Key(159)};  // map tier, NVMe, host
  EXPECT_EQ(engine_->Erase(kNs, keys), 3u);
  for (const BlockKey& key : keys) {
    EXPECT_EQ(engine_->Lookup(kNs, std::span(&key, 1)).prefix_blocks, 0u);
    EXPECT_FALSE(map_.Find(key).has_value());
    EXPECT_FALSE(nvme_->Find(key).has_value());
  }
}

// Four levels: a tier above the host (the HBM tier's place) is a level of
// the same stack. A load into GPU memory of a block from any level below
// takes it up there; Lookup names each level; a pin reads from wherever
// the block is, byte-exact; what the level above evicts goes back down
// (to the host tier, unless a level below holds it); Erase reaches it.
TEST_F(TierStackTest, ALevelAboveTheHostIsOneMoreLevelOfTheSameStack) {
  Build(AdmissionPolicyId::kAll, /*above=*/true);
  constexpr uint64_t kBlocks = 160;
  for (uint64_t i = 0; i < kBlocks; ++i) PutAndSettle(i);
  ASSERT_EQ(TierOf(0), Tier::kRemote);
  ASSERT_EQ(TierOf(1), Tier::kRemote);
  const uint64_t in_nvme = 120;
  ASSERT_EQ(TierOf(in_nvme), Tier::kNvme);
  ASSERT_EQ(TierOf(kBlocks - 1), Tier::kHost);

  // Up from each level below: the third, NVMe and the host tier.
  for (uint64_t i : {uint64_t{0}, in_nvme, kBlocks - 1}) {
    EXPECT_EQ(LoadInPlace(i), BoardBlockState::kLoaded) << i;
    EXPECT_TRUE(above_->Find(Key(i)).has_value()) << i;
    EXPECT_EQ(TierOf(i), Tier::kHbm) << i;
  }
  EXPECT_EQ(Counters()["engine.hbm_copies_up"], 3);
  // Held there, the next load into GPU memory gets it in place.
  EXPECT_EQ(LoadInPlace(in_nvme), BoardBlockState::kInDevice);

  // The whole stack, top first, in one lookup.
  std::vector<BlockKey> keys;
  for (uint64_t i = 0; i < kBlocks; ++i) keys.push_back(Key(i));
  const LookupOutcome found = engine_->Lookup(kNs, keys);
  ASSERT_EQ(found.prefix_blocks, kBlocks);
  std::map<Tier, int> per_tier;
  for (Tier t : found.tiers) ++per_tier[t];
  EXPECT_EQ(per_tier[Tier::kHbm], 3);
  EXPECT_GT(per_tier[Tier::kHost], 0);
  EXPECT_GT(per_tier[Tier::kNvme], 0);
  EXPECT_GT(per_tier[Tier::kRemote], 0);

  // A block held only above is read back from there, byte-exact.
  ASSERT_TRUE(engine_->host_tier().Erase(Key(kBlocks - 1)).ok());
  ASSERT_EQ(TierOf(kBlocks - 1), Tier::kHbm);
  ExpectByteExact(kBlocks - 1);
  EXPECT_TRUE(engine_->host_tier().Find(Key(kBlocks - 1)).has_value()) << "promoted from above";

  // Filling the level above (4 blocks) evicts its least recent, block 0:
  // the third tier still holds it, so nothing is written down.
  const int64_t demoted_before = Counters()["engine.hbm_demotions_to_host"];
  for (uint64_t i : {uint64_t{1}, uint64_t{2}}) EXPECT_EQ(LoadInPlace(i), BoardBlockState::kLoaded) << i;
  EXPECT_FALSE(above_->Find(Key(0)).has_value());
  EXPECT_NE(TierOf(0), Tier::kHbm);
  EXPECT_GE(Counters()["engine.hbm_evictions"], 1);
  EXPECT_EQ(Counters()["engine.hbm_demotions_to_host"], demoted_before);
  ExpectByteExact(0);

  // Erase reaches the level above too.
  ASSERT_TRUE(above_->Find(Key(in_nvme)).has_value());
  EXPECT_EQ(engine_->Erase(kNs, std::span(&keys[in_nvme], 1)), 1u);
  EXPECT_FALSE(above_->Find(Key(in_nvme)).has_value());
  EXPECT_EQ(TierOf(in_nvme), Tier::kNone);
  for (uint64_t i : {uint64_t{1}, uint64_t{2}, kBlocks - 1}) ExpectByteExact(i);
}

// A level below the host is named to clients only as its registration
// says (LowerTier::reported): the same tier reports as nvme or as remote,
// and a place that is not below the host is refused.
TEST(TierStackPlaces, ALevelReportsAsItsRegistrationSaysAndOnlyAsAPlaceBelowTheHost) {
  FakeClock clock;
  for (Tier reported : {Tier::kNvme, Tier::kRemote}) {
    std::unique_ptr<HostTier> host = ::kvtier::testing::OpenTestHostTier(kBlockBytes);
    ASSERT_NE(host, nullptr);
    MapTier below;
    auto engine = Engine::Create(EngineOptions{1, EvictionPolicyId::kLru}, *host, clock,
                                 {LowerTier{.tier = &below, .reported = reported}});
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    (*engine)->RegisterNamespace(kNs, NamespaceLayout{kLayers, kBlockBytes});
    ASSERT_TRUE(::kvtier::testing::PutFilledBlock(**engine, *host, 1, kNs, Key(0), kBlockBytes).ok());
    ASSERT_TRUE(::kvtier::testing::PutFilledBlock(**engine, *host, 1, kNs, Key(1), kBlockBytes).ok());
    (*engine)->WaitForIdle();
    ASSERT_TRUE(below.Find(Key(0)).has_value()) << "the first block was demoted";
    EXPECT_EQ(::kvtier::testing::LookupTier(**engine, kNs, Key(0)), reported);
  }
  for (Tier wrong : {Tier::kNone, Tier::kHbm, Tier::kHost}) {
    std::unique_ptr<HostTier> host = ::kvtier::testing::OpenTestHostTier(kBlockBytes);
    ASSERT_NE(host, nullptr);
    MapTier below;
    auto engine = Engine::Create(EngineOptions{1, EvictionPolicyId::kLru}, *host, clock,
                                 {LowerTier{.tier = &below, .reported = wrong}});
    ASSERT_FALSE(engine.ok()) << TierName(wrong);
    EXPECT_EQ(engine.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(engine.status().message().find("nvme or remote"), std::string::npos) << engine.status().message();
  }
}

}  // namespace
}  // namespace kvtier

// The tier stack (tiers/tier.h, Engine over LowerTiers): a three-tier
// stack, host -> NVMe (memory device) -> a tier defined only in the tests
// (tests/testing/map_tier.h).
// Blocks demote down to the third tier and come back up byte-exact, with
// no production code written for that tier; each tier's admission decides
// where an evicted block goes.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "common/checksum.h"
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
using ::kvtier::testing::MemoryDevice;
using ::kvtier::testing::MapTier;
using ::kvtier::testing::SlotBytes;

constexpr uint64_t kBlockBytes = 64 << 10;  // 4 layers of 16 KiB
constexpr uint32_t kLayers = 4;
constexpr NamespaceFingerprint kNs{0x5eed, 0x7143};

BlockKey Key(uint64_t i) { return BlockKey{0x3713, i}; }

class TierStackTest : public ::testing::Test {
 protected:
  // host: 8 blocks; NVMe: 4 regions of 1 MiB (about 60 records, fewer
  // once reclaim keeps a region ahead); below it the map tier.
  void Build(AdmissionPolicyId nvme_admission) {
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
    auto engine = Engine::Create(EngineOptions{4, EvictionPolicyId::kLru}, *host_, clock_, std::move(stack));
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

  std::string dir_;
  FakeClock clock_;
  std::unique_ptr<MemoryDevice> memory_;
  std::unique_ptr<HostTier> host_;
  std::unique_ptr<NvmeTier> nvme_;
  MapTier map_;
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
    auto engine = Engine::Create(EngineOptions{1, EvictionPolicyId::kLru}, *host, clock, {LowerTier{.tier = &below, .reported = wrong}});
    ASSERT_FALSE(engine.ok()) << TierName(wrong);
    EXPECT_EQ(engine.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(engine.status().message().find("nvme or remote"), std::string::npos) << engine.status().message();
  }
}

}  // namespace
}  // namespace kvtier

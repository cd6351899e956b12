// Engine::CheckHealth: each tier of the stack reports its own health, top
// first, and the engine passes it on through the wrappers it puts around
// a tier (MeasuredTier) and through a tenant's view of a shared tier
// (TenantTier); the host tier warns of an arena not locked in memory, and
// the engine adds its own failed promotions.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "common/health_findings.h"
#include "daemon/engine/engine.h"
#include "daemon/tenants/tenant_tier.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/memory_device.h"
#include "tests/testing/memory_nvme.h"
#include "tests/testing/recording_tier.h"
#include "tests/testing/test_daemon.h"
#include "tiers/nvme/nvme_tier.h"

namespace kvtier {
namespace {

using ::kvtier::testing::Capabilities;
using ::kvtier::testing::FakeClock;
using ::kvtier::testing::kRecordingProblem;
using ::kvtier::testing::kRecordingWarning;
using ::kvtier::testing::RecordingTier;

constexpr uint64_t kBlockBytes = 64 << 10;
const std::string kUnlockedArena = "the host arena is not locked in memory (RLIMIT_MEMLOCK): the kernel may swap it";

class EngineHealthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    host_ = ::kvtier::testing::OpenTestHostTier(8 * kBlockBytes);  // never locked (LockMode::kOff)
    ASSERT_NE(host_, nullptr);
  }
  // An engine over host_, `below` (may be null) and `above` (may be null).
  std::unique_ptr<Engine> Open(BlockTier* below, BlockTier* above = nullptr) {
    std::vector<LowerTier> lower;
    if (below != nullptr) lower.push_back(LowerTier{.tier = below, .reported = Tier::kNvme});
    auto engine = Engine::Create(EngineOptions{2, EvictionPolicyId::kLru}, *host_, clock_, std::move(lower), above);
    EXPECT_TRUE(engine.ok()) << engine.status().ToString();
    return engine.ok() ? std::move(*engine) : nullptr;
  }
  static HealthFindings HealthOf(const Engine& engine) {
    HealthFindings report;
    engine.CheckHealth(report);
    return report;
  }

  FakeClock clock_;
  std::unique_ptr<HostTier> host_;
};

TEST_F(EngineHealthTest, EachTierReportsItsOwnTopFirstThroughTheEnginesWrappers) {
  RecordingTier above(Capabilities{.health = true});
  RecordingTier below(Capabilities{.health = true});
  auto engine = Open(&below, &above);
  ASSERT_NE(engine, nullptr);
  const HealthFindings report = HealthOf(*engine);
  EXPECT_EQ(report.problems, (std::vector<std::string>{kRecordingProblem, kRecordingProblem}));
  EXPECT_EQ(report.warnings, (std::vector<std::string>{kRecordingWarning, kUnlockedArena, kRecordingWarning}))
      << "above, host, below";
  EXPECT_EQ(above.calls.count("CheckHealth"), 1u);
  EXPECT_EQ(below.calls.count("CheckHealth"), 1u);
}

TEST_F(EngineHealthTest, ATierWithNothingToReportAddsNothing) {
  RecordingTier below(Capabilities{});
  auto engine = Open(&below);
  ASSERT_NE(engine, nullptr);
  const HealthFindings report = HealthOf(*engine);
  EXPECT_TRUE(report.problems.empty());
  EXPECT_EQ(report.warnings, std::vector<std::string>{kUnlockedArena});
}

// Every tenant's engine hears that the tier they share is failing.
TEST_F(EngineHealthTest, ASharedTiersHealthReachesEachTenantsEngine) {
  RecordingTier tier(Capabilities{.health = true});
  SharedTier shared(tier);
  const std::string secret(kTenantKeyBytes, 's');
  const TenantScope scope_a(secret, "team-a"), scope_b(secret, "team-b");
  TenantTier view_a(shared, scope_a, 0), view_b(shared, scope_b, 0);
  auto engine_a = Open(&view_a);
  ASSERT_NE(engine_a, nullptr);
  auto engine_b = Open(&view_b);
  ASSERT_NE(engine_b, nullptr);
  for (const Engine* engine : {engine_a.get(), engine_b.get()}) {
    const HealthFindings report = HealthOf(*engine);
    EXPECT_EQ(report.problems, std::vector<std::string>{kRecordingProblem});
    EXPECT_NE(std::find(report.warnings.begin(), report.warnings.end(), kRecordingWarning), report.warnings.end());
  }
}

// A promotion that fails (a corrupt NVMe record) is the engine's own
// warning.
TEST_F(EngineHealthTest, AFailedPromotionIsAWarning) {
  const std::string dir = ::kvtier::testing::MakeTempDir();
  ::kvtier::testing::MemoryDevice memory(16 << 20);
  {
    auto nvme = ::kvtier::testing::OpenMemoryNvmeTier(memory, dir, clock_);
    ASSERT_TRUE(nvme.ok()) << nvme.status().ToString();
    auto engine = Open(nvme->get());
    ASSERT_NE(engine, nullptr);
    const NamespaceFingerprint ns{0x4ea1, 0x7};
    for (uint64_t i = 0; i < 12; ++i) {  // 8 fit the host tier: the first 4 go to NVMe
      clock_.AdvanceUs(1);
      ASSERT_TRUE(::kvtier::testing::PutFilledBlock(*engine, *host_, 1, ns, BlockKey{0x4ea1, i}, kBlockBytes).ok());
    }
    engine->WaitForIdle();
    EXPECT_EQ(HealthOf(*engine).warnings, std::vector<std::string>{kUnlockedArena}) << "nothing failed yet";
    const BlockKey key{0x4ea1, 0};
    std::vector<std::byte> bytes(kBlockBytes);
    ::kvtier::testing::FillBlockBytes(key, 0, bytes);
    const auto raw = memory.raw();
    const auto at = std::search(raw.begin(), raw.end(), bytes.begin(), bytes.begin() + 64);
    ASSERT_NE(at, raw.end());
    at[kBlockBytes / 2] ^= std::byte{0x10};  // its record on the device goes bad
    ASSERT_EQ(engine->Pin(1, ns, {&key, 1})[0].status.code(), StatusCode::kNotFound);
    EXPECT_EQ(HealthOf(*engine).warnings,
              (std::vector<std::string>{kUnlockedArena, "engine.promotion_failures = 1 (see the log)",
                                        "1 block(s) failed verification and are quarantined, never served from that "
                                        "tier until written again: 1 in nvme (" +
                                            key.ToHex() + ")"}));
    engine.reset();
  }
  ::kvtier::testing::RemoveTree(dir);
}

}  // namespace
}  // namespace kvtier

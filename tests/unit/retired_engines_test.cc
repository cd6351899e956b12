// RetiredEngines (daemon/setup/tenant_engines.h), what a takeover keeps of
// its engines once they stopped: a released host tier goes at once, and a
// stopped engine is freed after its tiers and host tier are gone (as a
// failed takeover frees it), touching neither (the sanitizer builds would
// see it).
#include <gtest/gtest.h>

#include <memory>
#include <utility>
#include <vector>

#include "daemon/engine/engine.h"
#include "daemon/setup/tenant_engines.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/map_tier.h"
#include "tests/testing/test_daemon.h"

namespace kvtier {
namespace {

constexpr uint64_t kBlockBytes = 64 << 10;
constexpr NamespaceFingerprint kNs{0x2e71, 0xed};
constexpr ConnectionId kConn = 5;

TEST(RetiredEnginesTest, AReleasedHostGoesAtOnceAndAStoppedEngineIsFreedAfterItsTiers) {
  ::kvtier::testing::FakeClock clock;
  auto below = std::make_unique<::kvtier::testing::MapTier>();
  std::vector<RetiredEngines::Host> hosts;
  std::vector<std::unique_ptr<Engine>> engines;
  for (const char* tenant : {"", "alpha"}) {
    auto host = ::kvtier::testing::OpenTestHostTier(4 * kBlockBytes);
    ASSERT_NE(host, nullptr);
    std::vector<LowerTier> lower{LowerTier{.tier = below.get(), .reported = Tier::kNvme}};
    auto engine = Engine::Create(EngineOptions{2, EvictionPolicyId::kLru}, *host, clock, std::move(lower));
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    // More blocks than the arena holds: some are demoted to the tier below.
    for (uint64_t i = 0; i < 8; ++i) {
      ASSERT_TRUE(
          ::kvtier::testing::PutFilledBlock(**engine, *host, kConn, kNs, BlockKey{0x2e71, i}, kBlockBytes).ok());
    }
    (*engine)->Stop();
    engines.push_back(std::move(*engine));
    hosts.push_back({tenant, std::move(host)});
  }
  EXPECT_GT(below->used_bytes(), 0u) << "the engines wrote below before they stopped";
  RetiredEngines retired(std::move(engines), std::move(hosts));
  EXPECT_EQ(retired.mapped_hosts(), 2u);
  retired.Release("host-journal.alpha");
  EXPECT_EQ(retired.mapped_hosts(), 1u) << "alpha's host tier goes with either of its names";
  retired.Release("host-arena.beta");
  EXPECT_EQ(retired.mapped_hosts(), 1u) << "an unknown name is ignored";
  below.reset();  // the tier below goes first, as a takeover closes the stack
  retired.Free();
  EXPECT_EQ(retired.mapped_hosts(), 0u);
}

}  // namespace
}  // namespace kvtier

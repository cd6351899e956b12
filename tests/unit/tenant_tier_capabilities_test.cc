// TenantTier's capabilities (daemon/tenants/tenant_tier.h, tiers/tier.h): a
// tenant's view of a shared tier has the probes, in-place holds, reclaim
// hooks and namespace sums of that tier (and none it lacks), scoped to the
// tenant, and its health report, and never its protected shares:
// installing shares changes the tier for every tenant, so only SharedTier
// does it, and nothing a tenant's view is asked (nor the engine's
// MeasuredTier around it) reaches them.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "daemon/engine/measured_tier.h"
#include "daemon/tenants/tenant_tier.h"
#include "tests/testing/recording_tier.h"

namespace kvtier {
namespace {

using ::kvtier::testing::CallEverything;
using ::kvtier::testing::Capabilities;
using ::kvtier::testing::CapabilitiesOf;
using ::kvtier::testing::ExpectSameCapabilities;
using ::kvtier::testing::kEveryCapability;
using ::kvtier::testing::RecordingTier;

const std::string kSecret(kTenantKeyBytes, 's');
const NamespaceFingerprint kModel{0x1234567800abcdefULL, 0x0fedcba987654321ULL};

TEST(TenantTierCapabilities, AViewHasTheSharedTiersCapabilitiesButNeverItsShares) {
  const TenantScope scope(kSecret, "team-a");
  const std::vector<Capabilities> cases = {{},
                                           kEveryCapability,
                                           {.prober = true},
                                           {.in_place_holds = true},
                                           {.reclaim_hooks = true},
                                           {.reclaim_shares = true},
                                           {.namespace_sums = true},
                                           {.health = true}};
  for (size_t i = 0; i < cases.size(); ++i) {
    RecordingTier inner(cases[i]);
    SharedTier shared(inner);
    TenantTier view(shared, scope, 0);
    MeasuredTier measured(view);  // as the engine wraps every tier of its stack
    Capabilities want = cases[i];
    want.reclaim_shares = false;
    ExpectSameCapabilities(CapabilitiesOf(view), want, "case " + std::to_string(i) + " TenantTier");
    ExpectSameCapabilities(CapabilitiesOf(measured), want, "case " + std::to_string(i) + " MeasuredTier over it");
  }
}

TEST(TenantTierCapabilities, TheViewsCapabilitiesAreItsOwnScopedOnes) {
  const TenantScope scope(kSecret, "team-a");
  RecordingTier inner;
  SharedTier shared(inner);
  TenantTier view(shared, scope, 0);
  // Not the shared tier's own: those would see every tenant's keys unscoped.
  EXPECT_EQ(view.prober(), static_cast<Prober*>(&view));
  EXPECT_EQ(view.in_place_holds(), static_cast<InPlaceHolds*>(&view));
  EXPECT_EQ(view.reclaim_hooks(), static_cast<ReclaimHooks*>(&view));
  EXPECT_EQ(view.namespace_sums(), static_cast<const NamespaceSums*>(&view));
}

TEST(TenantTierCapabilities, NothingATenantsViewIsAskedChangesTheSharedTiersShares) {
  const TenantScope scope_a(kSecret, "team-a"), scope_b(kSecret, "team-b");
  RecordingTier inner;  // with shares: shareable_bytes() 9
  SharedTier shared(inner);
  TenantTier a(shared, scope_a, 0);
  TenantTier b(shared, scope_b, 0);
  const size_t installs = inner.calls.count("SetShares");
  EXPECT_EQ(installs, 2u) << "SharedTier installs the shares as each tenant joins";
  ASSERT_TRUE(inner.installed_shares);

  MeasuredTier measured(a);
  CallEverything(a);
  CallEverything(measured);
  CallEverything(b);

  EXPECT_EQ(inner.calls.count("SetShares"), installs);
  ASSERT_TRUE(inner.installed_shares) << "a tenant's view cleared the shares of every tenant";
  const ShareOwner owner_a = inner.installed_shares(scope_a.ScopeNamespace(kModel));
  const ShareOwner owner_b = inner.installed_shares(scope_b.ScopeNamespace(kModel));
  EXPECT_NE(owner_a.owner, 0u);
  EXPECT_NE(owner_b.owner, 0u);
  EXPECT_NE(owner_a.owner, owner_b.owner);
}

}  // namespace
}  // namespace kvtier

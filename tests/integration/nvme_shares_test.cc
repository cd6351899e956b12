// Protected shares on the shared NVMe tier (docs/OPERATIONS.md, "Tenants"):
// two tenants on one file-backed NVMe tier, wired as kvtierd wires them
// (ParseConfig with [[tenant]] tables, OpenTierStack, DaemonEngines).
// Tenant alpha stores blocks within its nvme_bytes; tenant beta writes
// many times the tier through its own view of it; every block of alpha's
// is still there, byte-exact. The writes go through the tenants' views of
// the shared tier (the TenantTiers the engines demote through), so the
// test drives the tier as hard as it likes without an arena in between.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <thread>

#include "daemon/tenants/tenant_scope.h"
#include "tests/testing/counter_of.h"
#include "tests/testing/tenant_stack.h"
#include "tests/testing/test_daemon.h"
#include "tiers/nvme/nvme_tier.h"

namespace kvtier::testing {
namespace {

constexpr uint64_t kMiB = 1 << 20;
constexpr size_t kBlockBytes = 64 << 10;
constexpr uint32_t kLayers = 4;

// A 32 MiB tier of 4 MiB regions; alpha and beta with `alpha_extra` and
// `beta_extra` in their tables.
class SharedNvme {
 public:
  SharedNvme(const std::string& alpha_extra, const std::string& beta_extra)
      : dir_(MakeTempDir()),
        built_(dir_, "[[tenant]]\nname = \"alpha\"\nuids = [54320]\n" + alpha_extra +
                         "[[tenant]]\nname = \"beta\"\nuids = [54321]\n" + beta_extra) {}
  ~SharedNvme() { RemoveTree(dir_); }  // after built_ closed the engines and tiers

  const Status& opened() const { return built_.opened(); }
  BlockTier& view(size_t tenant) const { return *built_.engines->tenants().at(tenant).below.at(0); }
  NamespaceFingerprint ns(size_t tenant) const {
    return built_.engines->tenants().at(tenant).scope->ScopeNamespace(FingerprintNamespace(TestNamespace()));
  }
  NvmeTier& nvme() const { return dynamic_cast<NvmeTier&>(*built_.stack.lower.at(0).tier); }
  int64_t Counter(std::string_view name) const { return CounterOf(nvme(), name); }

  // Writes through `tenant`'s view and waits: the rejection or the
  // completion. Busy (the tier copying protected blocks forward, or out of
  // staging) is waited out: it is backpressure, not an answer.
  Status Write(size_t tenant, const BlockKey& key, uint64_t salt) const {
    const std::vector<std::byte> payload = Block(key, kBlockBytes, salt);
    for (int busy = 0;; ++busy) {
      auto done = std::make_shared<std::promise<Status>>();
      std::future<Status> result = done->get_future();
      Status accepted =
          view(tenant).Write(ns(tenant), key, kLayers, payload, [done](Status s) { done->set_value(std::move(s)); });
      if (accepted.code() == StatusCode::kBusy && busy < 1000) {
        nvme().WaitForIdle();
        continue;
      }
      if (!accepted.ok()) return accepted;
      return result.get();
    }
  }

  // Whether `tenant` reads `key` back byte-exact.
  bool ReadsExact(size_t tenant, const BlockKey& key, uint64_t salt) const {
    std::vector<std::byte> out(kBlockBytes);
    auto done = std::make_shared<std::promise<Result<size_t>>>();
    std::future<Result<size_t>> result = done->get_future();
    Status started =
        view(tenant).Read(key, 0, kLayers, out, [done](Result<size_t> r) { done->set_value(std::move(r)); });
    if (!started.ok()) return false;
    Result<size_t> read = result.get();
    return read.ok() && *read == kBlockBytes && CheckBlockBytes(key, salt, out);
  }

 private:
  std::string dir_;  // declared first: removed after built_ is closed
  TenantStack built_;
};

// Alpha's 80 blocks (5 MiB, within its 6 MiB share), written first, so
// that they are the oldest on the tier and the first the log would reclaim.
std::vector<BlockKey> StoreAlpha(const SharedNvme& tier) {
  const auto keys = TestKeys(TestNamespace(), 80, 1);
  for (const auto& k : keys) EXPECT_TRUE(tier.Write(0, k, 1).ok());
  return keys;
}

void ExpectAllReadable(const SharedNvme& tier, const std::vector<BlockKey>& keys) {
  tier.nvme().WaitForIdle();
  // The log wrapped many times over alpha's regions (8 regions of 4 MiB).
  EXPECT_GE(tier.Counter("nvme.region_reclaims"), 20);
  size_t exact = 0;
  for (const auto& k : keys) exact += tier.ReadsExact(0, k, 1);
  EXPECT_EQ(exact, keys.size()) << "alpha lost blocks of its share to beta's writes";
}

// Beta stays inside its quota and churns: fills it, erases what it wrote,
// fills it again, 12 times (144 MiB through a 32 MiB tier). Each round
// leaves its erased records dead in the log, so the log wraps.
TEST(NvmeShares, ATenantChurningInsideItsQuotaEvictsNoneOfAnothersShare) {
  SharedNvme tier("nvme_bytes = \"6MiB\"\n", "nvme_bytes = \"12MiB\"\n");
  ASSERT_TRUE(tier.opened().ok()) << tier.opened().ToString();
  const auto alpha = StoreAlpha(tier);
  for (uint32_t round = 0; round < 12; ++round) {
    const auto keys = TestKeys(TestNamespace(), 12 * kMiB / kBlockBytes, 100 + round);
    for (const auto& k : keys) {
      Status s = tier.Write(1, k, 2);
      ASSERT_TRUE(s.ok() || s.code() == StatusCode::kNoSpace) << s.ToString();
    }
    for (const auto& k : keys) tier.view(1).Erase(k).IgnoreError();  // refused ones were never stored
  }
  ExpectAllReadable(tier, alpha);
  EXPECT_GE(tier.Counter("nvme.share_copies"), 80) << "alpha's blocks were copied forward";
}

// Beta has no quota: its share is what alpha's leaves of the tier. It
// writes 10 times the tier and never erases; its own oldest blocks go.
TEST(NvmeShares, ATenantWritingFarPastItsShareEvictsOnlyItsOwnBlocks) {
  SharedNvme tier("nvme_bytes = \"6MiB\"\n", "");
  ASSERT_TRUE(tier.opened().ok()) << tier.opened().ToString();
  const auto alpha = StoreAlpha(tier);
  const auto beta = TestKeys(TestNamespace(), 320 * kMiB / kBlockBytes, 7);
  for (const auto& k : beta) {
    Status s = tier.Write(1, k, 2);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  ExpectAllReadable(tier, alpha);
  size_t beta_kept = 0;
  for (size_t i = beta.size() - 16; i < beta.size(); ++i) beta_kept += tier.ReadsExact(1, beta[i], 2);
  EXPECT_EQ(beta_kept, 16u) << "beta's newest blocks stay";
}

// The shares must fit what the tier can protect: 32 MiB less 3 regions of
// 4 MiB is 20 MiB, and 12 + 12 MiB do not fit.
TEST(NvmeShares, QuotasThatDoNotFitTheTierStopStartUpNamingTheNumbers) {
  SharedNvme tier("nvme_bytes = \"12MiB\"\n", "nvme_bytes = \"12MiB\"\n");
  ASSERT_FALSE(tier.opened().ok());
  EXPECT_EQ(tier.opened().code(), StatusCode::kInvalidArgument);
  const std::string& message = tier.opened().message();
  EXPECT_NE(message.find("25165824"), std::string::npos) << message;  // the sum of the quotas
  EXPECT_NE(message.find("20971520"), std::string::npos) << message;  // what the tier protects
  EXPECT_NE(message.find("nvme_bytes"), std::string::npos) << message;
}

}  // namespace
}  // namespace kvtier::testing

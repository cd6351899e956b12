// What a scrape costs on the NVMe tier: the per-namespace byte sums that
// the engine's counters (/metrics' kvtier_namespace_bytes, the tiers' use)
// read come, through every wrapper kvtierd puts around the NVMe tier
// (SharedTier's TenantTier views, the engine's MeasuredTier), from the sums
// the tier keeps per namespace (the NamespaceSums capability,
// tiers/tier.h): one visit per namespace, and not one entry handed out
// (nvme.blocks_listed, which counts every entry a walk visits, stays put).
// A wrapper that lost the capability, or a tier that summed by walking its
// entries under its lock, would fail here.
#include <gtest/gtest.h>

#include <future>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/counters.h"
#include "daemon/engine/measured_tier.h"
#include "tests/testing/counter_of.h"
#include "tests/testing/tenant_stack.h"
#include "tests/testing/test_daemon.h"
#include "tiers/nvme/nvme_tier.h"

namespace kvtier {
namespace {

using ::kvtier::testing::CounterOf;

constexpr size_t kBlockBytes = 4096;
constexpr uint32_t kLayers = 4;
constexpr size_t kBlocksPerNamespace = 300;

class NvmeScrape : public ::testing::Test {
 protected:
  NvmeScrape()
      : dir_(::kvtier::testing::MakeTempDir()),
        built_(dir_, "[[tenant]]\nname = \"alpha\"\nuids = [54320]\n[[tenant]]\nname = \"beta\"\nuids = [54321]\n") {}
  ~NvmeScrape() override { ::kvtier::testing::RemoveTree(dir_); }

  NvmeTier& nvme() const { return dynamic_cast<NvmeTier&>(*built_.stack.lower.at(0).tier); }
  const DaemonEngines::Tenant& tenant(size_t i) const { return built_.engines->tenants().at(i); }
  TenantTier& view(size_t i) const { return *tenant(i).below.at(0); }
  // Tenant `i`'s namespace of model `model`.
  NamespaceFingerprint Ns(size_t i, uint64_t model) const {
    return tenant(i).scope->ScopeNamespace(NamespaceFingerprint{0x5c4a9e, model});
  }

  // Writes kBlocksPerNamespace blocks of kBlockBytes through tenant `i`'s
  // view into `ns`, one after another (Busy waited out).
  void Fill(size_t i, const NamespaceFingerprint& ns, uint64_t seed) {
    for (uint64_t b = 0; b < kBlocksPerNamespace; ++b) {
      const BlockKey key{seed, b};
      const std::vector<std::byte> payload = ::kvtier::testing::Block(key, kBlockBytes);
      for (int busy = 0;; ++busy) {
        auto done = std::make_shared<std::promise<Status>>();
        std::future<Status> result = done->get_future();
        Status accepted = view(i).Write(ns, key, kLayers, payload, [done](Status s) { done->set_value(std::move(s)); });
        if (accepted.code() == StatusCode::kBusy && busy < 1000) {
          nvme().WaitForIdle();
          continue;
        }
        ASSERT_TRUE(accepted.ok()) << accepted.ToString();
        ASSERT_TRUE(result.get().ok());
        break;
      }
    }
  }

  std::string dir_;
  ::kvtier::testing::TenantStack built_;
};

TEST_F(NvmeScrape, SumsComeFromKeptTotalsThroughEveryWrapperNeverFromTheEntries) {
  ASSERT_TRUE(built_.opened().ok()) << built_.opened().ToString();
  // Two tenants, two namespaces each: 1,200 entries in 4 namespaces.
  Fill(0, Ns(0, 1), 1);
  Fill(0, Ns(0, 2), 2);
  Fill(1, Ns(1, 1), 3);
  Fill(1, Ns(1, 2), 4);
  nvme().WaitForIdle();
  ASSERT_EQ(CounterOf(nvme(), "nvme.blocks"), int64_t{4 * kBlocksPerNamespace});
  const uint64_t want = kBlocksPerNamespace * kBlockBytes;
  const int64_t listed = CounterOf(nvme(), "nvme.blocks_listed");

  // The sums through the wrappers the engine reads: its MeasuredTier over
  // the tenant's TenantTier over the NVMe tier.
  MeasuredTier measured(view(0));
  ASSERT_NE(measured.namespace_sums(), nullptr) << "a wrapper lost the kept sums";
  std::map<NamespaceFingerprint, uint64_t> sums;
  int visits = 0;
  VisitNamespaceBytes(measured, [&](const NamespaceFingerprint& ns, uint64_t bytes) {
    ++visits;
    sums[ns] += bytes;
  });
  EXPECT_EQ(visits, 2) << "once per namespace of the tenant";
  EXPECT_EQ(sums, (std::map<NamespaceFingerprint, uint64_t>{{Ns(0, 1), want}, {Ns(0, 2), want}}));
  EXPECT_EQ(measured.used_bytes(), 2 * want);

  // A scrape of each tenant's engine: its namespace series and tier use.
  for (size_t i = 0; i < 2; ++i) {
    CounterCollector scrape;
    tenant(i).engine->VisitCounters(scrape);
    int64_t namespace_bytes = 0;
    for (const auto& [name, value] : scrape.counters()) {
      if (name.rfind("namespace.bytes{", 0) == 0 && name.find("tier=\"nvme\"") != std::string::npos) {
        namespace_bytes += value;
      }
    }
    EXPECT_EQ(namespace_bytes, static_cast<int64_t>(2 * want)) << "tenant " << i;
  }
  EXPECT_EQ(CounterOf(nvme(), "nvme.blocks_listed"), listed) << "a scrape walked the NVMe entries";

  // The counter does see a walk: a listing hands out every entry.
  size_t walked = 0;
  measured.ForEachBlock([&walked](const BlockKey&, const BlockTier::BlockInfo&) { ++walked; });
  EXPECT_EQ(walked, 2 * kBlocksPerNamespace);
  EXPECT_EQ(CounterOf(nvme(), "nvme.blocks_listed"), listed + int64_t{4 * kBlocksPerNamespace});
}

}  // namespace
}  // namespace kvtier

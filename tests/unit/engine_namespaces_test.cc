// Namespaces as an operator sees them (`kvtier ls` / `kvtier drop`): the
// blocks and bytes of each namespace per tier, what a registered namespace
// is, the namespaces of a model revision, and dropping one from every tier
// including the NVMe tier's persistent index.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "daemon/engine/engine.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/memory_device.h"
#include "tests/testing/memory_nvme.h"
#include "tests/testing/test_daemon.h"
#include "tiers/nvme/nvme_tier.h"

namespace kvtier {
namespace {

using ::kvtier::testing::FakeClock;

constexpr uint64_t kBlockBytes = 64 << 10;

using ::kvtier::testing::ModelNamespace;

class EngineNamespacesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::kvtier::testing::MakeTempDir();
    memory_ = std::make_unique<::kvtier::testing::MemoryDevice>(16 << 20);
    host_ = ::kvtier::testing::OpenTestHostTier(8 * kBlockBytes);
    ASSERT_NE(host_, nullptr);
    OpenEngine();
  }
  void TearDown() override {
    engine_.reset();
    nvme_.reset();
    ::kvtier::testing::RemoveTree(dir_);
  }
  void OpenEngine() {
    auto tier = ::kvtier::testing::OpenMemoryNvmeTier(*memory_, dir_, clock_);
    ASSERT_TRUE(tier.ok()) << tier.status().ToString();
    nvme_ = std::move(*tier);
    auto engine = Engine::Create(EngineOptions{2, EvictionPolicyId::kLru}, *host_, clock_, nvme_.get());
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    engine_ = std::move(*engine);
  }
  void Put(const NamespaceFingerprint& ns, uint64_t i) {
    clock_.AdvanceUs(1);
    Status s = ::kvtier::testing::PutFilledBlock(*engine_, *host_, 1, ns, BlockKey{ns.lo, i}, kBlockBytes);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  const Engine::NamespaceUse* Use(const std::vector<Engine::NamespaceUse>& uses, const NamespaceFingerprint& ns) {
    for (const auto& u : uses) {
      if (u.ns == ns) return &u;
    }
    return nullptr;
  }

  std::string dir_;
  FakeClock clock_;
  std::unique_ptr<::kvtier::testing::MemoryDevice> memory_;
  std::unique_ptr<HostTier> host_;
  std::unique_ptr<NvmeTier> nvme_;
  std::unique_ptr<Engine> engine_;
};

TEST_F(EngineNamespacesTest, ListsEachNamespacesBlocksAndBytesPerTierAndWhatItIs) {
  const NamespaceDescriptor a = ModelNamespace("org/model", "rev-1");
  const NamespaceDescriptor b = ModelNamespace("org/model", "rev-1", "lora-x");
  const NamespaceFingerprint fa = FingerprintNamespace(a), fb = FingerprintNamespace(b);
  engine_->RegisterNamespace(fa, a);
  engine_->RegisterNamespace(fb, b);
  for (uint64_t i = 0; i < 10; ++i) Put(fa, i);  // 8 host blocks: two of them demoted
  for (uint64_t i = 0; i < 2; ++i) Put(fb, i);   // and two more of a's
  engine_->WaitForIdle();
  const auto uses = engine_->NamespaceUses();
  const auto* ua = Use(uses, fa);
  const auto* ub = Use(uses, fb);
  ASSERT_NE(ua, nullptr);
  ASSERT_NE(ub, nullptr);
  ASSERT_EQ(ua->tiers.size(), 2u);
  EXPECT_EQ(ua->tiers[0].tier, "host");
  EXPECT_EQ(ua->tiers[1].tier, "nvme");
  EXPECT_EQ(ua->tiers[0].blocks, 6u);
  EXPECT_EQ(ua->tiers[0].bytes, 6 * kBlockBytes);
  EXPECT_EQ(ua->tiers[1].blocks, 4u);
  EXPECT_EQ(ua->tiers[1].bytes, 4 * kBlockBytes);
  EXPECT_EQ(ub->tiers[0].blocks, 2u);
  EXPECT_EQ(ub->tiers[1].blocks, 0u);
  ASSERT_TRUE(ua->descriptor.has_value());
  EXPECT_EQ(ua->descriptor->model_revision, "rev-1");
  EXPECT_EQ(ub->descriptor->adapter_id, "lora-x");
  // A namespace nobody registered since start is listed by its blocks alone.
  const NamespaceFingerprint unknown{0x77, 0x77};
  Put(unknown, 1);
  const auto listed = engine_->NamespaceUses();  // kept: Use points into it
  const auto* uu = Use(listed, unknown);
  ASSERT_NE(uu, nullptr);
  EXPECT_FALSE(uu->descriptor.has_value());
  EXPECT_EQ(uu->tiers[0].blocks, 1u);
}

TEST_F(EngineNamespacesTest, AModelRevisionNamesItsNamespacesAcrossAdapters) {
  const NamespaceDescriptor r1 = ModelNamespace("org/model", "rev-1");
  const NamespaceDescriptor r1_lora = ModelNamespace("org/model", "rev-1", "lora-x");
  const NamespaceDescriptor r2 = ModelNamespace("org/model", "rev-2");
  const NamespaceDescriptor other = ModelNamespace("org/other", "rev-1");
  for (const auto* d : {&r1, &r1_lora, &r2, &other}) engine_->RegisterNamespace(FingerprintNamespace(*d), *d);
  auto of_r1 = engine_->NamespacesOfModel("org/model", "rev-1");
  std::sort(of_r1.begin(), of_r1.end());
  std::vector<NamespaceFingerprint> expected = {FingerprintNamespace(r1), FingerprintNamespace(r1_lora)};
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(of_r1, expected);
  EXPECT_EQ(engine_->NamespacesOfModel("org/model", "").size(), 3u) << "every revision";
  EXPECT_TRUE(engine_->NamespacesOfModel("org/none", "rev-1").empty());
}

TEST_F(EngineNamespacesTest, DropRemovesANamespaceFromEveryTierAndTheNvmeIndexLeavingOthers) {
  const NamespaceDescriptor a = ModelNamespace("org/model", "rev-1");
  const NamespaceDescriptor b = ModelNamespace("org/model", "rev-2");
  const NamespaceFingerprint fa = FingerprintNamespace(a), fb = FingerprintNamespace(b);
  engine_->RegisterNamespace(fa, a);
  engine_->RegisterNamespace(fb, b);
  // 16 blocks over 8 host slots: b's 0..3 and a's 0..3 go to NVMe.
  for (uint64_t i = 0; i < 4; ++i) Put(fb, i);
  for (uint64_t i = 0; i < 6; ++i) Put(fa, i);
  for (uint64_t i = 4; i < 10; ++i) Put(fb, i);
  engine_->WaitForIdle();
  const auto dropped = engine_->DropNamespace(fa);
  ASSERT_EQ(dropped.size(), 2u);
  EXPECT_EQ(dropped[0].blocks + dropped[1].blocks, 6u);
  EXPECT_GT(dropped[1].blocks, 0u) << "some of a's blocks were on NVMe";
  engine_->WaitForIdle();
  for (uint64_t i = 0; i < 6; ++i) {
    EXPECT_EQ(::kvtier::testing::LookupTier(*engine_, fa, BlockKey{fa.lo, i}), Tier::kNone) << i;
  }
  for (uint64_t i = 0; i < 10; ++i) {
    EXPECT_NE(::kvtier::testing::LookupTier(*engine_, fb, BlockKey{fb.lo, i}), Tier::kNone) << i;
  }
  const auto after_drop = engine_->NamespaceUses();  // kept: Use points into it
  const auto* ua = Use(after_drop, fa);
  ASSERT_NE(ua, nullptr) << "still registered";
  EXPECT_EQ(ua->tiers[0].blocks + ua->tiers[1].blocks, 0u);
  // A restart reads the NVMe tier back from its index: nothing of a's.
  size_t b_on_nvme = 0;
  nvme_->ForEachBlock([&](const BlockKey&, const BlockTier::BlockInfo& info) { b_on_nvme += info.ns == fb; });
  engine_.reset();
  nvme_.reset();
  OpenEngine();
  size_t a_after = 0, b_after = 0;
  nvme_->ForEachBlock([&](const BlockKey&, const BlockTier::BlockInfo& info) {
    a_after += info.ns == fa;
    b_after += info.ns == fb;
  });
  EXPECT_EQ(a_after, 0u);
  EXPECT_EQ(b_on_nvme, 4u);
  EXPECT_EQ(b_after, b_on_nvme);
}

}  // namespace
}  // namespace kvtier

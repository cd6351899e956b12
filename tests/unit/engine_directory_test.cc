// The engine keeps the host tier's block directory true: a committed block
// is published with what a Pin would grant, and withdrawn at once when it is
// erased (pinned or not), evicted or demoted; reported directory reads steer
// eviction like pins do; promotions are published; with an NVMe tier no
// host miss is final.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <map>
#include <memory>
#include <optional>

#include "common/block_directory.h"
#include "daemon/engine/engine.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/fault_injecting_device.h"
#include "tests/testing/memory_device.h"
#include "tests/testing/memory_nvme.h"
#include "tests/testing/test_daemon.h"
#include "tiers/nvme/nvme_tier.h"

namespace kvtier {
namespace {

using ::kvtier::testing::FakeClock;
using ::kvtier::testing::FaultInjectingDevice;
using ::kvtier::testing::MemoryDevice;
using ::kvtier::testing::SlotBytes;

constexpr uint64_t kBlockBytes = 4096;  // one allocator class exactly
constexpr NamespaceFingerprint kNs{0xd1, 0x7e};

BlockKey Key(uint64_t i) { return BlockKey{0xd12ec7, i}; }

class EngineDirectoryTest : public ::testing::Test {
 protected:
  // An engine over `blocks` 4 KiB blocks of arena and a 256-slot directory,
  // mapped read-only here as a client maps it; with an NVMe tier on request.
  void Make(uint64_t blocks, bool with_nvme = false, ::kvtier::testing::FaultOptions faults = {},
            uint64_t staging_bytes = 2 << 20) {
    host_ = ::kvtier::testing::OpenTestHostTier(blocks * kBlockBytes, 256);
    ASSERT_NE(host_, nullptr);
    ASSERT_NE(host_->directory(), nullptr);
    if (with_nvme) {
      dir_ = ::kvtier::testing::MakeTempDir();
      memory_ = std::make_unique<MemoryDevice>(16 << 20);
      NvmeTierOptions options = ::kvtier::testing::SmallNvmeOptions();
      options.staging_bytes = staging_bytes;
      auto tier = ::kvtier::testing::OpenMemoryNvmeTier(*memory_, dir_, clock_, options, faults);
      ASSERT_TRUE(tier.ok()) << tier.status().ToString();
      nvme_ = std::move(*tier);
    }
    auto engine = Engine::Create(EngineOptions{2, EvictionPolicyId::kLru}, *host_, clock_, nvme_.get());
    ASSERT_TRUE(engine.ok());
    engine_ = std::move(*engine);
    engine_->RegisterNamespace(kNs, NamespaceLayout{1, kBlockBytes});
    map_bytes_ = host_->directory()->bytes();
    map_ = ::mmap(nullptr, map_bytes_, PROT_READ, MAP_SHARED, host_->directory()->fd(), 0);
    ASSERT_NE(map_, MAP_FAILED);
    auto reader = DirectoryReader::Attach(static_cast<const std::byte*>(map_), map_bytes_);
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    reader_.emplace(*reader);
  }

  void TearDown() override {
    engine_.reset();
    nvme_.reset();
    if (map_ != nullptr && map_ != MAP_FAILED) ::munmap(map_, map_bytes_);
    if (!dir_.empty()) ::kvtier::testing::RemoveTree(dir_);
  }

  Status Put(uint64_t i) {
    clock_.AdvanceUs(1);
    return ::kvtier::testing::PutFilledBlock(*engine_, *host_, 1, kNs, Key(i), kBlockBytes);
  }

  std::optional<DirectoryEntry> Find(uint64_t i) {
    DirectoryEntry e;
    auto outcome = reader_->Find(kNs, Key(i), &e);
    EXPECT_NE(outcome, DirectoryReader::Outcome::kUnknown);
    if (outcome != DirectoryReader::Outcome::kHit) return std::nullopt;
    return e;
  }

  std::map<std::string, int64_t> Counters() { return ::kvtier::testing::EngineCounters(*engine_); }

  FakeClock clock_;
  std::string dir_;
  std::unique_ptr<MemoryDevice> memory_;
  std::unique_ptr<HostTier> host_;
  std::unique_ptr<NvmeTier> nvme_;
  std::unique_ptr<Engine> engine_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  std::optional<DirectoryReader> reader_;
};

TEST_F(EngineDirectoryTest, CommitPublishesWhatAPinGrants) {
  Make(8);
  EXPECT_FALSE(Find(1).has_value());
  ASSERT_TRUE(Put(1).ok());
  auto entry = Find(1);
  ASSERT_TRUE(entry.has_value());
  const BlockKey key = Key(1);
  PinGrant grant = engine_->Pin(7, kNs, {&key, 1})[0];
  ASSERT_TRUE(grant.status.ok());
  EXPECT_EQ(entry->offset, grant.offset);
  EXPECT_EQ(entry->length, grant.length);
  EXPECT_EQ(entry->checksum, grant.checksum);
  EXPECT_TRUE(reader_->MissesAreFinal()) << "host only, nothing unpublished";
  EXPECT_EQ(Counters()["host.directory.entries"], 1);
}

TEST_F(EngineDirectoryTest, EraseWithdrawsAtOnceEvenWhilePinned) {
  Make(8);
  ASSERT_TRUE(Put(1).ok());
  const BlockKey key = Key(1);
  PinGrant grant = engine_->Pin(7, kNs, {&key, 1})[0];
  ASSERT_TRUE(grant.status.ok());
  EXPECT_EQ(engine_->Erase(kNs, {&key, 1}), 1u);
  EXPECT_FALSE(Find(1).has_value()) << "an erased block stays readable only through its lease";
  EXPECT_TRUE(engine_->Release(7, {&grant.lease, 1})[0].ok());
  EXPECT_EQ(Counters()["host.directory.entries"], 0);
}

TEST_F(EngineDirectoryTest, EvictionWithdrawsTheVictim) {
  Make(4);
  for (uint64_t i = 0; i < 4; ++i) ASSERT_TRUE(Put(i).ok());
  ASSERT_TRUE(Put(4).ok());  // evicts block 0 (least recent)
  EXPECT_FALSE(Find(0).has_value());
  for (uint64_t i = 1; i <= 4; ++i) EXPECT_TRUE(Find(i).has_value()) << i;
  EXPECT_EQ(Counters()["host.directory.entries"], 4);
}

TEST_F(EngineDirectoryTest, ReportedUsesSteerEvictionLikePins) {
  Make(4);
  for (uint64_t i = 0; i < 4; ++i) ASSERT_TRUE(Put(i).ok());
  clock_.AdvanceUs(1);
  const BlockKey used[] = {Key(0), Key(99)};  // Key(99) was never cached
  EXPECT_EQ(engine_->RecordUses(kNs, used), 1u);
  ASSERT_TRUE(Put(4).ok());  // evicts the least recent: block 1, not block 0
  EXPECT_TRUE(Find(0).has_value()) << "the reported read did not count as a use";
  EXPECT_FALSE(Find(1).has_value());
  auto c = Counters();
  EXPECT_EQ(c["engine.directory_uses"], 1);
  EXPECT_EQ(c["engine.directory_stale_uses"], 1);
  const BlockKey other_ns[] = {Key(2)};
  EXPECT_EQ(engine_->RecordUses(NamespaceFingerprint{1, 1}, other_ns), 0u) << "another namespace's key";
}

TEST_F(EngineDirectoryTest, LocalLookupsAddToTheLookupCounters) {
  Make(4);
  engine_->RecordLocalLookups(3, 192, 100);
  auto c = Counters();
  EXPECT_EQ(c["engine.lookups"], 3);
  EXPECT_EQ(c["engine.local_lookups"], 3);
  EXPECT_EQ(c["engine.lookup_keys"], 192);
  EXPECT_EQ(c["engine.lookup_hit_blocks"], 100);
}

TEST_F(EngineDirectoryTest, DemotionWithdrawsAndPromotionPublishes) {
  Make(4, /*with_nvme=*/true);
  EXPECT_FALSE(reader_->MissesAreFinal()) << "a host miss may be an NVMe hit";
  for (uint64_t i = 0; i < 5; ++i) ASSERT_TRUE(Put(i).ok());  // block 0 demoted
  engine_->WaitForIdle();
  EXPECT_FALSE(Find(0).has_value());
  const BlockKey key = Key(0);
  auto lookup = engine_->Lookup(kNs, {&key, 1});
  ASSERT_EQ(lookup.prefix_blocks, 1u);
  EXPECT_EQ(lookup.tiers[0], Tier::kNvme);
  PinGrant grant = engine_->Pin(7, kNs, {&key, 1})[0];  // promotes
  ASSERT_TRUE(grant.status.ok()) << grant.status.ToString();
  auto entry = Find(0);
  ASSERT_TRUE(entry.has_value()) << "a promoted block is a host block like any other";
  EXPECT_EQ(entry->offset, grant.offset);
  EXPECT_EQ(entry->checksum, grant.checksum);
  EXPECT_TRUE(engine_->Release(7, {&grant.lease, 1})[0].ok());
}

// Between an eviction and the end of its NVMe write the block is in neither
// tier's index. Lookup still reports it (on NVMe) and a Pin waits for the
// write instead of missing.
TEST_F(EngineDirectoryTest, ABlockBeingDemotedIsStillFoundAndPinned) {
  ::kvtier::testing::FaultOptions slow;
  slow.delay_rate = 1;
  slow.delay = std::chrono::milliseconds(300);
  Make(4, /*with_nvme=*/true, slow);
  for (uint64_t i = 0; i < 5; ++i) ASSERT_TRUE(Put(i).ok());  // block 0 evicted, its write in flight
  const BlockKey key = Key(0);
  auto lookup = engine_->Lookup(kNs, {&key, 1});
  ASSERT_EQ(lookup.prefix_blocks, 1u) << "a block being demoted is cached";
  EXPECT_EQ(lookup.tiers[0], Tier::kNvme);
  PinGrant grant = engine_->Pin(7, kNs, {&key, 1})[0];
  ASSERT_TRUE(grant.status.ok()) << grant.status.ToString();
  EXPECT_TRUE(::kvtier::testing::CheckBlockBytes(key, 0, SlotBytes(*host_, grant.offset, grant.length)));
  EXPECT_TRUE(engine_->Release(7, {&grant.lease, 1})[0].ok());
  engine_->WaitForIdle();
}

// When the NVMe tier is out of staging memory, an eviction waits for a
// write in flight rather than dropping its block.
TEST_F(EngineDirectoryTest, EvictionsWaitForABusyTierInsteadOfDroppingBlocks) {
  ::kvtier::testing::FaultOptions slow;
  slow.delay_rate = 1;
  slow.delay = std::chrono::milliseconds(20);
  Make(4, /*with_nvme=*/true, slow, /*staging_bytes=*/16 << 10);  // two 8 KiB records in flight at most
  for (uint64_t i = 0; i < 12; ++i) ASSERT_TRUE(Put(i).ok()) << i;
  engine_->WaitForIdle();
  auto c = Counters();
  EXPECT_EQ(c["engine.demotion_rejections"], 0);
  EXPECT_EQ(c["engine.demotions"], 8);
  EXPECT_GT(c["engine.demotion_waits"], 0);
  std::vector<BlockKey> keys;
  for (uint64_t i = 0; i < 12; ++i) keys.push_back(Key(i));
  EXPECT_EQ(engine_->Lookup(kNs, keys).prefix_blocks, 12u) << "every block is on some tier";
}

}  // namespace
}  // namespace kvtier

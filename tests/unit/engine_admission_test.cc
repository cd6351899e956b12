// The engine's NVMe admission: second_hit drops blocks never read, dwpd
// stops demotions when its budget is spent (a warning in the engine's
// health) and resumes as it refills, a block already on NVMe costs
// nothing, the budget sees the device's bytes, and bad policy options fail
// Engine::Create. Also DwpdFromConfig.
#include <gtest/gtest.h>

#include <sys/statvfs.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>

#include "daemon/config/config.h"
#include "daemon/engine/engine.h"
#include "daemon/engine/lineage.h"
#include "daemon/engine/tier_admission.h"
#include "daemon/setup/nvme_setup.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/fault_injecting_device.h"
#include "tests/testing/memory_device.h"
#include "tests/testing/memory_nvme.h"
#include "tests/testing/test_daemon.h"
#include "tiers/nvme/block_record.h"
#include "tiers/nvme/nvme_tier.h"

namespace kvtier {
namespace {

using ::kvtier::testing::FakeClock;
using ::kvtier::testing::MemoryDevice;

constexpr uint64_t kBlockBytes = 64 << 10;
constexpr uint64_t kRecordBytes = kBlockBytes + 4096;
constexpr NamespaceFingerprint kNs{0xad31, 0x7700};

BlockKey Key(uint64_t i) { return BlockKey{0xad, i}; }

class EngineAdmissionTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = ::kvtier::testing::MakeTempDir(); }
  void TearDown() override {
    engine_.reset();
    nvme_.reset();
    ::kvtier::testing::RemoveTree(dir_);
  }

  // An engine over 8 host blocks and a memory-backed NVMe tier.
  Status Open(AdmissionPolicyId admission, const DwpdOptions& dwpd = {},
              EvictionPolicyId eviction = EvictionPolicyId::kLru) {
    memory_ = std::make_unique<MemoryDevice>(16 << 20);
    host_ = ::kvtier::testing::OpenTestHostTier(8 * kBlockBytes);
    auto tier = ::kvtier::testing::OpenMemoryNvmeTier(*memory_, dir_, clock_);
    if (!tier.ok()) return tier.status();
    nvme_ = std::move(*tier);
    EngineOptions engine_options{2, eviction};
    engine_options.admission = admission;
    engine_options.dwpd = dwpd;
    auto engine = Engine::Create(engine_options, *host_, clock_, nvme_.get());
    if (!engine.ok()) return engine.status();
    engine_ = std::move(*engine);
    return Status::Ok();
  }

  void Put(uint64_t i) {
    clock_.AdvanceUs(1);
    Status s = ::kvtier::testing::PutFilledBlock(*engine_, *host_, 1, kNs, Key(i), kBlockBytes);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }

  // One use: a Pin and its Release.
  void Use(uint64_t i) {
    clock_.AdvanceUs(1);
    Status s = ::kvtier::testing::PinAndRelease(*engine_, 2, kNs, Key(i));
    ASSERT_TRUE(s.ok()) << s.ToString();
  }

  std::map<std::string, int64_t> Counters() { return ::kvtier::testing::EngineCounters(*engine_); }

  // Blocks 1 and 2 (a chain under Key(100), never cached) and 3 under 4
  // were each used once; evicting them all under second_hit, prefix
  // closure refuses 1 (parent held nowhere) and then 2 (its parent 1 was
  // just dropped), and admits 4 and 3.
  void ExpectOnlyTheRootedChainDemoted() {
    for (uint64_t i = 1; i <= 4; ++i) Use(i);
    for (uint64_t i = 10; i < 18; ++i) Put(i);  // evicts 1..4 (LRU: 1 first)
    engine_->WaitForIdle();
    EXPECT_FALSE(nvme_->Find(Key(1))) << "its parent 100 is cached nowhere";
    EXPECT_FALSE(nvme_->Find(Key(2))) << "its parent 1 was dropped";
    EXPECT_TRUE(nvme_->Find(Key(3)));
    EXPECT_TRUE(nvme_->Find(Key(4)));
    auto c = Counters();
    EXPECT_EQ(c["nvme.admission.rejected_parent_missing"], 2);
    EXPECT_EQ(c["nvme.admission.admitted"], 2);
  }

  std::string dir_;
  FakeClock clock_;
  std::unique_ptr<MemoryDevice> memory_;
  std::unique_ptr<HostTier> host_;
  std::unique_ptr<NvmeTier> nvme_;
  std::unique_ptr<Engine> engine_;
};

TEST(TierAdmissionTest, ClassComesFromUsesThenConversation) {
  using Facts = TierAdmission::Facts;
  using State = Lineage::State;
  EXPECT_EQ(TierAdmission::ClassOf(Facts{0}), AdmissionClass::kFirstSighting);
  EXPECT_EQ(TierAdmission::ClassOf(Facts{1}), AdmissionClass::kReused);
  EXPECT_EQ(TierAdmission::ClassOf(Facts{2}), AdmissionClass::kShared);
  EXPECT_EQ(TierAdmission::ClassOf(Facts{50}), AdmissionClass::kShared);
  EXPECT_EQ(TierAdmission::ClassOf(Facts{0, State::kOpen}), AdmissionClass::kOpenSessionTail);
  EXPECT_EQ(TierAdmission::ClassOf(Facts{1, State::kOpen}), AdmissionClass::kOpenSessionTail);
  EXPECT_EQ(TierAdmission::ClassOf(Facts{1, State::kClosed}), AdmissionClass::kClosedSession);
  EXPECT_EQ(TierAdmission::ClassOf(Facts{2, State::kClosed}), AdmissionClass::kShared) << "shared beats closed";
}

TEST(LineageTest, ParentsConversationsAndTheBound) {
  Lineage l(4);
  const BlockKey chain[] = {Key(1), Key(2), Key(3)};
  l.Record(chain, 9);
  EXPECT_FALSE(l.Find(Key(1))->parent) << "the root";
  EXPECT_EQ(*l.Find(Key(3))->parent, Key(2));
  EXPECT_EQ(l.Find(Key(3))->conversation, 9u);
  EXPECT_FALSE(l.Find(Key(7)));
  EXPECT_EQ(l.ConversationState(9), Lineage::State::kOpen) << "first seen in a request";
  EXPECT_EQ(l.ConversationState(8), Lineage::State::kUnknown);
  l.SetConversation(9, false);
  l.Record(chain, 9);
  EXPECT_EQ(l.ConversationState(9), Lineage::State::kClosed) << "a request does not reopen it; a hint does";
  l.SetConversation(9, true);
  EXPECT_EQ(l.ConversationState(9), Lineage::State::kOpen);
  // The last chain naming a key wins; past 4 keys the first recorded go.
  const BlockKey other[] = {Key(5), Key(3), Key(6)};
  l.Record(other, 0);
  EXPECT_EQ(*l.Find(Key(3))->parent, Key(5));
  EXPECT_EQ(l.keys(), 4u);
  EXPECT_FALSE(l.Find(Key(1)));
  EXPECT_TRUE(l.Find(Key(2)));
  EXPECT_TRUE(l.Find(Key(6)));
}

TEST_F(EngineAdmissionTest, SecondHitDemotesBlocksReadAndDropsTheOthers) {
  ASSERT_TRUE(Open(AdmissionPolicyId::kSecondHit).ok());
  for (uint64_t i = 0; i < 8; ++i) Put(i);
  for (uint64_t i = 0; i < 4; ++i) Use(i);
  for (uint64_t i = 8; i < 16; ++i) Put(i);  // evicts 4..7 (never read), then 0..3
  engine_->WaitForIdle();
  for (uint64_t i = 0; i < 4; ++i) EXPECT_TRUE(nvme_->Find(Key(i))) << i;
  for (uint64_t i = 4; i < 8; ++i) {
    EXPECT_FALSE(nvme_->Find(Key(i))) << i;
    const BlockKey key = Key(i);
    EXPECT_EQ(engine_->Lookup(kNs, {&key, 1}).prefix_blocks, 0u) << "dropped, not demoted: " << i;
  }
  auto c = Counters();
  EXPECT_EQ(c["engine.evictions"], 8);
  EXPECT_EQ(c["engine.demotions"], 4);
  EXPECT_EQ(c["engine.admission_drops"], 4);
  EXPECT_EQ(c["nvme.admission.admitted"], 4);
  EXPECT_EQ(c["nvme.admission.rejected_first_sighting"], 4);
}

TEST_F(EngineAdmissionTest, AnOpenConversationsBlocksAreAdmittedUnread) {
  ASSERT_TRUE(Open(AdmissionPolicyId::kSecondHit).ok());
  const BlockKey chain[] = {Key(0), Key(1), Key(2), Key(3)};
  ASSERT_TRUE(engine_->Enqueue(1, kNs, 1, chain, 0, /*conversation=*/5).ok());
  ASSERT_TRUE(engine_->Dequeue(1, 1).ok());
  for (uint64_t i = 0; i < 8; ++i) Put(i);
  for (uint64_t i = 8; i < 16; ++i) Put(i);  // evicts 0..7, none ever read
  engine_->WaitForIdle();
  for (uint64_t i = 0; i < 4; ++i) EXPECT_TRUE(nvme_->Find(Key(i))) << "the open conversation's " << i;
  for (uint64_t i = 4; i < 8; ++i) EXPECT_FALSE(nvme_->Find(Key(i))) << i;
  auto c = Counters();
  EXPECT_EQ(c["nvme.admission.admitted"], 4);
  EXPECT_EQ(c["nvme.admission.rejected_first_sighting"], 4);
}

TEST_F(EngineAdmissionTest, AClosedConversationsBlocksAreDroppedEvenIfReadOnce) {
  ASSERT_TRUE(Open(AdmissionPolicyId::kSecondHit).ok());
  const BlockKey chain[] = {Key(0), Key(1)};
  ASSERT_TRUE(engine_->Enqueue(1, kNs, 1, chain, 0, /*conversation=*/5).ok());
  ASSERT_TRUE(engine_->Dequeue(1, 1).ok());
  for (uint64_t i = 0; i < 8; ++i) Put(i);
  for (uint64_t i = 0; i < 8; ++i) Use(i);
  engine_->ConversationHint(5, false);
  for (uint64_t i = 8; i < 16; ++i) Put(i);
  engine_->WaitForIdle();
  EXPECT_FALSE(nvme_->Find(Key(0)));
  EXPECT_FALSE(nvme_->Find(Key(1)));
  for (uint64_t i = 2; i < 8; ++i) EXPECT_TRUE(nvme_->Find(Key(i))) << "read once: reused " << i;
  auto c = Counters();
  EXPECT_EQ(c["nvme.admission.rejected_closed_session"], 2);
  EXPECT_EQ(c["nvme.admission.admitted"], 6);
}

TEST_F(EngineAdmissionTest, ABlockWhoseParentIsHeldNowhereIsRefused) {
  ASSERT_TRUE(Open(AdmissionPolicyId::kSecondHit).ok());
  // Key(100) heads both chains but is never cached: 1 and 2 can never hit.
  // Key(3)'s parent, Key(4), is cached (and demoted before it).
  const BlockKey orphans[] = {Key(100), Key(1), Key(2)};
  const BlockKey held[] = {Key(4), Key(3)};
  ASSERT_TRUE(engine_->Enqueue(1, kNs, 1, orphans, 0, 0).ok());
  ASSERT_TRUE(engine_->Enqueue(1, kNs, 2, held, 0, 0).ok());
  for (uint64_t i = 1; i <= 4; ++i) Put(i);
  ExpectOnlyTheRootedChainDemoted();
}

// Prefix closure without queue hints (issue 12, item 4.4): a put that names
// its blocks as one chain (and the block before it) tells the engine their
// parents, so a block whose prefix is cached nowhere is refused.
TEST_F(EngineAdmissionTest, PutChainsGiveParentsWithoutQueueHints) {
  ASSERT_TRUE(Open(AdmissionPolicyId::kSecondHit).ok());
  // Chain A: 100 (never cached), 1, 2. Chain B: 4, 3 (4 is 3's parent).
  const BlockKey chain_a[] = {Key(1), Key(2)};
  const BlockKey chain_b[] = {Key(4), Key(3)};
  const uint64_t sizes[] = {kBlockBytes, kBlockBytes};
  using ChainPut = std::pair<std::span<const BlockKey>, std::optional<BlockKey>>;
  for (const auto& [keys, parent] : {ChainPut{chain_a, Key(100)}, ChainPut{chain_b, std::nullopt}}) {
    auto grants = engine_->Reserve(1, kNs, keys, sizes, ReserveChain{true, parent});
    for (size_t i = 0; i < 2; ++i) {
      ASSERT_TRUE(grants[i].status.ok()) << grants[i].status.ToString();
      ::kvtier::testing::FillBlockBytes(keys[i], 0,
                                        ::kvtier::testing::SlotBytes(*host_, grants[i].offset, grants[i].length));
    }
    for (const Status& s : engine_->Commit(1, kNs, keys, sizes)) ASSERT_TRUE(s.ok()) << s.ToString();
  }
  ExpectOnlyTheRootedChainDemoted();
}

TEST(LineageTest, LinksFromPutsKeepAQueueHintsConversation) {
  Lineage l(8);
  const BlockKey hinted[] = {Key(1), Key(2)};
  l.Record(hinted, /*conversation=*/7);
  const BlockKey put[] = {Key(2), Key(3)};
  l.RecordLinks(put, std::nullopt);
  EXPECT_EQ(*l.Find(Key(2))->parent, Key(1)) << "no parent given for the first key: left as it was";
  EXPECT_EQ(l.Find(Key(2))->conversation, 7u);
  EXPECT_EQ(*l.Find(Key(3))->parent, Key(2));
  l.RecordLinks(put, Key(9));
  EXPECT_EQ(*l.Find(Key(2))->parent, Key(9));
  EXPECT_EQ(l.Find(Key(2))->conversation, 7u);
  EXPECT_FALSE(l.Find(Key(9))) << "the parent itself is not recorded";
}

TEST_F(EngineAdmissionTest, AllDemotesEveryEviction) {
  ASSERT_TRUE(Open(AdmissionPolicyId::kAll).ok());
  for (uint64_t i = 0; i < 16; ++i) Put(i);
  engine_->WaitForIdle();
  auto c = Counters();
  EXPECT_EQ(c["engine.demotions"], 8);
  EXPECT_EQ(c["engine.admission_drops"], 0);
  EXPECT_EQ(c["nvme.admission.admitted"], 8);
}

DwpdOptions TinyBudget() {
  DwpdOptions o;
  o.drive_capacity_bytes = 864'000'000;  // R = 10 KB/s: a 68 KiB record per ~7 s
  o.bucket_bytes = 3 * kRecordBytes;
  return o;
}

TEST_F(EngineAdmissionTest, DwpdStopsDemotionsWhenTheBudgetIsSpentAndResumesAsItRefills) {
  ASSERT_TRUE(Open(AdmissionPolicyId::kDwpd, TinyBudget()).ok());
  for (uint64_t i = 0; i < 8; ++i) Put(i);
  for (uint64_t i = 0; i < 8; ++i) Use(i);
  for (uint64_t i = 8; i < 16; ++i) Put(i);  // evicts 0..7, all read once
  engine_->WaitForIdle();
  auto c = Counters();
  EXPECT_EQ(c["engine.demotions"], 3) << "the bucket holds three records";
  EXPECT_EQ(c["nvme.admission.rejected_no_budget"], 5);
  EXPECT_EQ(c["nvme.blocks"], 3);
  EXPECT_EQ(c["nvme.admission.budget_bytes_per_day"], 864'000'000);
  // The tier's device bytes reach the budget's books at the next decision.
  EXPECT_EQ(nvme_->write_totals().device_bytes, 3 * kRecordBytes);
  // Eight seconds refill one record's worth (10 KB/s): the next eviction
  // of a block that was read is demoted again.
  clock_.AdvanceUs(8'000'000);
  for (uint64_t i = 8; i < 16; ++i) Use(i);
  Put(16);  // evicts 8
  engine_->WaitForIdle();
  c = Counters();
  EXPECT_EQ(c["engine.demotions"], 4);
  EXPECT_EQ(c["nvme.admission.written_today_bytes"], int64_t(3 * kRecordBytes));
  EXPECT_TRUE(nvme_->Find(Key(8)));
}

// The budget's refusals reach `kvtier health` through the engine: each
// tier below is followed by its admission's findings.
TEST_F(EngineAdmissionTest, TheDwpdBudgetsRefusalsAreAWarningInTheEnginesHealth) {
  ASSERT_TRUE(Open(AdmissionPolicyId::kDwpd, TinyBudget()).ok());
  for (uint64_t i = 0; i < 8; ++i) Put(i);
  for (uint64_t i = 0; i < 8; ++i) Use(i);
  for (uint64_t i = 8; i < 16; ++i) Put(i);  // evicts 0..7, all read once: 3 fit the budget
  engine_->WaitForIdle();
  HealthFindings health;
  engine_->CheckHealth(health);
  EXPECT_TRUE(health.problems.empty());
  const std::string refused = "the DWPD budget refused 5 writes to NVMe (nvme.admission.rejected_no_budget)";
  EXPECT_NE(std::find(health.warnings.begin(), health.warnings.end(), refused), health.warnings.end())
      << ::testing::PrintToString(health.warnings);
}

TEST_F(EngineAdmissionTest, ABlockAlreadyOnNvmeCostsNoBudget) {
  DwpdOptions o = TinyBudget();
  o.bucket_bytes = 8 * kRecordBytes;
  ASSERT_TRUE(Open(AdmissionPolicyId::kDwpd, o).ok());
  for (uint64_t i = 0; i < 8; ++i) Put(i);
  Use(0);
  for (uint64_t i = 8; i < 16; ++i) Put(i);  // 1..7 dropped (never read), then 0 demoted
  engine_->WaitForIdle();
  ASSERT_TRUE(nvme_->Find(Key(0)));
  EXPECT_EQ(Counters()["nvme.admission.admitted"], 1);
  Use(0);                                     // promoted back into the host tier
  for (uint64_t i = 16; i < 25; ++i) Put(i);  // evicts it again
  engine_->WaitForIdle();
  auto c = Counters();
  EXPECT_EQ(c["nvme.admission.admitted"], 1) << "no second decision for a block the tier holds";
  EXPECT_EQ(nvme_->write_totals().device_bytes, kRecordBytes);
  const BlockKey key = Key(0);
  EXPECT_EQ(engine_->Lookup(kNs, {&key, 1}).tiers[0], Tier::kNvme);
}

// Demotions forced because a queued request needs the block count against
// the DWPD budget and stop at it: a fake day of evictions that are all
// needed soon, offering about 2.4 times the budget, writes no more than a
// day's budget plus one bucket.
TEST_F(EngineAdmissionTest, ForcedDemotionsStayWithinTheDailyBudget) {
  DwpdOptions o;
  o.drive_capacity_bytes = 86'400'000;  // R = 1 KB/s: 86.4 MB a day, ~1240 records
  o.bucket_bytes = 3 * kRecordBytes;
  ASSERT_TRUE(Open(AdmissionPolicyId::kDwpd, o, EvictionPolicyId::kQueueAware).ok());
  constexpr uint64_t kPuts = 3000;
  constexpr uint64_t kStepUs = DwpdBudget::kDayUs / kPuts;
  // Every cached block is needed within the window (a request each), the
  // oldest furthest off: it is the victim, a forced demotion, and then
  // leaves the queue.
  const auto need = [&](uint64_t block, uint64_t start_in_us) {
    const BlockKey key = Key(block);
    ASSERT_TRUE(engine_->Enqueue(9, kNs, block, {&key, 1}, start_in_us, 0).ok());
  };
  for (uint64_t i = 0; i < 8; ++i) {
    Put(i);
    need(i, 500'000);
  }
  for (uint64_t i = 8; i < kPuts; ++i) {
    clock_.AdvanceUs(kStepUs);
    need(i - 8, 1'500'000);
    Put(i);
    ASSERT_TRUE(engine_->Dequeue(9, i - 8).ok());
    need(i, 500'000);
  }
  engine_->WaitForIdle();
  auto c = Counters();
  const DwpdBudget reference(o, 0);
  const uint64_t written = nvme_->write_totals().device_bytes;
  EXPECT_LE(written, reference.budget_bytes_per_day() + reference.bucket_bytes());
  EXPECT_GE(written, reference.budget_bytes_per_day() / 2) << "the budget is used";
  EXPECT_EQ(c["engine.needed_evictions"], int64_t(kPuts - 8));
  EXPECT_GT(c["nvme.admission.forced"], 0);
  EXPECT_GT(c["nvme.admission.forced_refused"], 0);
  EXPECT_EQ(c["engine.forced_demotions"], c["nvme.admission.forced"]);
}

// (A bad policy name is the config's error: config_test's
// AdmissionAndDwpdOptions.)
TEST_F(EngineAdmissionTest, BadDwpdOptionsFailCreate) {
  DwpdOptions o;  // no drive capacity
  Status s = Open(AdmissionPolicyId::kDwpd, o);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("capacity"), std::string::npos) << s.message();
}

TEST(DwpdFromConfigTest, DriveIsTheFileSystemUnlessSet) {
  const std::string dir = ::kvtier::testing::MakeTempDir();
  auto config = ParseConfig("", "<test>");
  ASSERT_TRUE(config.ok());
  config->nvme_path = dir + "/tier.dat";  // need not exist yet
  config->nvme_dwpd = 0.5;
  config->nvme_dwpd_share = 0.2;
  auto o = DwpdFromConfig(*config);
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  struct statvfs fs {};
  ASSERT_EQ(::statvfs(dir.c_str(), &fs), 0);
  EXPECT_EQ(o->drive_capacity_bytes, uint64_t{fs.f_blocks} * fs.f_frsize);
  EXPECT_EQ(o->dwpd, 0.5);
  EXPECT_EQ(o->share, 0.2);
  EXPECT_EQ(o->warranty_years, 5.0);
  EXPECT_EQ(o->max_write_rate, 0.0);
  config->nvme_dwpd_drive_bytes = 1'000'000'000'000;
  o = DwpdFromConfig(*config);
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->drive_capacity_bytes, 1'000'000'000'000u);
  config->nvme_dwpd_drive_bytes = 0;
  config->nvme_path = "/nonexistent-kvtier-dir/sub/tier.dat";
  o = DwpdFromConfig(*config);
  EXPECT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("nvme.dwpd_drive_bytes"), std::string::npos) << o.status().message();
  ::kvtier::testing::RemoveTree(dir);
}

}  // namespace
}  // namespace kvtier

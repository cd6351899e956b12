// Tests of the StackReport (daemon/engine/stack_report.h) without an
// Engine: index shards over a test arena, MapTiers (and RecordingTiers)
// for the tiers, an AboveMover over a MapTier for the tier above, and the
// test's own hooks. The counters come out under their names and labels
// with their values, in the stack's order; the health findings come tier
// by tier, top first, each tier below followed by its admission, then the
// engine's; namespace use is listed per tier, its series capped with the
// rest under ns="other", and a tier that keeps namespace sums is asked
// for them rather than walked.
#include "daemon/engine/stack_report.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/retry_scheduler.h"
#include "daemon/engine/block_index.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/index_shards.h"
#include "tests/testing/map_tier.h"
#include "tests/testing/recording_tier.h"
#include "tests/testing/test_daemon.h"
#include "tiers/forwarding_tier.h"

namespace kvtier {
namespace {

using ::kvtier::testing::Capabilities;
using ::kvtier::testing::FakeClock;
using ::kvtier::testing::MapTier;
using ::kvtier::testing::RecordingTier;
using Series = std::vector<std::pair<std::string, int64_t>>;

constexpr uint64_t kBlockBytes = 4 << 10;
constexpr size_t kShards = 2;
constexpr ConnectionId kWriter = 7;
constexpr NamespaceFingerprint kNs{0x5eed, 0x1};
constexpr NamespaceFingerprint kOtherNs{0x5eed, 0x2};

BlockKey Key(uint64_t i) { return BlockKey{0x5eed, i}; }

// A tier that reports its own name in its health findings: a problem and
// a warning.
class NamedHealthTier final : public ForwardingTier {
 public:
  using ForwardingTier::ForwardingTier;
  void CheckHealth(HealthFindings& out) const override {
    out.AddProblem(std::string(name()) + " is failing");
    out.AddWarning(std::string(name()) + " wants a look");
  }
};

// What `visit` visits, in order.
template <typename Visit>
Series Collect(Visit visit) {
  CounterCollector c;
  visit(c);
  return c.counters();
}

// The value of `name` in `series` (-1 when absent).
int64_t ValueOf(const Series& series, const std::string& name) {
  for (const auto& [n, value] : series) {
    if (n == name) return value;
  }
  return -1;
}

// Where `part` starts as a run of `series` at or after `from` (npos: it
// is not there).
size_t RunAt(const Series& series, const Series& part, size_t from = 0) {
  if (part.empty()) return from;
  auto it = std::search(series.begin() + static_cast<std::ptrdiff_t>(std::min(from, series.size())), series.end(),
                        part.begin(), part.end());
  return it == series.end() ? std::string::npos : static_cast<size_t>(it - series.begin());
}

// The label of `ns`: the first 16 hex digits (its high half).
std::string NsLabel(const NamespaceFingerprint& ns) { return "ns=\"" + ns.ToHex().substr(0, 16) + "\""; }

class StackReportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    arena_ = ::kvtier::testing::OpenTestHostTier(16 * kBlockBytes);
    ASSERT_NE(arena_, nullptr);
    shards_ = ::kvtier::testing::MakeShards(*arena_, kShards);
  }
  void TearDown() override {
    report_.reset();
    above_.reset();
    retries_.Stop();
  }

  // Adds `tier` as the next level below the host, admitting by
  // `admission` (a DWPD budget: `dwpd`).
  TierLevel& AddLevel(BlockTier& tier, AdmissionPolicyId admission = AdmissionPolicyId::kAll,
                      const DwpdOptions& dwpd = {}) {
    auto level = std::make_unique<TierLevel>();
    level->tier = &tier;
    auto made = TierAdmission::Create(admission, dwpd, 0, tier, clock_);
    EXPECT_TRUE(made.ok()) << made.status().ToString();
    level->admission = std::move(made).value();
    below_.push_back(std::move(level));
    return *below_.back();
  }
  // Puts an AboveMover over `tier` above the host.
  AboveMover& AddAbove(BlockTier& tier) {
    AboveMover::Hooks hooks;
    hooks.io_started = [] {};
    hooks.io_finished = [] {};
    hooks.held_below = [](const BlockKey&, const NamespaceFingerprint&) { return false; };
    above_ = std::make_unique<AboveMover>(tier, host_face_, clock_, retries_, 16, std::move(hooks));
    return *above_;
  }
  StackReport& Make() {
    StackReport::Hooks hooks;
    hooks.layer_read_pool_bytes = [] { return int64_t{4096}; };
    hooks.holds_in_force = [] { return HoldTable::InForce{3, 3 * int64_t{kBlockBytes}}; };
    hooks.loads_open = [] { return int64_t{2}; };
    hooks.visit_movers = [this](CounterVisitor& v) {
      ++mover_visits_;
      v.Visit("test.movers.visited", mover_visits_);
    };
    report_ = std::make_unique<StackReport>(StackReport::Stack{above_.get(), host_face_, *arena_, below_}, shards_,
                                            counters_, namespaces_, std::move(hooks));
    return *report_;
  }

  BlockIndex& ShardOf(const BlockKey& key) { return *shards_[ShardIndexOf(key, kShards)]; }
  // Reserves `key` in its shard, and commits it unless `reserve_only`.
  void Put(const BlockKey& key, bool reserve_only = false) {
    BlockIndex& shard = ShardOf(key);
    MutexLock lock(shard.mu);
    ASSERT_TRUE(shard.Reserve(key, kNs, kBlockBytes, kWriter).ok());
    auto it = shard.index.find(key);
    Result<HostTier::Extent> extent = arena_->Allocate(kBlockBytes);
    ASSERT_TRUE(extent.ok());
    it->second.extent = *extent;
    it->second.allocated = true;
    if (!reserve_only) shard.CommitReserved(it, kWriter, 0xc0de0000 + key.lo, {}, next_handle_++, 1);
  }
  void Pin(const BlockKey& key) {
    BlockIndex& shard = ShardOf(key);
    MutexLock lock(shard.mu);
    ::kvtier::testing::PinCommitted(shard, kWriter, key, 2, false);
  }
  // Writes a block of `bytes` bytes of `ns` into `tier`.
  static void Store(BlockTier& tier, const NamespaceFingerprint& ns, const BlockKey& key, uint64_t bytes) {
    std::vector<std::byte> payload(bytes, std::byte{1});
    ASSERT_TRUE(tier.Write(ns, key, 1, payload, [](Status) {}).ok());
  }

  FakeClock clock_;
  RetryScheduler retries_{"test.retries", clock_, 16};
  std::unique_ptr<HostTier> arena_;
  std::vector<std::unique_ptr<BlockIndex>> shards_;
  MapTier host_face_{1 << 20, "host"};
  std::vector<std::unique_ptr<TierLevel>> below_;
  EngineCounters counters_;
  NamespaceRegistry namespaces_;
  std::unique_ptr<AboveMover> above_;
  std::unique_ptr<StackReport> report_;
  uint64_t next_handle_ = 1;
  int64_t mover_visits_ = 0;
};

TEST_F(StackReportTest, CountsTheShardsBlocksAndReportsEachEngineCounterUnderItsName) {
  Put(Key(1));
  Put(Key(2));
  Put(Key(3), /*reserve_only=*/true);
  Pin(Key(2));
  Bump(counters_.lookups, 5);
  Bump(counters_.corrupt_drops, 2);
  Bump(counters_.load_busy_retries, 9);
  Bump(counters_.holds_expired, 4);
  const Series s = Collect([&](CounterVisitor& v) { Make().VisitCounters(v); });
  ASSERT_FALSE(s.empty());
  EXPECT_EQ(s.front(), (std::pair<std::string, int64_t>{"engine.blocks", 2}));
  EXPECT_EQ(ValueOf(s, "engine.stored_bytes"), 2 * int64_t{kBlockBytes});
  EXPECT_EQ(ValueOf(s, "engine.pinned_blocks"), 1);
  EXPECT_EQ(ValueOf(s, "engine.reserved_blocks"), 1);
  EXPECT_EQ(ValueOf(s, "engine.promoting_blocks"), 0);
  EXPECT_EQ(ValueOf(s, "engine.leases"), 1);
  EXPECT_EQ(ValueOf(s, "engine.lookups"), 5);
  EXPECT_EQ(ValueOf(s, "engine.corrupt_drops"), 2);
  EXPECT_EQ(ValueOf(s, "engine.load_busy_retries"), 9);
  EXPECT_EQ(ValueOf(s, "engine.holds_expired"), 4);
  EXPECT_EQ(ValueOf(s, "engine.pins"), 0);
  // The hooks' gauges.
  EXPECT_EQ(ValueOf(s, "engine.layer_read_pool_bytes"), 4096);
  EXPECT_EQ(ValueOf(s, "engine.holds"), 3);
  EXPECT_EQ(ValueOf(s, "engine.held_bytes"), 3 * int64_t{kBlockBytes});
  EXPECT_EQ(ValueOf(s, "engine.loads_open"), 2);
  EXPECT_EQ(mover_visits_, 1);
  // Each name once.
  std::vector<std::string> names;
  for (const auto& [name, value] : s) names.push_back(name);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(std::adjacent_find(names.begin(), names.end()), names.end());
}

TEST_F(StackReportTest, VisitsEachPartOfTheStackInTheStacksOrder) {
  MapTier hbm(1 << 20, "hbm"), nvme(1 << 20, "nvme"), remote(1 << 20, "remote");
  AddAbove(hbm);
  AddLevel(nvme);
  AddLevel(remote);
  Store(nvme, kNs, Key(1), kBlockBytes);
  Bump(below_[1]->demotions_in, 6);
  Bump(below_[0]->demotion_drops, 1);
  const Series s = Collect([&](CounterVisitor& v) { Make().VisitCounters(v); });
  // Each part's own series, as a run, in this order.
  const std::vector<std::pair<std::string, Series>> parts = {
      {"tier families", {{"tier.hits{tier=\"hbm\"}", 0}}},
      {"movers", {{"test.movers.visited", 1}}},
      {"host face", Collect([&](CounterVisitor& v) { host_face_.VisitCounters(v); })},
      {"engine.<tier>_*",
       {{"engine.nvme_read_bytes_per_s", 1'000'000'000},
        {"engine.nvme_lookup_hits", 0},
        {"engine.nvme_demotions_in", 0},
        {"engine.nvme_evictions_dropped", 1},
        {"engine.remote_read_bytes_per_s", 1'000'000'000},
        {"engine.remote_lookup_hits", 0},
        {"engine.remote_demotions_in", 6},
        {"engine.remote_evictions_dropped", 0}}},
      {"above mover", Collect([&](CounterVisitor& v) { above_->VisitCounters(v); })},
      {"tier above", Collect([&](CounterVisitor& v) { hbm.VisitCounters(v); })},
      {"arena", Collect([&](CounterVisitor& v) { arena_->VisitCounters(v); })},
      {"nvme", Collect([&](CounterVisitor& v) { nvme.VisitCounters(v); })},
      {"nvme admission", Collect([&](CounterVisitor& v) { below_[0]->admission->VisitCounters(v); })},
      {"remote", Collect([&](CounterVisitor& v) { remote.VisitCounters(v); })},
      {"remote admission", Collect([&](CounterVisitor& v) { below_[1]->admission->VisitCounters(v); })},
      {"namespace use",
       {{"namespace.bytes{" + NsLabel(kNs) + ",tier=\"hbm\"}", 0},
        {"namespace.bytes{" + NsLabel(kNs) + ",tier=\"host\"}", 0},
        {"namespace.bytes{" + NsLabel(kNs) + ",tier=\"nvme\"}", int64_t{kBlockBytes}},
        {"namespace.bytes{" + NsLabel(kNs) + ",tier=\"remote\"}", 0}}},
  };
  const size_t engine_counters = RunAt(s, {{"engine.lookups", 0}});
  ASSERT_NE(engine_counters, std::string::npos);
  size_t at = engine_counters;
  for (const auto& [what, part] : parts) {
    const size_t found = RunAt(s, part, at);
    ASSERT_NE(found, std::string::npos) << what << " is not where it should be";
    at = found + part.size();
  }
  EXPECT_EQ(at, s.size()) << "namespace use comes last";
}

TEST_F(StackReportTest, CountsAKeyAsAMissInEveryTierAboveTheOneThatHeldIt) {
  MapTier hbm(1 << 20, "hbm"), nvme(1 << 20, "nvme");
  AboveMover& above = AddAbove(hbm);
  AddLevel(nvme);
  Bump(above.source().lookup_hits, 2);
  Bump(counters_.host_lookup_hits, 3);
  Bump(below_[0]->lookup_hits, 4);
  Bump(counters_.lookup_misses, 1);
  Bump(counters_.host_committed_bytes, 100);
  Bump(counters_.host_pinned_bytes, 50);
  Bump(counters_.evictions, 7);
  Bump(counters_.erases, 8);
  Store(host_face_, kNs, Key(1), kBlockBytes);
  const Series s = Collect([&](CounterVisitor& v) { Make().VisitCounters(v); });
  const size_t first = RunAt(s, {{"tier.hits{tier=\"hbm\"}", 2}});
  ASSERT_NE(first, std::string::npos);
  const Series want = {
      {"tier.hits{tier=\"hbm\"}", 2},
      {"tier.misses{tier=\"hbm\"}", 8},  // held below it (3 + 4) or nowhere (1)
      {"tier.hits{tier=\"host\"}", 3},
      {"tier.misses{tier=\"host\"}", 5},
      {"tier.hits{tier=\"nvme\"}", 4},
      {"tier.misses{tier=\"nvme\"}", 1},
      {"tier.capacity_bytes{tier=\"host\"}", 1 << 20},
      {"tier.used_bytes{tier=\"host\"}", int64_t{kBlockBytes}},
      {"tier.read_bytes{tier=\"host\"}", 50},
      {"tier.written_bytes{tier=\"host\"}", 100},
      {"tier.evictions{tier=\"host\",reason=\"capacity\"}", 7},
      {"tier.evictions{tier=\"host\",reason=\"erased\"}", 8},
      {"tier.evictions{tier=\"hbm\",reason=\"capacity\"}", 0},
  };
  EXPECT_EQ(RunAt(s, want), first);
}

TEST_F(StackReportTest, HealthIsEachTierTopFirstEachAdmissionAfterItsTierThenTheEngines) {
  MapTier hbm_map(1 << 20, "hbm"), host_map(1 << 20, "host"), nvme_map(1 << 20, "nvme"), remote_map(1 << 20, "remote");
  NamedHealthTier hbm(hbm_map), nvme(nvme_map), remote(remote_map);
  AddAbove(hbm);
  DwpdOptions tiny;
  tiny.drive_capacity_bytes = 864'000'000;
  tiny.bucket_bytes = kBlockBytes;
  AddLevel(nvme, AdmissionPolicyId::kDwpd, tiny);
  AddLevel(remote);
  ASSERT_FALSE(below_[0]->admission->Admit(4 * kBlockBytes, TierAdmission::Facts{.uses = 8}))
      << "larger than the budget's bucket";
  Bump(counters_.promotion_failures, 2);
  StackReport& report = Make();
  HealthFindings health;
  report.CheckHealth(health);
  EXPECT_EQ(health.problems, (std::vector<std::string>{"hbm is failing", "nvme is failing", "remote is failing"}));
  EXPECT_EQ(health.warnings,
            (std::vector<std::string>{"hbm wants a look", "nvme wants a look",
                                      "the DWPD budget refused 1 writes to NVMe (nvme.admission.rejected_no_budget)",
                                      "remote wants a look", "engine.promotion_failures = 2 (see the log)"}));
  Bump(counters_.demotion_failures, 1);
  HealthFindings again;
  report.CheckHealth(again);
  EXPECT_EQ(again.warnings.back(), "engine.demotion_failures = 1 (see the log)");
}

TEST_F(StackReportTest, AStackWithNothingWrongReportsNothing) {
  MapTier nvme(1 << 20, "nvme");
  AddLevel(nvme);
  HealthFindings health;
  Make().CheckHealth(health);
  EXPECT_TRUE(health.problems.empty());
  EXPECT_TRUE(health.warnings.empty());
}

TEST_F(StackReportTest, NamesTheStackTopFirst) {
  MapTier hbm(1 << 20, "hbm"), nvme(1 << 20, "nvme");
  EXPECT_EQ(Make().TierNames(), (std::vector<std::string>{"host"}));
  AddAbove(hbm);
  AddLevel(nvme);
  StackReport& report = Make();
  EXPECT_EQ(report.TierNames(), (std::vector<std::string>{"hbm", "host", "nvme"}));
  const std::vector<const BlockTier*> top = report.StackTop();
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[1], &host_face_);
  EXPECT_EQ(top[2], below_[0]->tier);
}

TEST_F(StackReportTest, ListsEachNamespacesBlocksAndBytesPerTierWithWhatItIs) {
  MapTier nvme(1 << 20, "nvme");
  AddLevel(nvme);
  Store(host_face_, kNs, Key(1), kBlockBytes);
  Store(nvme, kNs, Key(1), kBlockBytes);
  Store(nvme, kNs, Key(2), 2 * kBlockBytes);
  Store(nvme, kOtherNs, Key(3), kBlockBytes);
  const NamespaceFingerprint registered{0x5eed, 0x3};
  NamespaceDescriptor d;
  d.model_id = "m";
  d.model_revision = "r1";
  d.layer_count = 1;
  namespaces_.Keep(registered, d);
  const std::vector<EngineNamespaceUse> uses = Make().NamespaceUses();
  ASSERT_EQ(uses.size(), 3u);
  EXPECT_EQ(uses[0].ns, kNs);
  EXPECT_FALSE(uses[0].descriptor.has_value());
  ASSERT_EQ(uses[0].tiers.size(), 2u);
  EXPECT_EQ(uses[0].tiers[0].tier, "host");
  EXPECT_EQ(uses[0].tiers[0].blocks, 1u);
  EXPECT_EQ(uses[0].tiers[0].bytes, kBlockBytes);
  EXPECT_EQ(uses[0].tiers[1].tier, "nvme");
  EXPECT_EQ(uses[0].tiers[1].blocks, 2u);
  EXPECT_EQ(uses[0].tiers[1].bytes, 3 * kBlockBytes);
  EXPECT_EQ(uses[1].ns, kOtherNs);
  EXPECT_EQ(uses[1].tiers[1].blocks, 1u);
  EXPECT_EQ(uses[2].ns, registered) << "registered since start, with no block";
  ASSERT_TRUE(uses[2].descriptor.has_value());
  EXPECT_EQ(uses[2].descriptor->model_revision, "r1");
  EXPECT_EQ(uses[2].tiers[0].blocks + uses[2].tiers[1].blocks, 0u);
}

TEST_F(StackReportTest, NamespaceSeriesAreTheLargestWithTheRestSummedUnderOther) {
  const size_t count = StackReport::kMaxNamespaceSeries + 2;
  for (uint64_t i = 0; i < count; ++i) Store(host_face_, NamespaceFingerprint{0xa00 + i, 0xa}, Key(i), (i + 1) * 16);
  NamespaceDescriptor d;
  d.model_id = "org/\"quoted\"";
  d.model_revision = "r2";
  d.adapter_id = "a";
  d.layer_count = 1;
  const NamespaceFingerprint largest{0xa00 + count - 1, 0xa};
  namespaces_.Keep(largest, d);
  const Series s = Collect([&](CounterVisitor& v) { Make().VisitNamespaceUse(v); });
  ASSERT_EQ(s.size(), StackReport::kMaxNamespaceSeries + 1);
  EXPECT_EQ(s.front(), (std::pair<std::string, int64_t>{
                           "namespace.bytes{" + NsLabel(largest) +
                               ",model=\"org/\\\"quoted\\\"\",revision=\"r2\",adapter=\"a\",tier=\"host\"}",
                           int64_t(count * 16)}))
      << "the largest first, with what it is";
  EXPECT_EQ(s.back(), (std::pair<std::string, int64_t>{"namespace.bytes{ns=\"other\",tier=\"host\"}", 16 + 32}))
      << "the two smallest";
  EXPECT_EQ(ValueOf(s, "namespace.bytes{" + NsLabel(NamespaceFingerprint{0xa01, 0xa}) + ",tier=\"host\"}"), -1);
  EXPECT_EQ(ValueOf(s, "namespace.bytes{" + NsLabel(NamespaceFingerprint{0xa02, 0xa}) + ",tier=\"host\"}"), 48);
}

TEST_F(StackReportTest, NoOtherSeriesWhileTheNamespacesFit) {
  Store(host_face_, kNs, Key(1), kBlockBytes);
  const Series s = Collect([&](CounterVisitor& v) { Make().VisitNamespaceUse(v); });
  EXPECT_EQ(s, (Series{{"namespace.bytes{" + NsLabel(kNs) + ",tier=\"host\"}", int64_t{kBlockBytes}}}));
}

TEST_F(StackReportTest, ATierThatKeepsNamespaceSumsIsAskedForThemNotWalked) {
  RecordingTier sums(Capabilities{.namespace_sums = true});
  RecordingTier walked(Capabilities{});
  AddLevel(sums);
  AddLevel(walked);
  const Series s = Collect([&](CounterVisitor& v) { Make().VisitNamespaceUse(v); });
  EXPECT_EQ(sums.calls.count("ForEachNamespaceBytes"), 1u);
  EXPECT_EQ(sums.calls.count("ForEachBlock"), 0u) << "O(namespaces), not O(blocks)";
  EXPECT_EQ(walked.calls.count("ForEachBlock"), 1u) << "a tier without sums is walked";
  const std::string ns = NsLabel(NamespaceFingerprint{1, 2});
  EXPECT_EQ(s, (Series{{"namespace.bytes{" + ns + ",tier=\"host\"}", 0},
                       {"namespace.bytes{" + ns + ",tier=\"recording\"}", 42},
                       {"namespace.bytes{" + ns + ",tier=\"recording\"}", 0}}));
}

}  // namespace
}  // namespace kvtier

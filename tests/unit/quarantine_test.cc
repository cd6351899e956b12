// Quarantine (daemon/engine/quarantine.h): a copy that failed verification
// is never served again from its tier, until the key is written there
// again; `kvtier health` (Engine::CheckHealth) names the keys. The set is
// bounded: the oldest key goes past it (counted).
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/health_findings.h"
#include "daemon/engine/engine.h"
#include "daemon/engine/measured_tier.h"
#include "daemon/engine/quarantine.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/map_tier.h"
#include "tests/testing/test_daemon.h"
#include "tiers/forwarding_tier.h"

namespace kvtier {
namespace {

using ::kvtier::testing::MapTier;

constexpr uint32_t kLayers = 4;
constexpr uint64_t kBlockBytes = kLayers * (4 << 10);
constexpr NamespaceFingerprint kNs{0x9a2, 0x9a3};
constexpr ConnectionId kConn = 3;

BlockKey Key(uint64_t i) { return BlockKey{0x9a2, i}; }

TEST(QuarantineTest, HoldsKeysUntilReleasedAndListsTheNewestFirst) {
  Quarantine q;
  EXPECT_FALSE(q.Contains(Key(1)));
  q.Add(Key(1));
  q.Add(Key(2));
  q.Add(Key(1));  // again: still one entry
  EXPECT_EQ(q.size(), 2u);
  EXPECT_TRUE(q.Contains(Key(1)));
  EXPECT_EQ(q.Newest(8), (std::vector<BlockKey>{Key(2), Key(1)}));
  EXPECT_TRUE(q.Release(Key(1)));
  EXPECT_FALSE(q.Release(Key(1)));
  EXPECT_FALSE(q.Contains(Key(1)));
  EXPECT_EQ(q.Newest(8), (std::vector<BlockKey>{Key(2)}));
}

TEST(QuarantineTest, PastItsBoundTheOldestKeyGoesAndIsCounted) {
  Quarantine q(3);
  for (uint64_t i = 0; i < 5; ++i) q.Add(Key(i));
  EXPECT_EQ(q.size(), 3u);
  EXPECT_FALSE(q.Contains(Key(0)));
  EXPECT_FALSE(q.Contains(Key(1)));
  EXPECT_TRUE(q.Contains(Key(4)));
  // A key added past the bound pushes the oldest out even if it is
  // released right after; released keys leave no trace behind.
  for (uint64_t i = 10; i < 100; ++i) {
    q.Add(Key(i));
    q.Release(Key(i));
  }
  EXPECT_EQ(q.size(), 2u);
  EXPECT_FALSE(q.Contains(Key(2)));
  EXPECT_TRUE(q.Contains(Key(3)));
  EXPECT_EQ(q.Newest(8), (std::vector<BlockKey>{Key(4), Key(3)}));
  std::map<std::string, int64_t> counters;
  struct Into final : CounterVisitor {
    std::map<std::string, int64_t>* out;
    void Visit(std::string_view name, int64_t value) override { (*out)[std::string(name)] = value; }
  } into;
  into.out = &counters;
  q.VisitCounters(into, "{tier=\"x\"}");
  EXPECT_EQ(counters["tier.quarantined{tier=\"x\"}"], 2);
  EXPECT_EQ(counters["tier.quarantine_added{tier=\"x\"}"], 95);
  EXPECT_EQ(counters["tier.quarantine_released{tier=\"x\"}"], 90);
  EXPECT_EQ(counters["tier.quarantine_overflows{tier=\"x\"}"], 3);
}

TEST(QuarantineTest, WithALifetimeAKeyLeavesThatLongAfterItCameIn) {
  uint64_t now = 1'000;
  Quarantine q(Quarantine::kMaxKeys, 500, [&now] { return now; });
  q.Add(Key(1));
  now = 1'300;
  q.Add(Key(2));
  EXPECT_TRUE(q.Contains(Key(1)));
  now = 1'500;  // Key(1)'s lifetime is over
  EXPECT_FALSE(q.Contains(Key(1)));
  EXPECT_TRUE(q.Contains(Key(2)));
  EXPECT_EQ(q.Newest(8), (std::vector<BlockKey>{Key(2)}));
  now = 1'900;
  q.Add(Key(3));  // drops the expired ones
  EXPECT_EQ(q.size(), 1u);
}

// A read that failed verification quarantines its key unless a write of
// the key landed after the read started (the failure was the copy the
// write replaced); past kWriteLog writes it cannot tell and leaves the key
// out.
TEST(QuarantineTest, AReadThatStartedBeforeAWriteOfItsKeyDoesNotQuarantineIt) {
  Quarantine q;
  const uint64_t before = q.WriteSequence();
  q.NoteWritten(Key(1));
  q.NoteWritten(Key(9));
  EXPECT_FALSE(q.AddUnlessWrittenSince(Key(1), before));
  EXPECT_FALSE(q.Contains(Key(1)));
  EXPECT_TRUE(q.AddUnlessWrittenSince(Key(2), before));
  EXPECT_TRUE(q.Contains(Key(2)));
  EXPECT_TRUE(q.AddUnlessWrittenSince(Key(1), q.WriteSequence()));  // a read after the write
  q.NoteWritten(Key(1));
  EXPECT_FALSE(q.Contains(Key(1)));  // released
  const uint64_t long_ago = q.WriteSequence();
  for (uint64_t i = 0; i <= Quarantine::kWriteLog; ++i) q.NoteWritten(Key(1000 + i));
  EXPECT_FALSE(q.AddUnlessWrittenSince(Key(3), long_ago));
  EXPECT_FALSE(q.Contains(Key(3)));
}

// A tier whose reads end when the test says, for the order of a read and a
// write of the same key.
class HeldReadTier final : public ForwardingTier {
 public:
  using ForwardingTier::ForwardingTier;
  Status Read(const BlockKey&, uint32_t, uint32_t, std::span<std::byte>, ReadDone done) override {
    held_.push_back(std::move(done));
    return Status::Ok();
  }
  // Ends held read `i` as a failed verification.
  void FailCorrupt(size_t i) { held_.at(i)(Corruption("scripted: bad bytes")); }

 private:
  std::vector<ReadDone> held_;
};

// Two reads of one bad copy: the first fails and quarantines it; a write
// replaces it (the tier's fresh copy is found again); the second, which
// started before the write and fails after it, leaves the fresh copy be.
TEST(QuarantineTest, ALateReadOfABadCopyDoesNotQuarantineTheFreshOne) {
  MapTier inner;
  HeldReadTier held(inner);
  MeasuredTier tier(held);
  std::vector<std::byte> payload(kBlockBytes, std::byte{7});
  const auto write = [&] {
    std::promise<Status> written;
    EXPECT_TRUE(tier.Write(kNs, Key(1), kLayers, payload, [&](Status s) { written.set_value(s); }).ok());
    EXPECT_TRUE(written.get_future().get().ok());
  };
  write();
  std::vector<std::byte> dst(kBlockBytes);
  ASSERT_TRUE(tier.Read(Key(1), 0, kLayers, dst, [](Result<size_t>) {}).ok());
  ASSERT_TRUE(tier.Read(Key(1), 0, kLayers, dst, [](Result<size_t>) {}).ok());
  held.FailCorrupt(0);
  EXPECT_FALSE(tier.Find(Key(1)).has_value());  // quarantined
  write();                                      // replaces the bad copy
  EXPECT_TRUE(tier.Find(Key(1)).has_value());
  held.FailCorrupt(1);  // the late read of the old copy
  EXPECT_TRUE(tier.Find(Key(1)).has_value());
  EXPECT_EQ(tier.quarantine().size(), 0u);
}

// A tier whose stored copies can rot: reads of a rotten key fail
// Corruption while the tier goes on saying it holds it (as a remote or a
// peer's copy can), and it counts the reads that reached it.
class RottingTier final : public ForwardingTier {
 public:
  using ForwardingTier::ForwardingTier;
  void Rot(const BlockKey& key) {
    MutexLock lock(mu_);
    rotten_.insert(key);
  }
  int64_t reads() const { return reads_.load(); }
  Status Read(const BlockKey& key, uint32_t first_layer, uint32_t last_layer, std::span<std::byte> dst,
              ReadDone done) override {
    reads_.fetch_add(1);
    if (IsRotten(key)) {
      done(Corruption("scripted: rotten"));
      return Status::Ok();
    }
    return ForwardingTier::Read(key, first_layer, last_layer, dst, std::move(done));
  }
  Status ReadWithLayerChecksums(const BlockKey& key, uint32_t first_layer, uint32_t last_layer,
                                std::span<std::byte> dst, LayerReadDone done) override {
    reads_.fetch_add(1);
    if (IsRotten(key)) {
      done(Corruption("scripted: rotten"));
      return Status::Ok();
    }
    return ForwardingTier::ReadWithLayerChecksums(key, first_layer, last_layer, dst, std::move(done));
  }
  Status Erase(const BlockKey& key) override {
    {
      MutexLock lock(mu_);
      rotten_.erase(key);
    }
    return ForwardingTier::Erase(key);
  }

 private:
  bool IsRotten(const BlockKey& key) {
    MutexLock lock(mu_);
    return rotten_.contains(key);
  }
  Mutex mu_;
  std::set<BlockKey> rotten_ GUARDED_BY(mu_);
  std::atomic<int64_t> reads_{0};
};

class EngineQuarantineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    host_ = ::kvtier::testing::OpenTestHostTier(64 * kBlockBytes);
    ASSERT_NE(host_, nullptr);
    std::vector<LowerTier> stack{LowerTier{&below_, AdmissionPolicyId::kAll, {}, 0, Tier::kRemote}};
    auto engine = Engine::Create(EngineOptions{4, EvictionPolicyId::kLru}, *host_, clock_, std::move(stack));
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    engine_ = std::move(*engine);
    engine_->RegisterNamespace(kNs, NamespaceLayout{kLayers, kBlockBytes});
  }
  void TearDown() override {
    engine_.reset();
    map_.WaitForCompletions();
  }
  void StoreBelow(const BlockKey& key) {
    const std::vector<std::byte> bytes = ::kvtier::testing::Block(key, kBlockBytes);
    ASSERT_TRUE(map_.Write(
                        kNs, key, kLayers, bytes, [](Status) {}, std::nullopt)
                    .ok());
    map_.WaitForCompletions();
  }
  int64_t Counter(const std::string& name) { return ::kvtier::testing::EngineCounters(*engine_)[name]; }
  std::string Health() {
    HealthFindings findings;
    engine_->CheckHealth(findings);
    std::string all;
    for (const std::string& w : findings.warnings) all += w + "\n";
    return all;
  }

  ::kvtier::testing::FakeClock clock_;
  MapTier map_;
  RottingTier below_{map_};
  std::unique_ptr<HostTier> host_;
  std::unique_ptr<Engine> engine_;
};

TEST_F(EngineQuarantineTest, ACopyThatFailedVerificationIsNeverReadAgainUntilWrittenAgain) {
  const BlockKey key = Key(1);
  StoreBelow(key);
  EXPECT_EQ(::kvtier::testing::LookupTier(*engine_, kNs, key), Tier::kRemote);
  below_.Rot(key);
  auto failed = engine_->Pin(kConn, kNs, {&key, 1});
  EXPECT_FALSE(failed[0].status.ok());
  engine_->WaitForIdle();
  const int64_t reads = below_.reads();
  EXPECT_EQ(reads, 1);
  // The tier still says it holds the key; the engine no longer believes it.
  EXPECT_TRUE(map_.Find(key).has_value());
  EXPECT_EQ(engine_->Lookup(kNs, {&key, 1}).prefix_blocks, 0u);
  EXPECT_EQ(engine_->Pin(kConn, kNs, {&key, 1})[0].status.code(), StatusCode::kNotFound);
  engine_->WaitForIdle();
  EXPECT_EQ(below_.reads(), reads) << "a quarantined copy is never read again";
  EXPECT_EQ(Counter("tier.quarantined{tier=\"maptier\"}"), 1);
  const std::string health = Health();
  EXPECT_NE(health.find("quarantined"), std::string::npos) << health;
  EXPECT_NE(health.find("1 in remote (" + key.ToHex() + ")"), std::string::npos) << health;
  // An erase reaches the hidden copy too.
  EXPECT_EQ(engine_->Erase(kNs, {&key, 1}), 1u);
  EXPECT_FALSE(map_.Find(key).has_value());
  // Put again: a host hit (a new copy, nothing to do with the bad one).
  ASSERT_TRUE(::kvtier::testing::PutFilledBlock(*engine_, *host_, kConn, kNs, key, kBlockBytes).ok());
  EXPECT_EQ(::kvtier::testing::LookupTier(*engine_, kNs, key), Tier::kHost);
  // Evicted from the host, it is written to the tier below through the
  // engine: the write replaces the bad copy there and ends its quarantine.
  for (uint64_t i = 100; i < 400; ++i) {
    ASSERT_TRUE(::kvtier::testing::PutFilledBlock(*engine_, *host_, kConn, kNs, Key(i), kBlockBytes).ok()) << i;
  }
  engine_->WaitForIdle();
  map_.WaitForCompletions();
  EXPECT_EQ(Counter("tier.quarantined{tier=\"maptier\"}"), 0);
  EXPECT_EQ(Counter("tier.quarantine_released{tier=\"maptier\"}"), 1);
  ASSERT_EQ(::kvtier::testing::LookupTier(*engine_, kNs, key), Tier::kRemote);
  auto grants = engine_->Pin(kConn, kNs, {&key, 1});
  ASSERT_TRUE(grants[0].status.ok()) << grants[0].status.ToString();
  EXPECT_TRUE(::kvtier::testing::CheckBlockBytes(
      key, 0, ::kvtier::testing::SlotBytes(*host_, grants[0].offset, grants[0].length)));
  engine_->Release(kConn, {&grants[0].lease, 1});
  EXPECT_EQ(Health().find("quarantined"), std::string::npos) << Health();
}

// A host block a client's verified read found bad, and the daemon's own
// check confirmed, is dropped and listed until a client puts it again.
TEST_F(EngineQuarantineTest, AHostBlockFoundCorruptIsListedUntilPutAgain) {
  const BlockKey key = Key(7);
  ASSERT_TRUE(::kvtier::testing::PutFilledBlock(*engine_, *host_, kConn, kNs, key, kBlockBytes).ok());
  auto grants = engine_->Pin(kConn, kNs, {&key, 1});
  ASSERT_TRUE(grants[0].status.ok());
  ::kvtier::testing::SlotBytes(*host_, grants[0].offset, grants[0].length)[100] ^= std::byte{1};  // bit rot
  engine_->Release(kConn, {&grants[0].lease, 1});
  std::promise<Result<size_t>> checked;
  engine_->CheckReportedCorrupt(kNs, {&key, 1}, [&checked](Result<size_t> dropped) { checked.set_value(dropped); });
  Result<size_t> dropped = checked.get_future().get();
  ASSERT_TRUE(dropped.ok()) << dropped.status().ToString();
  EXPECT_EQ(*dropped, 1u);
  EXPECT_EQ(Counter("tier.quarantined{tier=\"host\"}"), 1);
  EXPECT_NE(Health().find("1 in host (" + key.ToHex() + ")"), std::string::npos) << Health();
  ASSERT_TRUE(::kvtier::testing::PutFilledBlock(*engine_, *host_, kConn, kNs, key, kBlockBytes).ok());
  EXPECT_EQ(Counter("tier.quarantined{tier=\"host\"}"), 0);
  EXPECT_EQ(Health().find("quarantined"), std::string::npos) << Health();
}

}  // namespace
}  // namespace kvtier

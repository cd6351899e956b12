// IndexRebuilder (subscriber/event_index.h), `kvtier events --rebuild`'s
// index, over a fake replay socket: a snapshot then the stream after its
// S, batches the snapshot has skipped, a gap replayed, a gap the buffer no
// longer has refused, numbers that go back answered with a new snapshot,
// removals and clears applied, a payload that does not decode refused.
#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "daemon/events/event_encoding.h"
#include "subscriber/event_index.h"

namespace kvtier::tools {
using events::EventRequests;
using events::IndexRebuilder;
using events::SeqPayload;

namespace {

const NamespaceFingerprint kNs{7, 7};

std::string Batch(std::vector<BlockEvent> events) { return EncodeEventBatch(1.0, events, EventFormat::kMap, nullptr); }
std::string Stored(Tier tier, uint64_t key) {
  return Batch({BlockEvent{BlockEventKind::kStored, tier, kNs, BlockKey{0, key}, std::nullopt}});
}
std::string Removed(Tier tier, uint64_t key) {
  return Batch({BlockEvent{BlockEventKind::kRemoved, tier, kNs, BlockKey{0, key}, std::nullopt}});
}

class FakeRequests final : public EventRequests {
 public:
  Result<std::vector<SeqPayload>> Replay(uint64_t start) override {
    replays.push_back(start);
    std::vector<SeqPayload> out;
    for (const auto& [seq, payload] : kept) {
      if (seq >= static_cast<int64_t>(start)) out.push_back({seq, payload});
    }
    return out;
  }
  Result<std::vector<SeqPayload>> Snapshot() override {
    ++snapshots;
    return snapshot;
  }
  std::vector<SeqPayload> snapshot;
  std::map<int64_t, std::string> kept;
  std::vector<uint64_t> replays;
  int snapshots = 0;
};

std::vector<std::tuple<Tier, uint64_t>> Keys(const IndexRebuilder& index) {
  std::vector<std::tuple<Tier, uint64_t>> out;
  for (const HeldBlockInfo& b : index.Blocks()) {
    EXPECT_EQ(b.ns, kNs);
    out.emplace_back(b.tier, b.key.lo);
  }
  return out;
}

TEST(IndexRebuilder, AppliesTheStreamAfterTheSnapshotAndReplaysAGap) {
  FakeRequests fake;
  fake.snapshot = {{5, Stored(Tier::kHost, 1)}, {5, Stored(Tier::kNvme, 2)}};
  IndexRebuilder index(fake);
  ASSERT_TRUE(index.Resync().ok());
  for (int64_t seq : {3, 4, 5}) {  // the snapshot has them
    auto applied = index.OnStream({seq, Stored(Tier::kHost, 100 + seq)});
    ASSERT_TRUE(applied.ok()) << applied.status().ToString();
    EXPECT_EQ(*applied, 0u);
  }
  auto applied = index.OnStream({6, Removed(Tier::kHost, 1)});
  ASSERT_TRUE(applied.ok());
  EXPECT_EQ(*applied, 1u);
  fake.kept = {{7, Stored(Tier::kHost, 3)}, {8, Stored(Tier::kHost, 4)}, {9, Stored(Tier::kHost, 5)}};
  ASSERT_TRUE(index.OnStream({9, Stored(Tier::kHost, 5)}).ok());  // 7 and 8 lost: replayed
  EXPECT_EQ(fake.replays, (std::vector<uint64_t>{7}));
  EXPECT_EQ(Keys(index), (std::vector<std::tuple<Tier, uint64_t>>{
                             {Tier::kHost, 3}, {Tier::kHost, 4}, {Tier::kHost, 5}, {Tier::kNvme, 2}}));
  ASSERT_TRUE(index.OnStream({10, Batch({BlockEvent{BlockEventKind::kCleared, Tier::kNone, {}, {}, {}}})}).ok());
  EXPECT_TRUE(index.Blocks().empty());
  EXPECT_EQ(index.restarts(), 0);
}

TEST(IndexRebuilder, AGapTheBufferNoLongerHasIsAnError) {
  FakeRequests fake;
  fake.snapshot = {{2, Stored(Tier::kHost, 1)}};
  IndexRebuilder index(fake);
  ASSERT_TRUE(index.Resync().ok());
  fake.kept = {{5, Stored(Tier::kHost, 5)}, {6, Stored(Tier::kHost, 6)}};  // 3 and 4 are gone
  auto applied = index.OnStream({6, Stored(Tier::kHost, 6)});
  ASSERT_FALSE(applied.ok());
  EXPECT_EQ(applied.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(applied.status().message().find("batches 3 to 5"), std::string::npos) << applied.status().message();
}

TEST(IndexRebuilder, NumbersThatGoBackMeanANewSnapshot) {
  FakeRequests fake;
  fake.snapshot = {{4, Stored(Tier::kHost, 1)}};
  IndexRebuilder index(fake);
  ASSERT_TRUE(index.Resync().ok());
  ASSERT_TRUE(index.OnStream({5, Stored(Tier::kHost, 2)}).ok());
  // Another run: its snapshot (the NVMe tier's blocks came back) includes up to its batch 1.
  fake.snapshot = {{1, Stored(Tier::kNvme, 9)}};
  auto applied = index.OnStream({1, Stored(Tier::kNvme, 9)});
  ASSERT_TRUE(applied.ok()) << applied.status().ToString();
  EXPECT_EQ(*applied, 0u);
  EXPECT_EQ(index.restarts(), 1);
  EXPECT_EQ(fake.snapshots, 2);
  ASSERT_TRUE(index.OnStream({2, Stored(Tier::kHost, 3)}).ok());
  EXPECT_EQ(Keys(index), (std::vector<std::tuple<Tier, uint64_t>>{{Tier::kHost, 3}, {Tier::kNvme, 9}}));
}

TEST(IndexRebuilder, RefusesWhatDoesNotDecode) {
  FakeRequests fake;
  fake.snapshot = {{0, Batch({})}};
  IndexRebuilder index(fake);
  ASSERT_TRUE(index.Resync().ok());
  auto applied = index.OnStream({1, "\xc1"});
  ASSERT_FALSE(applied.ok());
  EXPECT_EQ(applied.status().code(), StatusCode::kFailedPrecondition);
  fake.snapshot = {};
  EXPECT_FALSE(index.Resync().ok()) << "a snapshot always has one batch, saying its seq";
  fake.snapshot = {{3, Batch({})}, {4, Batch({})}};
  EXPECT_FALSE(index.Resync().ok()) << "every batch of a snapshot names the same point";
}

}  // namespace
}  // namespace kvtier::tools

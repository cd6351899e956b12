// EnginePeerSource (daemon/setup/peer_setup.h): what a peer server serves
// from this node's engine. A block whose layers its writer published is
// pinnable from the moment its first layer is published, through its
// commit, until it leaves: a pin racing the commit finds it either still
// being written or committed, never missing.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "common/checksum.h"
#include "daemon/engine/engine.h"
#include "daemon/setup/peer_setup.h"
#include "tests/testing/engine_stack.h"
#include "tests/testing/test_daemon.h"

namespace kvtier {
namespace {

using ::kvtier::testing::ModelNamespace;

constexpr uint64_t kBlockBytes = 64 << 10;
constexpr ConnectionId kWriter = 3;

class EnginePeerSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(engine_, nullptr);
    engine_->RegisterNamespace(ns_, ModelNamespace("org/model", "rev-1"));
  }
  // Reserves `key`, fills it and publishes its first layer to peers.
  void ReserveAndPublish(const BlockKey& key, bool handoff = false) {
    auto grants = engine_->Reserve(kWriter, ns_, {&key, 1}, {&kBlockBytes, 1});
    ASSERT_TRUE(grants[0].status.ok()) << grants[0].status.ToString();
    auto bytes = ::kvtier::testing::SlotBytes(*stack_.host, grants[0].offset, grants[0].length);
    ::kvtier::testing::FillBlockBytes(key, 0, bytes);
    const uint32_t layers = engine_->LayersOf(ns_, kBlockBytes);
    ASSERT_GE(layers, 1u);
    const uint64_t sum = BlockChecksum(bytes.subspan(0, kBlockBytes / layers));
    auto published = engine_->published_layers().Publish(kWriter, ns_, {&key, 1}, 0, 1, {&sum, 1}, handoff);
    ASSERT_TRUE(published[0].ok()) << published[0].ToString();
  }
  // The source's answer to a pin of `key`, synchronously (the engine
  // answers a host block inline).
  PeerPinned PinNow(const BlockKey& key) {
    PeerPinned answer;
    std::atomic<bool> done{false};
    source_.Pin(1, ns_, key, [&](PeerPinned p) {
      answer = std::move(p);
      done.store(true);
    });
    while (!done.load()) std::this_thread::yield();
    return answer;
  }

  ::kvtier::testing::EngineStack stack_{64 * kBlockBytes};
  Engine* engine_ = stack_.engine.get();
  EnginePeerSource source_{*stack_.engine, *stack_.host};
  const NamespaceFingerprint ns_ = FingerprintNamespace(ModelNamespace("org/model", "rev-1"));
};

TEST_F(EnginePeerSourceTest, ABlockBeingWrittenIsPinnedWithItsPublishedLayersThenWholeOnceCommitted) {
  const BlockKey key{ns_.lo, 1};
  EXPECT_EQ(PinNow(key).code, StatusCode::kNotFound);
  ReserveAndPublish(key);
  PeerPinned partial = PinNow(key);
  ASSERT_EQ(partial.code, StatusCode::kOk);
  EXPECT_EQ(partial.lease, 0u) << "a block being written has no lease";
  EXPECT_EQ(partial.layers_ready, 1u);
  ASSERT_TRUE(engine_->Commit(kWriter, ns_, {&key, 1}, {&kBlockBytes, 1})[0].ok());
  PeerPinned whole = PinNow(key);
  ASSERT_EQ(whole.code, StatusCode::kOk);
  EXPECT_NE(whole.lease, 0u);
  EXPECT_EQ(whole.offset, partial.offset) << "the block is committed where it was written";
  EXPECT_EQ(whole.layers_ready, whole.layer_count);
  EXPECT_EQ(whole.layer_checksums.front(), partial.layer_checksums.front());
  source_.Release(1, {&whole.lease, 1});
}

// The gauges of what peers are shown: blocks being written with layers
// published, and hand-off marks, which end with the block.
TEST_F(EnginePeerSourceTest, PublishedBlocksAndHandoffMarksAreGauges) {
  auto gauge = [&](const std::string& name) { return ::kvtier::testing::EngineCounters(*engine_)[name]; };
  const BlockKey kept{ns_.lo, 1}, handed{ns_.lo, 2};
  ReserveAndPublish(kept);
  ReserveAndPublish(handed, /*handoff=*/true);
  EXPECT_EQ(gauge("engine.published_blocks"), 2);
  EXPECT_EQ(gauge("engine.handoff_marks"), 1);
  // Aborted: its mark goes.
  EXPECT_EQ(engine_->Abort(kWriter, {&handed, 1}), 1u);
  EXPECT_EQ(gauge("engine.handoff_marks"), 0);
}

// The race behind a decode node's streamed load failing at random: a pin
// that looked for the committed block just before the commit and for the
// published layers just after it found neither.
TEST_F(EnginePeerSourceTest, APinRacingTheCommitNeverMissesTheBlock) {
  constexpr int kRounds = 300;
  int missed = 0;
  for (int round = 0; round < kRounds && missed == 0; ++round) {
    const BlockKey key{ns_.lo, 100 + static_cast<uint64_t>(round)};
    ReserveAndPublish(key);
    std::atomic<bool> start{false};
    std::thread committer([&] {
      while (!start.load()) std::this_thread::yield();
      EXPECT_TRUE(engine_->Commit(kWriter, ns_, {&key, 1}, {&kBlockBytes, 1})[0].ok());
    });
    start.store(true);
    // Pin until the committed block answers (it has a lease); every answer on the way is a hit.
    for (;;) {
      PeerPinned p = PinNow(key);
      if (p.code != StatusCode::kOk) {
        ++missed;
        break;
      }
      if (p.lease != 0) {
        source_.Release(1, {&p.lease, 1});
        break;
      }
    }
    committer.join();
    // Room for the next round.
    engine_->Erase(ns_, {&key, 1});
  }
  EXPECT_EQ(missed, 0) << "a pin found the block neither being written nor committed";
}

}  // namespace
}  // namespace kvtier

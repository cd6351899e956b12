// Engine::BeginLoad (daemon/engine/loader.cc): layer-wise loads, driven
// against a scripted tier below the host that records the order of its
// reads and completes them when the test says so. The board
// (common/load_board.h) is read from the arena as a client reads it.
#include <gtest/gtest.h>

#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/checksum.h"
#include "common/load_board.h"
#include "common/worker_pool.h"
#include "daemon/engine/engine.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/test_daemon.h"
#include "tiers/tier.h"

namespace kvtier {
namespace {

using ::kvtier::testing::CheckBlockBytes;
using ::kvtier::testing::FakeClock;
using ::kvtier::testing::FillBlockBytes;
using ::kvtier::testing::SlotBytes;

constexpr uint32_t kLayers = 6;
constexpr uint64_t kLayerBytes = 8 << 10;
constexpr uint64_t kBlockBytes = kLayers * kLayerBytes;
constexpr NamespaceFingerprint kNs{0x10ad, 0xb0a2d};
constexpr ConnectionId kConn = 7;

BlockKey Key(uint64_t i) { return BlockKey{0x1a7e, i}; }

// A tier below the host whose reads the test controls: it records the
// (key, layer) of every read it accepts; with `hold` on, completions wait
// until Complete() runs them in the order the reads came; a read of a
// (key, layer) in `fail` completes with that status; the first `busy`
// reads are refused with Busy; at most `max_in_flight` reads are accepted
// at once (more: Busy).
class ScriptedTier final : public BlockTier {
 public:
  std::string_view name() const override { return "scripted"; }
  bool asynchronous() const override { return true; }
  uint64_t capacity_bytes() const override { return 1ull << 30; }
  uint64_t used_bytes() const override { return 0; }

  void Store(const BlockKey& key, uint32_t layers, uint64_t bytes) {
    std::vector<std::byte> data(bytes);
    FillBlockBytes(key, 0, data);
    std::lock_guard lock(mu_);
    blocks_[key] = Stored{BlockInfo{kNs, bytes, layers, BlockChecksum(data)}, std::move(data)};
  }

  std::optional<BlockInfo> Find(const BlockKey& key) const override {
    std::lock_guard lock(mu_);
    auto it = blocks_.find(key);
    if (it == blocks_.end()) return std::nullopt;
    return it->second.info;
  }
  void ForEachBlock(const BlockVisitor& visit) const override {
    std::lock_guard lock(mu_);
    for (const auto& [key, stored] : blocks_) visit(key, stored.info);
  }
  Status Write(const NamespaceFingerprint&, const BlockKey&, uint32_t, std::span<const std::byte>, WriteDone,
               std::optional<uint64_t>) override {
    return Unavailable("the scripted tier takes no demotions");
  }
  Status Read(const BlockKey& key, uint32_t first_layer, uint32_t last_layer, std::span<std::byte> dst,
              ReadDone done) override {
    std::function<void()> completion;
    {
      std::lock_guard lock(mu_);
      if (busy_ > 0) {
        --busy_;
        return Busy("scripted busy");
      }
      if (max_in_flight_ != 0 && in_flight_ >= max_in_flight_) return Busy("scripted queue full");
      auto it = blocks_.find(key);
      if (it == blocks_.end()) return NotFound("not stored");
      const uint64_t layer_bytes = it->second.info.payload_bytes / it->second.info.layer_count;
      const uint64_t bytes = (last_layer - first_layer) * layer_bytes;
      order_.emplace_back(key, first_layer);
      ++in_flight_;
      Status outcome = Status::Ok();
      if (auto f = fail_.find({key, first_layer}); f != fail_.end()) outcome = f->second;
      const std::byte* src = it->second.bytes.data() + first_layer * layer_bytes;
      completion = [this, dst, src, bytes, outcome, done = std::move(done)] {
        {
          std::lock_guard lock(mu_);
          --in_flight_;
        }
        if (!outcome.ok()) return done(outcome);
        std::memcpy(dst.data(), src, bytes);
        done(size_t{bytes});
      };
      if (hold_) {
        held_.push_back(std::move(completion));
        return Status::Ok();
      }
    }
    Post(std::move(completion));
    return Status::Ok();
  }
  Status Erase(const BlockKey& key) override {
    std::lock_guard lock(mu_);
    return blocks_.erase(key) != 0 ? Status::Ok() : NotFound("not stored");
  }
  WriteTotals write_totals() const override { return {}; }
  void VisitCounters(CounterVisitor&) const override {}

  void Hold() {
    std::lock_guard lock(mu_);
    hold_ = true;
  }
  // Runs the next `n` held completions (in read order) and waits for them.
  void Complete(size_t n) {
    std::vector<std::function<void()>> run;
    {
      std::lock_guard lock(mu_);
      while (n-- > 0 && !held_.empty()) {
        run.push_back(std::move(held_.front()));
        held_.pop_front();
      }
    }
    for (auto& c : run) Post(std::move(c));
    Drain();
  }
  // Runs held completions, and those the reads they start add, until
  // none is held.
  void CompleteAll() {
    while (held() > 0) Complete(held());
  }
  size_t held() const {
    std::lock_guard lock(mu_);
    return held_.size();
  }
  void Fail(const BlockKey& key, uint32_t layer, Status status) {
    std::lock_guard lock(mu_);
    fail_[{key, layer}] = std::move(status);
  }
  void SetBusy(int reads) {
    std::lock_guard lock(mu_);
    busy_ = reads;
  }
  void SetMaxInFlight(size_t n) {
    std::lock_guard lock(mu_);
    max_in_flight_ = n;
  }
  std::vector<std::pair<BlockKey, uint32_t>> order() const {
    std::lock_guard lock(mu_);
    return order_;
  }
  // Waits until every completion posted so far, and those they caused
  // (the stream's next reads), has run.
  void Drain() {
    for (;;) {
      const uint64_t before = posted_.load();
      std::promise<void> barrier;
      pool_.Post([&barrier] { barrier.set_value(); });
      barrier.get_future().wait();
      if (posted_.load() == before) return;
    }
  }

 private:
  struct Stored {
    BlockInfo info;
    std::vector<std::byte> bytes;
  };
  mutable std::mutex mu_;
  std::unordered_map<BlockKey, Stored> blocks_;
  std::map<std::pair<BlockKey, uint32_t>, Status> fail_;
  std::vector<std::pair<BlockKey, uint32_t>> order_;
  std::deque<std::function<void()>> held_;
  bool hold_ = false;
  int busy_ = 0;
  size_t max_in_flight_ = 0;
  size_t in_flight_ = 0;
  std::atomic<uint64_t> posted_{0};
  void Post(std::function<void()> completion) {
    posted_.fetch_add(1);
    pool_.Post(std::move(completion));
  }
  WorkerPool pool_{1};  // declared last: drained first
};

class EngineLayerLoadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    host_ = ::kvtier::testing::OpenTestHostTier(64 * kBlockBytes);
    ASSERT_NE(host_, nullptr);
    std::vector<LowerTier> stack{LowerTier{&tier_, AdmissionPolicyId::kAll, {}, 0, Tier::kNvme}};
    auto engine = Engine::Create(EngineOptions{4, EvictionPolicyId::kLru}, *host_, clock_, std::move(stack));
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    engine_ = std::move(*engine);
    engine_->RegisterNamespace(kNs, NamespaceLayout{kLayers, kBlockBytes});
  }
  void TearDown() override {
    tier_.CompleteAll();
    engine_.reset();
  }

  LoadBoardReader Board(const Engine::LoadStart& start) {
    return LoadBoardReader(SlotBytes(*host_, start.board_offset, start.board_bytes).data(),
                           static_cast<uint32_t>(start.blocks.size()));
  }
  std::span<std::byte> LayerBytes(const LoadBoardReader& board, uint32_t block, uint32_t layer) {
    return SlotBytes(*host_, board.offset(block) + layer * kLayerBytes, kLayerBytes);
  }
  // Layer `layer` of block `key` as stored (FillBlockBytes of the block).
  static std::vector<std::byte> Expected(const BlockKey& key, uint32_t layer) {
    std::vector<std::byte> whole(kBlockBytes);
    FillBlockBytes(key, 0, whole);
    return {whole.begin() + layer * kLayerBytes, whole.begin() + (layer + 1) * kLayerBytes};
  }
  bool LayerIsExact(const LoadBoardReader& board, uint32_t block, const BlockKey& key, uint32_t layer) {
    auto got = LayerBytes(board, block, layer);
    auto want = Expected(key, layer);
    return std::memcmp(got.data(), want.data(), kLayerBytes) == 0;
  }
  int64_t Counter(const std::string& name) { return ::kvtier::testing::EngineCounters(*engine_)[name]; }
  // Everything in flight has ended (nothing may be held).
  void Settle() {
    tier_.Drain();
    engine_->WaitForIdle();
    tier_.Drain();
  }

  FakeClock clock_;
  std::unique_ptr<HostTier> host_;
  ScriptedTier tier_;
  std::unique_ptr<Engine> engine_;
};

TEST_F(EngineLayerLoadTest, ReadsGoLayerByLayerAcrossTheBlocks) {
  std::vector<BlockKey> keys;
  for (uint64_t i = 0; i < 4; ++i) {
    keys.push_back(Key(i));
    tier_.Store(keys.back(), kLayers, kBlockBytes);
  }
  tier_.SetMaxInFlight(3);  // the stream refills the tier's queue as reads end, in order
  auto start = engine_->BeginLoad(kConn, kNs, keys);
  ASSERT_TRUE(start.ok()) << start.status().ToString();
  EXPECT_EQ(start->source, Tier::kNvme);
  EXPECT_EQ(start->below_bytes_per_layer, 4 * kLayerBytes);
  Settle();
  const auto order = tier_.order();
  ASSERT_EQ(order.size(), keys.size() * kLayers);
  for (size_t i = 0; i < order.size(); ++i) {
    EXPECT_EQ(order[i].second, i / keys.size()) << "read " << i;
    EXPECT_EQ(order[i].first, keys[i % keys.size()]) << "read " << i;
  }
  LoadBoardReader board = Board(*start);
  EXPECT_EQ(board.layers_ready(), kLayers);
  EXPECT_EQ(board.resolved(), keys.size());
  for (uint32_t b = 0; b < keys.size(); ++b) {
    EXPECT_EQ(board.state(b), BoardBlockState::kLoaded);
    EXPECT_TRUE(CheckBlockBytes(keys[b], 0, SlotBytes(*host_, board.offset(b), kBlockBytes))) << b;
    EXPECT_EQ(::kvtier::testing::LookupTier(*engine_, kNs, keys[b]), Tier::kHost) << "promoted";
  }
  EXPECT_EQ(Counter("engine.load_streamed_blocks"), 4);
  EXPECT_EQ(Counter("engine.load_layer_reads"), 4 * kLayers);
  EXPECT_GT(Counter("engine.leases"), 0) << "the load pins its blocks";
  ASSERT_TRUE(engine_->EndLoad(kConn, start->load).ok());
  EXPECT_EQ(Counter("engine.leases"), 0);
  EXPECT_EQ(Counter("engine.loads_open"), 0);
  EXPECT_EQ(engine_->EndLoad(kConn, start->load).code(), StatusCode::kNotFound);
}

TEST_F(EngineLayerLoadTest, EachLayerIsPublishedOnceItIsInEveryBlock) {
  std::vector<BlockKey> keys{Key(10), Key(11), Key(12)};
  for (const auto& k : keys) tier_.Store(k, kLayers, kBlockBytes);
  tier_.Hold();
  auto start = engine_->BeginLoad(kConn, kNs, keys);
  ASSERT_TRUE(start.ok());
  LoadBoardReader board = Board(*start);
  EXPECT_EQ(board.layers_ready(), 0u);
  EXPECT_EQ(tier_.held(), keys.size()) << "a block's later layers wait for its first (its record is known then)";
  for (uint32_t layer = 0; layer < kLayers; ++layer) {
    tier_.Complete(keys.size() - 1);
    EXPECT_EQ(board.layers_ready(), layer) << "layer " << layer << " is not in the last block yet";
    tier_.Complete(1);
    ASSERT_EQ(board.layers_ready(), layer + 1);
    for (uint32_t b = 0; b < keys.size(); ++b) EXPECT_TRUE(LayerIsExact(board, b, keys[b], layer)) << b << "/" << layer;
    if (layer + 1 < kLayers) {
      EXPECT_EQ(board.state(0), BoardBlockState::kLoading);
      EXPECT_EQ(::kvtier::testing::LookupTier(*engine_, kNs, keys[0]), Tier::kNvme) << "visible once whole";
    }
  }
  Settle();
  EXPECT_EQ(board.resolved(), keys.size());
  ASSERT_TRUE(engine_->EndLoad(kConn, start->load).ok());
}

TEST_F(EngineLayerLoadTest, AFailedBlockFailsAloneAndTheOthersLoad) {
  std::vector<BlockKey> keys{Key(20), Key(21), Key(22), Key(23)};
  for (const auto& k : keys) tier_.Store(k, kLayers, kBlockBytes);
  tier_.Fail(keys[2], 3, Corruption("scripted rot"));
  const uint64_t used_before = host_->used_bytes();
  auto start = engine_->BeginLoad(kConn, kNs, keys);
  ASSERT_TRUE(start.ok());
  Settle();
  LoadBoardReader board = Board(*start);
  EXPECT_EQ(board.layers_ready(), kLayers) << "every block that did not fail has every layer";
  EXPECT_EQ(board.resolved(), keys.size());
  for (uint32_t b : {0u, 1u, 3u}) {
    EXPECT_EQ(board.state(b), BoardBlockState::kLoaded) << b;
    EXPECT_TRUE(CheckBlockBytes(keys[b], 0, SlotBytes(*host_, board.offset(b), kBlockBytes))) << b;
  }
  EXPECT_EQ(board.state(2), BoardBlockState::kFailed);
  EXPECT_EQ(board.code(2), StatusCode::kNotFound) << "a failed promotion is a miss";
  // Not promoted; its copy below failed verification, so it is quarantined
  // there (quarantine.h): never offered again until written again.
  EXPECT_EQ(::kvtier::testing::LookupTier(*engine_, kNs, keys[2]), Tier::kNone);
  // No read of block 2 was issued past its failed layer's read (the ones
  // already queued before it failed may have run).
  EXPECT_EQ(Counter("engine.load_failed_blocks"), 1);
  ASSERT_TRUE(engine_->EndLoad(kConn, start->load).ok());
  // Block 2's extent and the board went back; the three promoted blocks stay.
  EXPECT_EQ(host_->used_bytes() - used_before, 3 * ArenaAllocator::ClassSize(kBlockBytes));
}

TEST_F(EngineLayerLoadTest, HostHitsAreReadyAtOnceAndMissesAndWrongSizesFail) {
  std::vector<BlockKey> keys{Key(30), Key(31), Key(32), Key(33)};
  ASSERT_TRUE(::kvtier::testing::PutFilledBlock(*engine_, *host_, 1, kNs, keys[0], kBlockBytes).ok());
  ASSERT_TRUE(::kvtier::testing::PutFilledBlock(*engine_, *host_, 1, kNs, keys[3], kBlockBytes / 2).ok());
  tier_.Store(keys[1], kLayers, kBlockBytes);
  tier_.Hold();
  auto start = engine_->BeginLoad(kConn, kNs, keys);
  ASSERT_TRUE(start.ok());
  EXPECT_TRUE(start->blocks[0].ok());
  EXPECT_TRUE(start->blocks[1].ok());
  EXPECT_EQ(start->blocks[2].code(), StatusCode::kNotFound);
  EXPECT_EQ(start->blocks[3].code(), StatusCode::kInvalidArgument) << "half a block is not a layer-wise block";
  LoadBoardReader board = Board(*start);
  EXPECT_EQ(board.state(0), BoardBlockState::kLoaded);
  EXPECT_TRUE(CheckBlockBytes(keys[0], 0, SlotBytes(*host_, board.offset(0), kBlockBytes)));
  EXPECT_EQ(board.state(2), BoardBlockState::kFailed);
  EXPECT_EQ(board.state(3), BoardBlockState::kFailed);
  EXPECT_EQ(board.layers_ready(), 0u) << "block 1 is still coming";
  tier_.CompleteAll();
  EXPECT_EQ(board.layers_ready(), kLayers);
  Settle();
  EXPECT_EQ(Counter("engine.leases"), 2) << "blocks 0 and 1; block 3's pin went back at once";
  ASSERT_TRUE(engine_->EndLoad(kConn, start->load).ok());
  EXPECT_EQ(Counter("engine.leases"), 0);
}

TEST_F(EngineLayerLoadTest, ABusyTierIsRetriedUntilItTakesTheReads) {
  std::vector<BlockKey> keys{Key(40), Key(41)};
  for (const auto& k : keys) tier_.Store(k, kLayers, kBlockBytes);
  tier_.SetBusy(5);
  auto start = engine_->BeginLoad(kConn, kNs, keys);
  ASSERT_TRUE(start.ok());
  // Each refusal is tried again a pause later on the engine's clock: the
  // test moves the clock to each retry as it waits.
  for (int refused = 0; refused < 5; ++refused) {
    const uint64_t retry_at = clock_.AwaitWaiter();
    EXPECT_EQ(Counter("engine.load_busy_retries"), refused);
    clock_.SetUs(retry_at);
  }
  Settle();
  LoadBoardReader board = Board(*start);
  EXPECT_EQ(board.layers_ready(), kLayers);
  EXPECT_EQ(board.state(0), BoardBlockState::kLoaded);
  EXPECT_EQ(board.state(1), BoardBlockState::kLoaded);
  EXPECT_EQ(Counter("engine.load_busy_retries"), 5);
  const auto order = tier_.order();
  ASSERT_EQ(order.size(), 2 * kLayers);
  for (size_t i = 0; i < order.size(); ++i) EXPECT_EQ(order[i].second, i / 2) << "order kept across retries";
  ASSERT_TRUE(engine_->EndLoad(kConn, start->load).ok());
}

// A tier that stays busy, with none of the stream's reads in flight, fails
// the blocks left with Busy once 2 s passed on the engine's clock since
// the stream last progressed, not before.
TEST_F(EngineLayerLoadTest, ATierThatStaysBusyFailsTheLoadAfterItsWaitOnTheEnginesClock) {
  std::vector<BlockKey> keys{Key(45), Key(46)};
  for (const auto& k : keys) tier_.Store(k, kLayers, kBlockBytes);
  tier_.SetBusy(1'000'000);
  const uint64_t started_us = clock_.NowUs();
  auto start = engine_->BeginLoad(kConn, kNs, keys);
  ASSERT_TRUE(start.ok());
  LoadBoardReader board = Board(*start);
  EXPECT_EQ(clock_.AwaitWaiter(), started_us + 1'000) << "a pause";
  clock_.SetUs(started_us + 2'000'000 - 1);  // the retry is due; the wait not yet over
  const uint64_t last_retry = clock_.AwaitWaiter();
  EXPECT_EQ(last_retry, started_us + 2'000'000 - 1 + 1'000);
  EXPECT_EQ(board.resolved(), 0u) << "still trying";
  clock_.SetUs(last_retry);
  Settle();
  EXPECT_EQ(Counter("engine.load_busy_retries"), 2);
  EXPECT_EQ(board.resolved(), keys.size());
  for (uint32_t b = 0; b < keys.size(); ++b) {
    EXPECT_EQ(board.state(b), BoardBlockState::kFailed) << b;
    EXPECT_EQ(board.code(b), StatusCode::kBusy) << b;
  }
  EXPECT_TRUE(tier_.order().empty()) << "the tier took no read";
  ASSERT_TRUE(engine_->EndLoad(kConn, start->load).ok());
}

TEST_F(EngineLayerLoadTest, ClosingTheConnectionMidLoadLeavesNothingPinned) {
  std::vector<BlockKey> keys{Key(50), Key(51), Key(52)};
  for (const auto& k : keys) tier_.Store(k, kLayers, kBlockBytes);
  ASSERT_TRUE(::kvtier::testing::PutFilledBlock(*engine_, *host_, 1, kNs, Key(53), kBlockBytes).ok());
  keys.push_back(Key(53));
  tier_.Hold();
  auto start = engine_->BeginLoad(kConn, kNs, keys);
  ASSERT_TRUE(start.ok());
  tier_.Complete(4);
  engine_->CloseConnection(kConn);  // the engine crashed mid-load
  EXPECT_EQ(Counter("engine.loads_open"), 0);
  tier_.CompleteAll();  // the reads in flight end after it
  Settle();
  EXPECT_EQ(Counter("engine.leases"), 0) << "pins that came after the close went back";
  for (const auto& k : keys) {
    EXPECT_EQ(::kvtier::testing::LookupTier(*engine_, kNs, k), Tier::kHost) << "the promotions still completed";
  }
}

// The tier's bandwidth is what it delivers while busy, not each read's
// own rate: three promotions in flight together for 1 ms read three
// blocks in 1 ms, not one block in 1 ms three times.
TEST_F(EngineLayerLoadTest, TheReadMeterMeasuresWhatTheTierDeliversWhileBusy) {
  std::vector<BlockKey> keys{Key(70), Key(71), Key(72)};
  for (const auto& k : keys) tier_.Store(k, kLayers, kBlockBytes);
  tier_.Hold();
  std::promise<std::vector<PinGrant>> pinned;
  engine_->PinAsync(kConn, kNs, keys, [&pinned](std::vector<PinGrant> g) { pinned.set_value(std::move(g)); });
  clock_.AdvanceUs(1000);
  tier_.Complete(keys.size());
  const auto grants = pinned.get_future().get();
  for (const auto& g : grants) ASSERT_TRUE(g.status.ok()) << g.status.ToString();
  auto plan = engine_->PlanPreload(Tier::kNvme, kLayerBytes, 1, kLayers, 0);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_DOUBLE_EQ(plan->read_bytes_per_s, 3 * kBlockBytes / 1e-3);
  // A layer-wise load feeds the same meter: 2 blocks' layers in 2 ms.
  std::vector<BlockKey> more{Key(73), Key(74)};
  for (const auto& k : more) tier_.Store(k, kLayers, kBlockBytes);
  auto start = engine_->BeginLoad(kConn, kNs, more);
  ASSERT_TRUE(start.ok());
  clock_.AdvanceUs(2000);
  tier_.CompleteAll();
  Settle();
  EXPECT_EQ(Board(*start).layers_ready(), kLayers);
  // The estimate keeps the slower of the two samples at the 10th percentile.
  plan = engine_->PlanPreload(Tier::kNvme, kLayerBytes, 1, kLayers, 0);
  ASSERT_TRUE(plan.ok());
  EXPECT_DOUBLE_EQ(plan->read_bytes_per_s, 2 * kBlockBytes / 2e-3);
  ASSERT_TRUE(engine_->EndLoad(kConn, start->load).ok());
  std::vector<LeaseId> leases;
  for (const auto& g : grants) leases.push_back(g.lease);
  engine_->Release(kConn, leases);
}

TEST_F(EngineLayerLoadTest, BadLoadsAreRefused) {
  EXPECT_EQ(engine_->BeginLoad(kConn, kNs, {}).status().code(), StatusCode::kInvalidArgument);
  const BlockKey key = Key(60);
  EXPECT_EQ(engine_->BeginLoad(kConn, NamespaceFingerprint{1, 2}, std::span(&key, 1)).status().code(),
            StatusCode::kInvalidArgument)
      << "a namespace with no layout";
  std::vector<uint64_t> loads;
  for (size_t i = 0; i < Engine::kMaxLoadsPerConnection; ++i) {
    auto start = engine_->BeginLoad(kConn, kNs, std::span(&key, 1));
    ASSERT_TRUE(start.ok());
    loads.push_back(start->load);
  }
  EXPECT_EQ(engine_->BeginLoad(kConn, kNs, std::span(&key, 1)).status().code(), StatusCode::kBusy);
  EXPECT_TRUE(engine_->BeginLoad(kConn + 1, kNs, std::span(&key, 1)).ok()) << "other connections go on";
  for (uint64_t id : loads) EXPECT_TRUE(engine_->EndLoad(kConn, id).ok());
  engine_->CloseConnection(kConn + 1);
  EXPECT_EQ(Counter("engine.loads_open"), 0);
}

}  // namespace
}  // namespace kvtier

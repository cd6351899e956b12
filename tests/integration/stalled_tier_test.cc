// Nothing slow on a request thread (issue 12, Deliver 3): with the NVMe
// tier's device writes and its index (RocksDB) mutations stuck on latches
// the test holds, demotions cannot finish, yet another client's lookups,
// host-hit gets, puts into free space, erases and queue hints all complete
// on a daemon with a single io thread. Released, nothing acknowledged is
// lost and nothing erased comes back.
//
// Deterministic: the latches decide the order, nothing is timed. A request
// thread that waited on a latch would leave the client's call to its
// call_timeout (TimedOut), failing the test with the call that hung.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

#include "tests/testing/test_daemon.h"

namespace kvtier::testing {
namespace {

constexpr size_t kBlock = 128 << 10;
// Blocks put before the stall (some settle on NVMe, indexed) and during it
// (twice the host tier: half of them are evicted towards the stuck tier,
// first into its staging, then, the tier Busy, into the demoter).
constexpr size_t kSettled = 40;
constexpr size_t kStalled = 60;

// Blocks every thread that passes it while held.
class Gate {
 public:
  void Hold() {
    std::lock_guard lock(mu_);
    held_ = true;
  }
  void Release() {
    {
      std::lock_guard lock(mu_);
      held_ = false;
    }
    cv_.notify_all();
  }
  void Pass() {
    std::unique_lock lock(mu_);
    if (held_) {
      ++stopped_;
      cv_.notify_all();
    }
    cv_.wait(lock, [this] { return !held_; });
  }
  // Waits until a thread has stopped here (the index writer reaches the
  // gate on its own thread, after the call that queued the mutation).
  void AwaitStopped() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [this] { return stopped_ > 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool held_ = false;
  int stopped_ = 0;
};

class StalledTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TestDaemonOptions o;
    o.arena_bytes = 4 << 20;  // about 30 blocks
    o.io_threads = 1;         // one request thread: if it waits, everyone does
    o.nvme_in_memory = true;
    o.nvme_bytes = 32 << 20;
    o.nvme_region_bytes = 1 << 20;
    o.nvme_staging_bytes = 1 << 20;  // a few records: the tier soon says Busy
    o.demotion_buffer_bytes = 16 << 20;
    o.nvme_index_hook = [gate = index_gate_] { gate->Pass(); };
    daemon_ = std::make_unique<TestDaemon>(o);
    writer_ = daemon_->ConnectSocketOnly();
    other_ = daemon_->ConnectSocketOnly();
    ASSERT_NE(writer_, nullptr);
    ASSERT_NE(other_, nullptr);
    keys_ = TestKeys(TestNamespace(), kSettled + kStalled, 5);
  }

  void TearDown() override {
    index_gate_->Release();  // whatever happened, let the daemon drain
    if (daemon_ && daemon_->nvme_device()) daemon_->nvme_device()->ReleaseWrites();
    other_.reset();
    writer_.reset();
    daemon_.reset();
  }

  Status PutBlock(Client& client, const BlockKey& key) { return client.Put(0, key, Block(key, kBlock)); }

  // Another client's requests while demotions are stuck: a lookup that
  // sees every block put so far (host, or on its way to NVMe), a host-hit
  // get, an erase, a put into the room it freed, and queue hints.
  void OtherClientIsServed(size_t put_so_far, size_t round) {
    SCOPED_TRACE("round " + std::to_string(round));
    std::vector<BlockKey> live;
    for (size_t i = 0; i < put_so_far; ++i) {
      if (std::find(erased_.begin(), erased_.end(), keys_[i]) == erased_.end()) live.push_back(keys_[i]);
    }
    auto lookup = other_->Lookup(0, live);
    ASSERT_TRUE(lookup.ok()) << lookup.status().ToString();
    EXPECT_EQ(lookup->prefix_blocks, live.size()) << "a block being demoted is still cached";

    const BlockKey& newest = keys_[put_so_far - 1];
    std::vector<std::byte> dst(kBlock);
    auto got = other_->Get(0, newest, dst);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_TRUE(CheckBlockBytes(newest, 0, dst));

    // Free one host block, then put a new one into its room.
    const BlockKey& dropped = keys_[put_so_far - 2];
    auto erased = other_->Erase(0, {&dropped, 1});
    ASSERT_TRUE(erased.ok()) << erased.status().ToString();
    EXPECT_EQ(*erased, 1u);
    erased_.push_back(dropped);
    const BlockKey fresh = TestKeys(TestNamespace(), 1, 100 + round)[0];
    Status put = PutBlock(*other_, fresh);
    ASSERT_TRUE(put.ok()) << put.ToString();
    fresh_.push_back(fresh);

    const auto start = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    Status hint = other_->Enqueue(round, 0, live, start, /*session=*/9);
    ASSERT_TRUE(hint.ok()) << hint.ToString();
    hint = other_->Finished(round);
    ASSERT_TRUE(hint.ok()) << hint.ToString();
  }

  std::shared_ptr<Gate> index_gate_ = std::make_shared<Gate>();
  std::unique_ptr<TestDaemon> daemon_;
  std::unique_ptr<Client> writer_;
  std::unique_ptr<Client> other_;
  std::vector<BlockKey> keys_;
  std::vector<BlockKey> erased_;
  std::vector<BlockKey> fresh_;
};

TEST_F(StalledTierTest, RequestsCompleteWhileDemotionsAreStuckAndNothingIsLost) {
  FaultInjectingDevice& device = *daemon_->nvme_device();
  for (size_t i = 0; i < kSettled; ++i) ASSERT_TRUE(PutBlock(*writer_, keys_[i]).ok()) << i;
  daemon_->engine().WaitForIdle();
  const int64_t settled = EngineCounter(*daemon_, "engine.demotions");
  ASSERT_GT(settled, 0);
  ASSERT_TRUE(daemon_->nvme()->Find(keys_[0]).has_value()) << "the oldest block settled on NVMe";

  device.HoldWrites();
  index_gate_->Hold();
  constexpr size_t kPut = kSettled + kStalled;
  for (size_t i = kSettled; i < kPut; ++i) ASSERT_TRUE(PutBlock(*writer_, keys_[i]).ok()) << i;
  // Erase a block on NVMe (its index delete stalls) and one whose
  // demotion is stuck: neither may come back.
  for (const BlockKey& key : {keys_[0], keys_[kSettled]}) {
    auto erased = other_->Erase(0, {&key, 1});
    ASSERT_TRUE(erased.ok()) << erased.status().ToString();
    EXPECT_EQ(*erased, 1u);
    erased_.push_back(key);
  }
  ASSERT_GT(device.held_writes(), 0u) << "the device latch holds demotion writes";
  index_gate_->AwaitStopped();  // the index writer holds a mutation (the erase's delete at least)
  ASSERT_GT(EngineCounter(*daemon_, "engine.demotions_queued"), 0) << "the tier said Busy: the demoter holds some";
  EXPECT_EQ(EngineCounter(*daemon_, "engine.demotions"), settled) << "no demotion can have finished";

  OtherClientIsServed(kPut, 1);

  // The device goes on; the index still stalls, so no write is indexed.
  device.ReleaseWrites();
  OtherClientIsServed(kPut - 2, 2);
  EXPECT_EQ(EngineCounter(*daemon_, "engine.demotions"), settled) << "a demotion ends once indexed";

  index_gate_->Release();
  daemon_->engine().WaitForIdle();
  daemon_->nvme()->WaitForIdle();

  EXPECT_EQ(EngineCounter(*daemon_, "engine.demotion_busy_drops"), 0);
  EXPECT_EQ(EngineCounter(*daemon_, "engine.demotion_rejections"), 0);
  EXPECT_EQ(EngineCounter(*daemon_, "nvme.index_failures"), 0);
  EXPECT_GT(EngineCounter(*daemon_, "engine.demotions"), 0);

  // Every block put and not erased is cached somewhere, byte-exact.
  std::vector<BlockKey> kept;
  for (size_t i = 0; i < kPut; ++i) {
    if (std::find(erased_.begin(), erased_.end(), keys_[i]) == erased_.end()) kept.push_back(keys_[i]);
  }
  kept.insert(kept.end(), fresh_.begin(), fresh_.end());
  std::vector<std::byte> dst(kBlock);
  for (const BlockKey& key : kept) {
    auto got = other_->Get(0, key, dst);
    ASSERT_TRUE(got.ok()) << key.ToHex() << ": " << got.status().ToString();
    EXPECT_TRUE(CheckBlockBytes(key, 0, dst)) << key.ToHex();
  }
  for (const BlockKey& key : erased_) {
    auto found = other_->Lookup(0, {&key, 1});
    ASSERT_TRUE(found.ok());
    EXPECT_EQ(found->prefix_blocks, 0u) << "erased " << key.ToHex() << " came back";
    EXPECT_FALSE(daemon_->nvme()->Find(key).has_value()) << key.ToHex();
  }
}

}  // namespace
}  // namespace kvtier::testing

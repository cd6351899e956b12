// The peer tier against a peer server in this process, over a real UCX
// transport on loopback (TCP, and shared memory with TCP for the
// connection set-up): the handshake, probes, pins and one-sided gets,
// verification, and the faults (a forged peer, a stalled peer, a peer
// that goes away, a corrupt layer).
#include <atomic>
#include <cstdlib>
#include <future>
#include <map>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "common/checksum.h"
#include "common/mutex.h"
#include "tests/testing/counter_of.h"
#include "tests/testing/wait_for.h"
#include "tiers/peer/peer_server.h"
#include "tiers/peer/peer_tier.h"

namespace kvtier {
namespace {

using testing::CounterOf;
using testing::WaitFor;

constexpr NamespaceFingerprint kNs{0x1234, 0x5678};
const std::string kSecret(32, 's');

// Blocks in one region of plain memory, pinned with leases it counts.
class FakeSource final : public PeerSource {
 public:
  explicit FakeSource(size_t bytes) : memory_(bytes) {}

  // A block of `layers` layers of `layer_bytes` at `offset`, its bytes from `seed`.
  void Add(const BlockKey& key, uint64_t offset, uint32_t layers, uint64_t layer_bytes, uint8_t seed) {
    MutexLock lock(mu_);
    Block b{offset, layers, layer_bytes, {}, layers};
    for (uint64_t i = 0; i < layers * layer_bytes; ++i) {
      memory_[offset + i] = static_cast<std::byte>((i * 131 + seed) & 0xff);
    }
    for (uint32_t l = 0; l < layers; ++l) {
      b.layer_sums.push_back(BlockChecksum(std::span(memory_).subspan(offset + l * layer_bytes, layer_bytes)));
    }
    blocks_[key] = b;
  }
  std::span<const std::byte> Bytes(const BlockKey& key) {
    MutexLock lock(mu_);
    const Block& b = blocks_.at(key);
    return std::span(memory_).subspan(b.offset, b.layers * b.layer_bytes);
  }
  void CorruptLayer(const BlockKey& key, uint32_t layer) {
    MutexLock lock(mu_);
    Block& b = blocks_.at(key);
    memory_[b.offset + layer * b.layer_bytes] ^= std::byte{0xff};
  }
  void Stall(bool stall) {
    MutexLock lock(mu_);
    stall_ = stall;
  }
  // Only layers [0, ready) of `key` are written (a block still being saved); more later with Publish.
  void SetReady(const BlockKey& key, uint32_t ready) {
    PublishedListener listener;
    {
      MutexLock lock(mu_);
      blocks_.at(key).ready = ready;
      listener = listener_;
    }
    if (listener) listener(key);
  }
  void SetPublishedListener(PublishedListener listener) override {
    MutexLock lock(mu_);
    listener_ = std::move(listener);
  }
  size_t leases() {
    MutexLock lock(mu_);
    size_t n = 0;
    for (const auto& [reader, held] : leases_) n += held.size();
    return n;
  }
  int ended_readers() {
    MutexLock lock(mu_);
    return ended_;
  }

  std::vector<Region> Regions() const override { return {{7, const_cast<std::byte*>(memory_.data()), memory_.size()}}; }
  std::vector<PeerHeld> Find(const NamespaceFingerprint& ns, std::span<const BlockKey> keys) override {
    MutexLock lock(mu_);
    std::vector<PeerHeld> out;
    for (const BlockKey& k : keys) {
      auto it = blocks_.find(k);
      if (ns != kNs || it == blocks_.end()) {
        out.push_back({});
        continue;
      }
      const Block& b = it->second;
      out.push_back({true, b.layers * b.layer_bytes, b.layers, b.ready, 0});
    }
    return out;
  }
  // Pins of `key` wait until Unhold(key) (held_), or the next one is answered Busy (busy_once_).
  void HoldPins(const BlockKey& key) {
    MutexLock lock(mu_);
    held_keys_.insert(key);
  }
  void Unhold(const BlockKey& key) {
    std::vector<std::pair<uint64_t, PinDone>> waiting;
    {
      MutexLock lock(mu_);
      held_keys_.erase(key);
      waiting.swap(held_[key]);
    }
    for (auto& [reader, done] : waiting) Pin(reader, kNs, key, std::move(done));
  }
  void BusyOnce(const BlockKey& key) {
    MutexLock lock(mu_);
    busy_once_.insert(key);
  }
  void Pin(uint64_t reader, const NamespaceFingerprint& ns, const BlockKey& key, PinDone done) override {
    MutexLock lock(mu_);
    if (stall_) {
      stalled_.push_back(std::move(done));  // never answered
      return;
    }
    if (held_keys_.contains(key)) {
      held_[key].emplace_back(reader, std::move(done));
      return;
    }
    if (busy_once_.erase(key) > 0) {
      PeerPinned busy;
      busy.code = StatusCode::kBusy;
      return done(std::move(busy));
    }
    PeerPinned p;
    auto it = blocks_.find(key);
    if (ns != kNs || it == blocks_.end()) {
      p.code = StatusCode::kNotFound;
    } else {
      const Block& b = it->second;
      p.region = 7;
      p.offset = b.offset;
      p.payload_bytes = b.layers * b.layer_bytes;
      p.layer_count = b.layers;
      p.layers_ready = b.ready;
      p.layer_checksums.assign(b.layer_sums.begin(), b.layer_sums.begin() + b.ready);
      if (b.ready == b.layers) {  // a block still being written has no lease
        p.lease = ++next_lease_;
        leases_[reader].insert(p.lease);
      }
    }
    done(std::move(p));
  }
  void Release(uint64_t reader, std::span<const uint64_t> leases) override {
    MutexLock lock(mu_);
    for (uint64_t l : leases) leases_[reader].erase(l);
  }
  void EndReader(uint64_t reader) override {
    MutexLock lock(mu_);
    leases_.erase(reader);
    ++ended_;
  }
  size_t Taken(uint64_t reader, const NamespaceFingerprint& ns, std::span<const BlockKey> keys) override {
    MutexLock lock(mu_);
    if (ns == kNs) taken_.insert(taken_.end(), keys.begin(), keys.end());
    return 0;
  }
  std::vector<BlockKey> taken() {
    MutexLock lock(mu_);
    return taken_;
  }

 private:
  struct Block {
    uint64_t offset;
    uint32_t layers;
    uint64_t layer_bytes;
    std::vector<uint64_t> layer_sums;
    uint32_t ready;  // layers written
  };
  PublishedListener listener_ GUARDED_BY(mu_);
  std::vector<std::byte> memory_;
  Mutex mu_;
  std::map<BlockKey, Block> blocks_ GUARDED_BY(mu_);
  std::map<uint64_t, std::set<uint64_t>> leases_ GUARDED_BY(mu_);
  std::vector<PinDone> stalled_ GUARDED_BY(mu_);
  std::set<BlockKey> held_keys_ GUARDED_BY(mu_);
  std::map<BlockKey, std::vector<std::pair<uint64_t, PinDone>>> held_ GUARDED_BY(mu_);
  std::set<BlockKey> busy_once_ GUARDED_BY(mu_);
  std::vector<BlockKey> taken_ GUARDED_BY(mu_);  // what readers said they took whole, in order
  uint64_t next_lease_ GUARDED_BY(mu_) = 0;
  int ended_ GUARDED_BY(mu_) = 0;
  bool stall_ GUARDED_BY(mu_) = false;
};

// Reads layers [first, last) of `key` and waits for the outcome.
Result<BlockTier::LayerRead> ReadLayers(PeerTier& tier, const BlockKey& key, uint32_t first, uint32_t last,
                                        std::vector<std::byte>& dst) {
  std::promise<Result<BlockTier::LayerRead>> done;
  Status started = tier.ReadWithLayerChecksums(key, first, last, dst,
                                               [&](Result<BlockTier::LayerRead> r) { done.set_value(std::move(r)); });
  if (!started.ok()) return started;
  return done.get_future().get();
}

class PeerTierTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    ::setenv("UCX_TLS", GetParam(), 1);
    source_.Add(BlockKey{1, 1}, 4096, 4, 64 << 10, 1);
    source_.Add(BlockKey{1, 2}, 1 << 20, 36, 8 << 10, 2);
    PeerServerOptions o;
    o.listen = "127.0.0.1:0";
    o.secret = kSecret;
    auto server = PeerServer::Start(o, source_);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(*server);
  }
  void TearDown() override { ::unsetenv("UCX_TLS"); }

  std::unique_ptr<PeerTier> OpenTier(std::string secret = kSecret, uint64_t node_id = 0,
                                     std::chrono::milliseconds timeout = std::chrono::milliseconds(2000)) {
    PeerTierOptions o;
    o.members = {server_->address()};
    o.secret = std::move(secret);
    o.node_id = node_id;
    o.timeout = timeout;
    o.retry = std::chrono::milliseconds(100);
    o.linger = std::chrono::milliseconds(20);
    o.probe_timeout = std::chrono::milliseconds(2000);
    auto tier = PeerTier::Open(o);
    EXPECT_TRUE(tier.ok()) << tier.status().ToString();
    return tier.ok() ? std::move(*tier) : nullptr;
  }

  FakeSource source_{4 << 20};
  std::unique_ptr<PeerServer> server_;
};

TEST_P(PeerTierTest, AProbedBlockIsPulledByteExactWithItsLayersVerified) {
  auto tier = OpenTier();
  ASSERT_TRUE(WaitFor([&] { return tier->connected() == 1; }));
  const BlockKey keys[] = {{1, 1}, {1, 2}, {9, 9}};
  EXPECT_FALSE(tier->Find(keys[0]).has_value());  // nothing known before a probe
  tier->Probe(kNs, keys);
  ASSERT_TRUE(tier->Find(keys[0]).has_value());
  ASSERT_TRUE(tier->Find(keys[1]).has_value());
  EXPECT_FALSE(tier->Find(keys[2]).has_value());
  EXPECT_EQ(tier->Find(keys[1])->layer_count, 36u);

  for (const BlockKey& key : {keys[0], keys[1]}) {
    std::span<const std::byte> want = source_.Bytes(key);
    std::vector<std::byte> dst(want.size());
    auto read = ReadLayers(*tier, key, 0, 0, dst);
    ASSERT_TRUE(read.ok()) << read.status().ToString();
    EXPECT_EQ(read->bytes, want.size());
    EXPECT_TRUE(std::equal(dst.begin(), dst.end(), want.begin()));
    EXPECT_EQ(read->layer_checksums.size(), tier->Find(key)->layer_count);
  }
  // One layer of the middle of a 36-layer block: only its bytes.
  std::vector<std::byte> layer(8 << 10);
  auto read = ReadLayers(*tier, keys[1], 17, 18, layer);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  auto want = source_.Bytes(keys[1]).subspan(17 * (8 << 10), 8 << 10);
  EXPECT_TRUE(std::equal(layer.begin(), layer.end(), want.begin()));
  EXPECT_EQ(read->layer_checksums.at(0), BlockChecksum(want));

  // The pins end `linger` after the last read.
  EXPECT_TRUE(WaitFor([&] { return source_.leases() == 0; }));
  EXPECT_EQ(CounterOf(*tier, "peer.read_bytes"),
            static_cast<int64_t>(source_.Bytes(keys[0]).size() + source_.Bytes(keys[1]).size() + (8 << 10)));
  EXPECT_GE(CounterOf(*server_, "peer_server.pins"), 2);
}

TEST_P(PeerTierTest, ManyLayerReadsOfOneBlockShareOnePin) {
  auto tier = OpenTier();
  ASSERT_TRUE(WaitFor([&] { return tier->connected() == 1; }));
  const BlockKey key{1, 2};
  tier->Probe(kNs, std::span(&key, 1));
  std::vector<std::vector<std::byte>> layers(36, std::vector<std::byte>(8 << 10));
  std::vector<std::promise<Status>> done(36);
  for (uint32_t l = 0; l < 36; ++l) {
    ASSERT_TRUE(tier->Read(key, l, l + 1, layers[l],
                           [&done, l](Result<size_t> r) { done[l].set_value(r.ok() ? Status::Ok() : r.status()); })
                    .ok());
  }
  for (uint32_t l = 0; l < 36; ++l) {
    ASSERT_TRUE(done[l].get_future().get().ok()) << l;
    auto want = source_.Bytes(key).subspan(l * (8 << 10), 8 << 10);
    EXPECT_TRUE(std::equal(layers[l].begin(), layers[l].end(), want.begin())) << l;
  }
  EXPECT_EQ(CounterOf(*server_, "peer_server.pins"), 1);
  // Every layer verified under the pin: the peer hears the block was taken, once.
  ASSERT_TRUE(WaitFor([&] { return source_.taken() == std::vector<BlockKey>{key}; }));
  EXPECT_EQ(CounterOf(*tier, "peer.taken"), 1);
  EXPECT_EQ(CounterOf(*server_, "peer_server.taken"), 1);
}

TEST_P(PeerTierTest, ABlockReadInPartOrWithACorruptLayerIsNeverToldAsTaken) {
  auto tier = OpenTier();
  ASSERT_TRUE(WaitFor([&] { return tier->connected() == 1; }));
  const BlockKey part{1, 2}, corrupt{1, 1};
  const BlockKey keys[] = {part, corrupt};
  tier->Probe(kNs, keys);
  std::vector<std::byte> dst(36 * (8 << 10));
  ASSERT_TRUE(ReadLayers(*tier, part, 0, 35, dst).ok());  // all but the last layer
  source_.CorruptLayer(corrupt, 3);
  EXPECT_EQ(ReadLayers(*tier, corrupt, 0, 0, dst).status().code(), StatusCode::kIoError);
  // Then a block read whole: its Taken is the only one (and it comes after any the others could have caused).
  source_.Add(BlockKey{2, 2}, 2 << 20, 2, 64 << 10, 3);
  const BlockKey other{2, 2};
  tier->Probe(kNs, std::span(&other, 1));
  ASSERT_TRUE(ReadLayers(*tier, other, 0, 0, dst).ok());
  ASSERT_TRUE(WaitFor([&] { return !source_.taken().empty(); }));
  EXPECT_TRUE(WaitFor([&] { return source_.leases() == 0; }));
  EXPECT_EQ(source_.taken(), std::vector<BlockKey>{other}) << "a part, or a layer that did not verify, is not taken";
}

TEST_P(PeerTierTest, APeerWithoutTheSecretIsRefusedAndLearnsNothing) {
  auto forged = OpenTier(std::string(32, 'x'));
  ASSERT_TRUE(WaitFor([&] { return CounterOf(*forged, "peer.refused") >= 1; }));
  EXPECT_EQ(forged->connected(), 0u);
  const BlockKey key{1, 1};
  forged->Probe(kNs, std::span(&key, 1));
  EXPECT_FALSE(forged->Find(key).has_value());
  std::vector<std::byte> dst(256 << 10);
  EXPECT_EQ(forged->Read(key, 0, 0, dst, [](Result<size_t>) {}).code(), StatusCode::kNotFound);
  // The forged reader never got past the server's handshake either.
  EXPECT_EQ(CounterOf(*server_, "peer_server.pins"), 0);
  EXPECT_EQ(CounterOf(*server_, "peer_server.queries"), 0);
}

TEST_P(PeerTierTest, ACorruptLayerFailsTheReadAndTheBlockIsForgotten) {
  auto tier = OpenTier();
  ASSERT_TRUE(WaitFor([&] { return tier->connected() == 1; }));
  const BlockKey key{1, 1};
  tier->Probe(kNs, std::span(&key, 1));
  source_.CorruptLayer(key, 2);
  std::vector<std::byte> dst(256 << 10);
  auto read = ReadLayers(*tier, key, 0, 0, dst);
  EXPECT_EQ(read.status().code(), StatusCode::kIoError);
  EXPECT_FALSE(tier->Find(key).has_value());
  EXPECT_EQ(CounterOf(*tier, "peer.corrupt"), 1);
  // The layers before it verify on their own.
  tier->Probe(kNs, std::span(&key, 1));
  EXPECT_TRUE(ReadLayers(*tier, key, 0, 2, dst).ok());
}

TEST_P(PeerTierTest, AStalledPeerFailsItsReadsWithinTheTimeoutAndIsForgotten) {
  auto tier = OpenTier(kSecret, 0, std::chrono::milliseconds(300));
  ASSERT_TRUE(WaitFor([&] { return tier->connected() == 1; }));
  const BlockKey key{1, 1};
  tier->Probe(kNs, std::span(&key, 1));
  source_.Stall(true);
  std::vector<std::byte> dst(256 << 10);
  auto read = ReadLayers(*tier, key, 0, 0, dst);
  EXPECT_EQ(read.status().code(), StatusCode::kIoError) << read.status().ToString();
  EXPECT_EQ(CounterOf(*tier, "peer.stalls"), 1);
  EXPECT_FALSE(tier->Find(key).has_value());
  // Its side ends the reader's pins when the connection goes; the tier comes back.
  EXPECT_TRUE(WaitFor([&] { return source_.ended_readers() >= 1; }));
  source_.Stall(false);
  ASSERT_TRUE(WaitFor([&] { return tier->connected() == 1; }));
  tier->Probe(kNs, std::span(&key, 1));
  EXPECT_TRUE(ReadLayers(*tier, key, 0, 0, dst).ok());
}

TEST_P(PeerTierTest, APeerThatGoesAwayFailsReadsAndItsReadersPinsEnd) {
  auto tier = OpenTier();
  ASSERT_TRUE(WaitFor([&] { return tier->connected() == 1; }));
  const BlockKey key{1, 2};
  tier->Probe(kNs, std::span(&key, 1));
  server_.reset();  // the peer's daemon stops: its readers' pins end with it
  EXPECT_GE(source_.ended_readers(), 1);
  ASSERT_TRUE(WaitFor([&] { return tier->connected() == 0; }));
  std::vector<std::byte> dst(36 * (8 << 10));
  auto read = ReadLayers(*tier, key, 0, 0, dst);
  EXPECT_FALSE(read.ok());
  EXPECT_FALSE(tier->Find(key).has_value());
}

TEST_P(PeerTierTest, AReaderThatGoesAwayHasItsPinsEnded) {
  auto tier = OpenTier();
  ASSERT_TRUE(WaitFor([&] { return tier->connected() == 1; }));
  const BlockKey key{1, 2};
  tier->Probe(kNs, std::span(&key, 1));
  std::vector<std::byte> layer(8 << 10);
  ASSERT_TRUE(ReadLayers(*tier, key, 0, 1, layer).ok());
  tier.reset();
  EXPECT_TRUE(WaitFor([&] { return source_.leases() == 0 && source_.ended_readers() >= 1; }));
  EXPECT_TRUE(WaitFor([&] { return CounterOf(*server_, "peer_server.readers") == 0; }));
}

TEST_P(PeerTierTest, ThisNodeInItsOwnMemberListIsSkipped) {
  auto tier = OpenTier(kSecret, server_->node_id());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(tier->connected(), 0u);
  EXPECT_EQ(CounterOf(*tier, "peer.refused"), 0);
}

TEST_P(PeerTierTest, LayersOfABlockStillBeingWrittenAreReadAsTheyAreWritten) {
  auto tier = OpenTier();
  ASSERT_TRUE(WaitFor([&] { return tier->connected() == 1; }));
  const BlockKey key{1, 2};  // 36 layers of 8 KiB
  source_.SetReady(key, 1);
  tier->Probe(kNs, std::span(&key, 1));
  ASSERT_TRUE(tier->Find(key).has_value());
  EXPECT_EQ(tier->Find(key)->layer_count, 36u);
  std::vector<std::byte> first(8 << 10);
  ASSERT_TRUE(ReadLayers(*tier, key, 0, 1, first).ok());
  auto want = source_.Bytes(key);
  EXPECT_TRUE(std::equal(first.begin(), first.end(), want.begin()));

  // Layer 5 waits for its writer; it comes once layers [0, 6) are written.
  std::vector<std::byte> fifth(8 << 10);
  std::promise<Result<size_t>> done;
  auto arrived = done.get_future();
  ASSERT_TRUE(tier->Read(key, 5, 6, fifth, [&](Result<size_t> r) { done.set_value(std::move(r)); }).ok());
  EXPECT_EQ(arrived.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout);
  source_.SetReady(key, 3);
  EXPECT_EQ(arrived.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout);
  source_.SetReady(key, 6);
  ASSERT_EQ(arrived.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  auto got = arrived.get();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(std::equal(fifth.begin(), fifth.end(), want.begin() + 5 * (8 << 10)));
  // The whole block once the last layer is in.
  std::vector<std::byte> whole(want.size());
  std::promise<Result<BlockTier::LayerRead>> all;
  auto all_done = all.get_future();
  ASSERT_TRUE(tier->ReadWithLayerChecksums(key, 0, 0, whole,
                                           [&](Result<BlockTier::LayerRead> r) { all.set_value(std::move(r)); })
                  .ok());
  source_.SetReady(key, 36);
  auto read = all_done.get();
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_TRUE(std::equal(whole.begin(), whole.end(), want.begin()));
  EXPECT_GE(CounterOf(*tier, "peer.watches"), 2);
  EXPECT_GE(CounterOf(*server_, "peer_server.watches"), 2);
}

TEST_P(PeerTierTest, ABlockWhoseLayersStopComingFailsItsReadsAloneWithinTheTimeout) {
  auto tier = OpenTier(kSecret, 0, std::chrono::milliseconds(300));
  ASSERT_TRUE(WaitFor([&] { return tier->connected() == 1; }));
  const BlockKey stuck{1, 2}, whole{1, 1};
  source_.SetReady(stuck, 1);
  const BlockKey keys[] = {whole, stuck};
  tier->Probe(kNs, keys);
  std::vector<std::byte> layer(8 << 10);
  auto read = ReadLayers(*tier, stuck, 3, 4, layer);
  EXPECT_EQ(read.status().code(), StatusCode::kIoError) << read.status().ToString();
  EXPECT_EQ(CounterOf(*tier, "peer.watch_timeouts"), 1);
  EXPECT_EQ(CounterOf(*tier, "peer.stalls"), 0);
  EXPECT_EQ(tier->connected(), 1u) << "the peer answered: it is not closed for a slow writer";
  std::vector<std::byte> dst(256 << 10);
  EXPECT_TRUE(ReadLayers(*tier, whole, 0, 0, dst).ok());
}

// A read queued behind another block's pin whose own pin failed fails,
// even when a later read of the same block pinned it again meanwhile; the
// new pin is released once its own read is done.
TEST_P(PeerTierTest, AReadWhosePinFailedNeverRidesALaterPinOfItsBlock) {
  auto tier = OpenTier();
  ASSERT_TRUE(WaitFor([&] { return tier->connected() == 1; }));
  const BlockKey slow{1, 1}, block{1, 2};
  const BlockKey keys[] = {slow, block};
  tier->Probe(kNs, keys);
  source_.HoldPins(slow);
  source_.BusyOnce(block);
  std::vector<std::byte> head(256 << 10), first(8 << 10), second(8 << 10);
  std::promise<Result<size_t>> head_done, first_done, second_done;
  ASSERT_TRUE(tier->Read(slow, 0, 0, head, [&](Result<size_t> r) { head_done.set_value(std::move(r)); }).ok());
  ASSERT_TRUE(tier->Read(block, 0, 1, first, [&](Result<size_t> r) { first_done.set_value(std::move(r)); }).ok());
  // The first pin of `block` is answered Busy while its read waits behind `slow`'s pin.
  ASSERT_TRUE(WaitFor([&] { return CounterOf(*server_, "peer_server.pin_misses") == 1; }));
  ASSERT_TRUE(tier->Read(block, 1, 2, second, [&](Result<size_t> r) { second_done.set_value(std::move(r)); }).ok());
  ASSERT_TRUE(WaitFor([&] { return CounterOf(*server_, "peer_server.pins") == 3; }));
  source_.Unhold(slow);
  EXPECT_TRUE(head_done.get_future().get().ok());
  EXPECT_EQ(first_done.get_future().get().status().code(), StatusCode::kIoError);
  auto read = second_done.get_future().get();
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  auto want = source_.Bytes(block).subspan(8 << 10, 8 << 10);
  EXPECT_TRUE(std::equal(second.begin(), second.end(), want.begin()));
  EXPECT_TRUE(WaitFor([&] { return source_.leases() == 0; })) << "a pin outlived its reads";
}

// Discovery: members that `discover` answers are connected like configured
// ones, and one it stops answering is closed and dropped (its blocks
// forgotten); one it answers again comes back. A failed answer changes
// nothing.
TEST_P(PeerTierTest, DiscoveredMembersJoinAndLeaveWithTheirDiscovery) {
  struct Answers {
    Mutex mu;
    Result<std::vector<std::string>> now GUARDED_BY(mu) = std::vector<std::string>{};
  };
  auto answers = std::make_shared<Answers>();
  auto answer = [&](Result<std::vector<std::string>> r) {
    MutexLock lock(answers->mu);
    answers->now = std::move(r);
  };
  std::atomic<int> left{0};
  PeerTierOptions o;
  o.secret = kSecret;
  o.retry = std::chrono::milliseconds(100);
  o.probe_timeout = std::chrono::milliseconds(2000);
  o.discover_interval = std::chrono::milliseconds(20);
  o.discover = [answers]() -> Result<std::vector<std::string>> {
    MutexLock lock(answers->mu);
    return answers->now;
  };
  o.leave = [&left] { left.fetch_add(1); };
  auto opened = PeerTier::Open(o);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  auto tier = std::move(*opened);
  const BlockKey key{1, 1};
  ASSERT_TRUE(WaitFor([&] { return CounterOf(*tier, "peer.discoveries") >= 2; }));
  EXPECT_EQ(CounterOf(*tier, "peer.members"), 0);
  tier->Probe(kNs, std::span(&key, 1));
  EXPECT_FALSE(tier->Find(key).has_value()) << "no member yet";

  answer(std::vector<std::string>{server_->address(), "not an address"});
  ASSERT_TRUE(WaitFor([&] { return tier->connected() == 1; }));
  EXPECT_EQ(CounterOf(*tier, "peer.members"), 1) << "the bad address is left out";
  tier->Probe(kNs, std::span(&key, 1));
  ASSERT_TRUE(tier->Find(key).has_value());

  // Discovery fails for a while: the member stays.
  answer(Unavailable("the registry does not answer"));
  const int64_t failures = CounterOf(*tier, "peer.discovery_failures");
  ASSERT_TRUE(WaitFor([&] { return CounterOf(*tier, "peer.discovery_failures") >= failures + 3; }));
  EXPECT_EQ(tier->connected(), 1u);

  // It is no longer answered: closed, its blocks forgotten, never connected again while absent.
  answer(std::vector<std::string>{});
  // (The gauge is set at the end of the node thread's step that closes the connection.)
  ASSERT_TRUE(WaitFor([&] { return tier->connected() == 0 && CounterOf(*tier, "peer.members") == 0; }));
  EXPECT_FALSE(tier->Find(key).has_value());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // past retry_ms
  EXPECT_EQ(tier->connected(), 0u);

  // Answered again: back.
  answer(std::vector<std::string>{server_->address()});
  ASSERT_TRUE(WaitFor([&] { return tier->connected() == 1; }));
  tier->Probe(kNs, std::span(&key, 1));
  EXPECT_TRUE(tier->Find(key).has_value());
  tier.reset();
  EXPECT_EQ(left.load(), 1) << "leave runs once at close";
}

// A second server on an address already served fails to start with the
// reason, and undoes what it registered (UCX aborts the process at its
// cleanup if a region is left registered).
TEST_P(PeerTierTest, AServerOnAnAddressAlreadyServedFailsCleanly) {
  PeerServerOptions o;
  o.listen = server_->address();
  o.secret = kSecret;
  FakeSource other(1 << 20);
  auto second = PeerServer::Start(o, other);
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("listening on " + server_->address()), std::string::npos)
      << second.status().ToString();
  // The first one still serves.
  auto tier = OpenTier();
  ASSERT_TRUE(WaitFor([&] { return tier->connected() == 1; }));
}

// What the members' events say they hold, as a test sets it: per member,
// how many leading keys it holds (absent: nothing known).
class FakeHolders final : public PeerHolders {
 public:
  void Follow(const std::string& member, const std::string& endpoint, const std::string& replay) override {
    MutexLock lock(mu_);
    followed_[member] = endpoint + " " + replay;
  }
  void Unfollow(const std::string& member) override {
    MutexLock lock(mu_);
    followed_.erase(member);
    unfollowed_.push_back(member);
  }
  std::optional<size_t> Leading(const std::string& member, std::span<const BlockKey> keys) const override {
    MutexLock lock(mu_);
    auto it = leading_.find(member);
    if (it == leading_.end()) return std::nullopt;
    return std::min(it->second, keys.size());
  }
  void Set(const std::string& member, std::optional<size_t> leading) {
    MutexLock lock(mu_);
    if (leading)
      leading_[member] = *leading;
    else
      leading_.erase(member);
  }
  std::map<std::string, std::string> followed() const {
    MutexLock lock(mu_);
    return followed_;
  }
  std::vector<std::string> unfollowed() const {
    MutexLock lock(mu_);
    return unfollowed_;
  }

 private:
  mutable Mutex mu_;
  std::map<std::string, std::string> followed_ GUARDED_BY(mu_);
  std::vector<std::string> unfollowed_ GUARDED_BY(mu_);
  std::map<std::string, size_t> leading_ GUARDED_BY(mu_);
};

// With three members and a fan-out of one, a probe asks the member whose
// events say it holds the prefix; else one nothing is known of before one
// known not to hold it; without knowledge, the same member for the same
// prefix. A member's Welcome names its events (a wildcard host becomes the
// member's) and the tier follows them while connected.
TEST_P(PeerTierTest, AProbeAsksTheMembersTheEventsSayHoldThePrefix) {
  FakeSource b_source(1 << 20), c_source(1 << 20);
  const BlockKey key{1, 1};
  b_source.Add(key, 0, 4, 4096, 3);
  c_source.Add(key, 0, 4, 4096, 4);
  std::vector<std::unique_ptr<PeerServer>> others;
  for (auto [source, endpoint] : {std::pair{&b_source, "tcp://*:7001"}, std::pair{&c_source, "tcp://10.1.2.3:7002"}}) {
    PeerServerOptions o;
    o.listen = "127.0.0.1:0";
    o.secret = kSecret;
    o.events_endpoint = endpoint;
    o.events_replay_endpoint = std::string(endpoint) + "9";
    auto server = PeerServer::Start(o, *source);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    others.push_back(std::move(*server));
  }
  const std::string a = server_->address(), b = others[0]->address(), c = others[1]->address();
  auto holders = std::make_shared<FakeHolders>();
  PeerTierOptions o;
  o.members = {a, b, c};
  o.secret = kSecret;
  o.retry = std::chrono::milliseconds(100);
  o.probe_timeout = std::chrono::milliseconds(2000);
  o.probe_fanout = 1;
  o.holders = holders;
  auto opened = PeerTier::Open(o);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  auto tier = std::move(*opened);
  ASSERT_TRUE(WaitFor([&] { return tier->connected() == 3; }));
  // a's Welcome names no events: it is not followed.
  EXPECT_EQ(holders->followed(), (std::map<std::string, std::string>{{b, "tcp://127.0.0.1:7001 tcp://127.0.0.1:70019"},
                                                                     {c, "tcp://10.1.2.3:7002 tcp://10.1.2.3:70029"}}));
  auto queries = [&](const PeerServer& s) { return CounterOf(s, "peer_server.queries"); };

  // c's events say it holds the key, b's that it does not: c alone is asked.
  holders->Set(b, 0);
  holders->Set(c, 1);
  tier->Probe(kNs, std::span(&key, 1));
  EXPECT_EQ(queries(*others[1]), 1);
  EXPECT_EQ(queries(*others[0]) + queries(*server_), 0);
  ASSERT_TRUE(tier->Find(key).has_value());
  std::vector<std::byte> dst(4 * 4096);
  auto read = ReadLayers(*tier, key, 0, 0, dst);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_TRUE(std::equal(dst.begin(), dst.end(), c_source.Bytes(key).begin()));
  EXPECT_EQ(CounterOf(*tier, "peer.probe_asks"), 1);

  // Nobody's events have it: a (no events, nothing known) before b and c
  // (known not to hold it: only a block still being written could be there).
  const BlockKey other{5, 5};
  holders->Set(c, 0);
  tier->Probe(kNs, std::span(&other, 1));
  EXPECT_EQ(queries(*server_), 1);
  EXPECT_EQ(queries(*others[0]), 0);
  EXPECT_EQ(queries(*others[1]), 1);

  // Nothing known of anyone: one member, the same one for the same prefix.
  holders->Set(b, std::nullopt);
  holders->Set(c, std::nullopt);
  auto counts = [&] { return std::vector<int64_t>{queries(*server_), queries(*others[0]), queries(*others[1])}; };
  const std::vector<int64_t> q0 = counts();
  tier->Probe(kNs, std::span(&other, 1));
  const std::vector<int64_t> q1 = counts();
  tier->Probe(kNs, std::span(&other, 1));
  const std::vector<int64_t> q2 = counts();
  int64_t asked_first = 0;
  for (size_t i = 0; i < 3; ++i) {
    asked_first += q1[i] - q0[i];
    EXPECT_EQ(q2[i] - q1[i], q1[i] - q0[i]) << "member " << i << " asked in one round and not the other";
  }
  EXPECT_EQ(asked_first, 1);

  // c goes away: its events are no longer followed.
  others[1].reset();
  ASSERT_TRUE(WaitFor([&] { return !holders->unfollowed().empty(); }));
  EXPECT_EQ(holders->unfollowed(), std::vector<std::string>{c});
  EXPECT_FALSE(holders->followed().contains(c));
}

// A fan-out that would reach every member asks only the holder when one
// holds the whole prefix, and every member (holders first) when none does.
TEST_P(PeerTierTest, AMemberHoldingTheWholePrefixIsAskedAlone) {
  FakeSource a_source(1 << 20), b_source(1 << 20);
  const BlockKey keys[] = {{1, 1}, {1, 2}};
  a_source.Add(keys[0], 0, 4, 4096, 5);
  a_source.Add(keys[1], 1 << 16, 4, 4096, 6);
  std::vector<std::unique_ptr<PeerServer>> servers;
  for (FakeSource* source : {&a_source, &b_source}) {
    PeerServerOptions so;
    so.listen = "127.0.0.1:0";
    so.secret = kSecret;
    so.events_endpoint = "tcp://127.0.0.1:7001";  // followed (FakeHolders), never connected
    so.events_replay_endpoint = "tcp://127.0.0.1:7002";
    auto server = PeerServer::Start(so, *source);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    servers.push_back(std::move(*server));
  }
  const std::string a = servers[0]->address(), b = servers[1]->address();
  auto holders = std::make_shared<FakeHolders>();
  PeerTierOptions o;
  o.members = {a, b};
  o.secret = kSecret;
  o.probe_timeout = std::chrono::milliseconds(2000);
  o.probe_fanout = 3;
  o.holders = holders;
  auto opened = PeerTier::Open(o);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  auto tier = std::move(*opened);
  ASSERT_TRUE(WaitFor([&] { return tier->connected() == 2 && holders->followed().size() == 2; }));
  holders->Set(a, 2);
  holders->Set(b, 0);
  tier->Probe(kNs, keys);
  EXPECT_EQ(CounterOf(*servers[0], "peer_server.queries"), 1);
  EXPECT_EQ(CounterOf(*servers[1], "peer_server.queries"), 0);
  EXPECT_TRUE(tier->Find(keys[1]).has_value());

  holders->Set(a, 1);  // nobody holds all of it: both are asked
  const BlockKey other[] = {{1, 1}, {7, 7}};
  tier->Probe(kNs, other);
  EXPECT_EQ(CounterOf(*servers[0], "peer_server.queries"), 2);
  EXPECT_EQ(CounterOf(*servers[1], "peer_server.queries"), 1);
}

INSTANTIATE_TEST_SUITE_P(Transports, PeerTierTest, ::testing::Values("tcp", "shm,tcp"),
                         [](const auto& info) { return std::string(info.index == 0 ? "tcp" : "shm"); });

}  // namespace
}  // namespace kvtier

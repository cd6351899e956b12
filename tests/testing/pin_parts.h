// PinParts: the engine's pin path without an Engine, as a base for the
// tests of the parts that pin (the Pinner, the Holder): index shards over
// a test arena, a MapTier below behind a gate (GatedTier: its reads wait
// while it is closed), and a real Promoter and Pinner wired to each other
// as the engine wires them, on a FakeClock. The Pinner's probe and use
// hooks are recorded.
#pragma once

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "common/checksum.h"
#include "daemon/engine/block_index.h"
#include "daemon/engine/pinner.h"
#include "daemon/engine/promoter.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/index_shards.h"
#include "tests/testing/map_tier.h"
#include "tests/testing/test_daemon.h"
#include "tiers/forwarding_tier.h"

namespace kvtier::testing {

// A tier whose reads wait while it is closed (as a slow tier's do): Open
// starts the reads held meanwhile.
class GatedTier final : public ForwardingTier {
 public:
  using ForwardingTier::ForwardingTier;
  std::atomic<int> reads{0};

  void Close() {
    std::lock_guard lock(mu_);
    closed_ = true;
  }
  void Open() {
    std::vector<std::function<void()>> held;
    {
      std::lock_guard lock(mu_);
      closed_ = false;
      held.swap(held_);
    }
    for (auto& start : held) start();
  }
  size_t held() {
    std::lock_guard lock(mu_);
    return held_.size();
  }

  Status Read(const BlockKey& key, uint32_t first_layer, uint32_t last_layer, std::span<std::byte> dst,
              ReadDone done) override {
    ++reads;
    {
      std::lock_guard lock(mu_);
      if (closed_) {
        held_.push_back([this, key, first_layer, last_layer, dst, done = std::move(done)]() mutable {
          ForwardingTier::Read(key, first_layer, last_layer, dst, std::move(done)).IgnoreError();
        });
        return Status::Ok();
      }
    }
    return ForwardingTier::Read(key, first_layer, last_layer, dst, std::move(done));
  }
  // The base class's: Read, then each layer hashed.
  Status ReadWithLayerChecksums(const BlockKey& key, uint32_t first_layer, uint32_t last_layer,
                                std::span<std::byte> dst, LayerReadDone done) override {
    return BlockTier::ReadWithLayerChecksums(key, first_layer, last_layer, dst, std::move(done));
  }

 private:
  std::mutex mu_;
  bool closed_ = false;
  std::vector<std::function<void()>> held_;
};

class PinParts {
 protected:
  static constexpr uint32_t kLayers = 4;
  static constexpr uint64_t kLayerBytes = 4 << 10;
  static constexpr uint64_t kBlockBytes = kLayers * kLayerBytes;
  static constexpr size_t kBlocks = 8;  // the arena's size, in blocks
  static constexpr size_t kShards = 2;
  static constexpr ConnectionId kWriter = 7;

  PinParts() {
    host_ = OpenTestHostTier(kBlocks * kBlockBytes);
    shards_ = MakeShards(*host_, kShards);
    level_.tier = &below_;
    Promoter::Hooks hooks;
    hooks.io_started = [this] { ++io_started_; };
    hooks.io_finished = [this] { ++io_finished_; };
    hooks.allocate = [this](uint64_t bytes) { return host_->Allocate(bytes); };
    hooks.source = [this](size_t) -> TierLevel& { return level_; };
    hooks.find_below = [this](const BlockKey& key, const NamespaceFingerprint& ns) { return FindOutside(key, ns); };
    hooks.pin = [this](BlockIndex& shard, ConnectionId connection, const BlockKey& key, uint64_t now_us,
                       bool with_layers) {
      shard.mu.AssertHeld();  // the promoter calls it under the shard's lock
      return pinner_->PinLocked(shard, connection, key, now_us, with_layers);
    };
    hooks.layer_count = LayerCount;
    hooks.next_handle = [this] { return next_handle_++; };
    hooks.prefetch_read_ended = [](bool) {};
    promoter_ = std::make_unique<Promoter>(shards_, *host_, clock_, retries_, kBlocks * kBlockBytes, counters_,
                                           std::move(hooks));
    Pinner::Hooks pins;
    pins.find_outside = [this](const BlockKey& key, const NamespaceFingerprint& ns) { return FindOutside(key, ns); };
    pins.layer_count = LayerCount;
    pins.probe = [this](const NamespaceFingerprint&, std::span<const BlockKey> keys) {
      std::lock_guard lock(mu_);
      probed_.insert(probed_.end(), keys.begin(), keys.end());
    };
    pins.note_prefetch_use = [this] { ++prefetch_uses_; };
    pins.uses_noted = [this] { ++uses_noted_; };
    pinner_ = std::make_unique<Pinner>(shards_, clock_, *promoter_, counters_, std::move(pins));
  }
  ~PinParts() {
    below_.Open();
    retries_.Stop();
    WaitIdle();
  }

  static BlockKey Key(uint64_t i) { return BlockKey{0x914, i}; }
  static std::vector<std::byte> BlockBytes(uint64_t i) { return LayeredBlockBytes(i, kBlockBytes, kLayerBytes); }
  static std::vector<uint64_t> LayerSums(const std::vector<std::byte>& bytes) {
    std::vector<uint64_t> sums;
    for (uint32_t l = 0; l < kLayers; ++l) {
      sums.push_back(BlockChecksum(std::span<const std::byte>(bytes).subspan(l * kLayerBytes, kLayerBytes)));
    }
    return sums;
  }
  static uint32_t LayerCount(const NamespaceFingerprint&, uint64_t size) { return size == kBlockBytes ? kLayers : 1u; }

  std::optional<Located> FindOutside(const BlockKey& key, const NamespaceFingerprint& ns) {
    std::optional<BlockTier::BlockInfo> info = below_.Find(key);
    if (info && info->ns == ns) return Located{0, *info};
    return std::nullopt;
  }
  BlockIndex& ShardOf(const BlockKey& key) { return *shards_[ShardIndexOf(key, kShards)]; }

  // Block `i` written and committed in the host tier under `ns`, with the
  // checksum of each layer, as a Reserve and a Commit leave it.
  void Commit(uint64_t i, const NamespaceFingerprint& ns) {
    const std::vector<std::byte> bytes = BlockBytes(i);
    BlockIndex& shard = ShardOf(Key(i));
    MutexLock lock(shard.mu);
    ASSERT_TRUE(shard.Reserve(Key(i), ns, kBlockBytes, kWriter).ok());
    auto it = shard.index.find(Key(i));
    Result<HostTier::Extent> extent = host_->Allocate(kBlockBytes);
    ASSERT_TRUE(extent.ok());
    it->second.extent = *extent;
    it->second.allocated = true;
    std::copy(bytes.begin(), bytes.end(), host_->Bytes(*extent).begin());
    shard.CommitReserved(it, kWriter, BlockChecksum(bytes), LayerSums(bytes), next_handle_++, clock_.NowUs());
  }
  // Block `i` stored in the tier below under `ns`.
  void Store(uint64_t i, const NamespaceFingerprint& ns) {
    const std::vector<std::byte> bytes = BlockBytes(i);
    ASSERT_TRUE(map_.Write(
                        ns, Key(i), kLayers, bytes, [](Status) {}, BlockChecksum(bytes))
                    .ok());
  }
  // Committed block `i` of the host tier leaves the index for the tier
  // below, its write in flight (kDemoting), as an eviction leaves it.
  void BeginDemotion(uint64_t i) {
    BlockIndex& shard = ShardOf(Key(i));
    MutexLock lock(shard.mu);
    const BlockEntry victim = shard.BeginDemotion(shard.index.find(Key(i)), 0);
    host_->Free(victim.extent);
  }
  // Ends the demotion of block `i` and runs the pins that waited for it.
  // Returns how many there were.
  size_t EndDemotion(uint64_t i) {
    BlockIndex& shard = ShardOf(Key(i));
    std::vector<std::function<void()>> waiters;
    {
      MutexLock lock(shard.mu);
      std::optional<BlockIndex::Demoting> ended = shard.EndDemotion(Key(i));
      if (ended) waiters = std::move(ended->waiters);
    }
    for (auto& retry : waiters) retry();
    return waiters.size();
  }
  // The host entry of `key`, if there is one.
  std::optional<BlockEntry> Entry(const BlockKey& key) { return ::kvtier::testing::EntryOf(shards_, key); }
  std::vector<std::byte> Arena(uint64_t offset, uint64_t length) {
    std::span<std::byte> bytes = SlotBytes(*host_, offset, length);
    return std::vector<std::byte>(bytes.begin(), bytes.end());
  }
  // Every read started has ended (its waiters resolved first).
  void WaitIdle() {
    while (io_finished_.load() != io_started_.load()) std::this_thread::yield();
  }

  FakeClock clock_;
  ::kvtier::EngineCounters counters_;  // not testing::EngineCounters, the engine stack's reader
  std::unique_ptr<HostTier> host_;
  std::vector<std::unique_ptr<BlockIndex>> shards_;
  MapTier map_;
  GatedTier below_{map_};
  TierLevel level_;
  RetryScheduler retries_{"test.retries", clock_, 64};
  std::atomic<int> io_started_{0}, io_finished_{0}, prefetch_uses_{0}, uses_noted_{0};
  std::atomic<BlockHandle> next_handle_{1};
  std::mutex mu_;
  std::vector<BlockKey> probed_;  // what the Pinner's probe hook was given, guarded by mu_
  std::unique_ptr<Promoter> promoter_;
  std::unique_ptr<Pinner> pinner_;
};

}  // namespace kvtier::testing

// MapTier: a BlockTier kept in a map, defined only for tests: the third
// tier of the tier-stack test (no production code knows it) and one of the
// implementations the tier contract test runs against. Completions run on
// its own thread, as the BlockTier contract asks, and every read checks the
// stored checksum.
//
// It can also stand for a tier above the host (the HBM tier's role, for
// engine tests on machines without a GPU): a capacity (NoSpace past it),
// its own kind and name, and in-place holds (the InPlaceHolds capability) with
// offsets into its own "memory": each stored block gets a fresh offset,
// and a held block that is erased keeps its bytes and its charge until
// the last release (InPlaceBytes reads them as a client would).
#pragma once

#include <cstring>
#include <future>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/checksum.h"
#include "common/worker_pool.h"
#include "tiers/tier.h"

namespace kvtier::testing {

class MapTier final : public BlockTier, public InPlaceHolds {
 public:
  // Returns once every write completion posted before the call has run
  // (they run in order on one thread): a test ends its writers' callbacks
  // before it destroys what they call.
  void WaitForCompletions() {
    std::promise<void> reached;
    std::future<void> done = reached.get_future();
    completions_.Post([&reached] { reached.set_value(); });
    done.wait();
  }

  MapTier() = default;
  MapTier(uint64_t capacity_bytes, std::string name) : capacity_(capacity_bytes), name_(std::move(name)) {}

  std::string_view name() const override { return name_; }
  bool asynchronous() const override { return false; }
  uint64_t capacity_bytes() const override { return capacity_; }
  uint64_t used_bytes() const override {
    std::lock_guard lock(mu_);
    return used_;
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

  Status Write(const NamespaceFingerprint& ns, const BlockKey& key, uint32_t layer_count,
               std::span<const std::byte> payload, WriteDone done, std::optional<uint64_t> payload_checksum) override {
    if (payload.empty() || layer_count == 0 || payload.size() % layer_count != 0) {
      return InvalidArgument("uneven layers");
    }
    Stored stored;
    stored.bytes.assign(payload.begin(), payload.end());
    stored.info = BlockInfo{ns, payload.size(), layer_count, BlockChecksum(stored.bytes)};
    if (payload_checksum && *payload_checksum != stored.info.payload_checksum) {
      return Corruption("bytes changed after their checksum was taken");
    }
    {
      std::lock_guard lock(mu_);
      if (blocks_.count(key) != 0) return AlreadyExists("stored");
      if (used_ + payload.size() > capacity_) return NoSpace("map tier full");
      stored.offset = next_offset_;
      next_offset_ += payload.size();
      used_ += payload.size();
      ++writes_;
      blocks_.emplace(key, std::move(stored));
    }
    completions_.Post([done = std::move(done)] { done(Status::Ok()); });
    return Status::Ok();
  }

  Status Read(const BlockKey& key, uint32_t first_layer, uint32_t last_layer, std::span<std::byte> dst,
              ReadDone done) override {
    std::lock_guard lock(mu_);
    auto it = blocks_.find(key);
    if (it == blocks_.end()) return NotFound("not in the map tier");
    const BlockInfo& info = it->second.info;
    if (first_layer >= last_layer || last_layer > info.layer_count) return InvalidArgument("bad layer range");
    const uint64_t layer_bytes = info.payload_bytes / info.layer_count;
    const uint64_t bytes = (last_layer - first_layer) * layer_bytes;
    if (dst.size() < bytes) return InvalidArgument("destination too small");
    if (BlockChecksum(it->second.bytes) != info.payload_checksum) {
      completions_.Post([done = std::move(done)] { done(Corruption("map tier block rotted")); });
      return Status::Ok();
    }
    std::memcpy(dst.data(), it->second.bytes.data() + first_layer * layer_bytes, bytes);
    ++reads_;
    completions_.Post([done = std::move(done), bytes] { done(size_t{bytes}); });
    return Status::Ok();
  }

  Status Erase(const BlockKey& key) override {
    std::lock_guard lock(mu_);
    auto it = blocks_.find(key);
    if (it == blocks_.end()) return NotFound("not in the map tier");
    if (it->second.holds > 0) {
      const uint64_t offset = it->second.offset;
      dropped_held_.emplace(offset, std::move(it->second));  // charged until released
    } else {
      used_ -= it->second.info.payload_bytes;
    }
    blocks_.erase(it);
    return Status::Ok();
  }

  InPlaceHolds* in_place_holds() override { return this; }
  Result<InPlace> HoldInPlace(const BlockKey& key) override {
    std::lock_guard lock(mu_);
    auto it = blocks_.find(key);
    if (it == blocks_.end()) return NotFound("not in the map tier");
    ++it->second.holds;
    return InPlace{it->second.offset, it->second.info};
  }
  void ReleaseInPlace(const BlockKey& key, uint64_t offset) override {
    std::lock_guard lock(mu_);
    auto it = blocks_.find(key);
    if (it != blocks_.end() && it->second.offset == offset && it->second.holds > 0) {
      --it->second.holds;
      return;
    }
    auto dropped = dropped_held_.find(offset);
    if (dropped == dropped_held_.end()) {
      ++bad_releases_;
      return;
    }
    if (--dropped->second.holds == 0) {
      used_ -= dropped->second.info.payload_bytes;
      dropped_held_.erase(dropped);
    }
  }
  // The bytes at `offset` of a held or stored block (empty: none there).
  std::vector<std::byte> InPlaceBytes(uint64_t offset) const {
    std::lock_guard lock(mu_);
    for (const auto& [key, stored] : blocks_) {
      if (stored.offset == offset) return stored.bytes;
    }
    auto dropped = dropped_held_.find(offset);
    return dropped == dropped_held_.end() ? std::vector<std::byte>{} : dropped->second.bytes;
  }
  // Holds of live and dropped blocks not yet released, and releases of
  // nothing held.
  int64_t holds() const {
    std::lock_guard lock(mu_);
    int64_t n = 0;
    for (const auto& [key, stored] : blocks_) n += stored.holds;
    for (const auto& [offset, stored] : dropped_held_) n += stored.holds;
    return n;
  }
  int64_t bad_releases() const {
    std::lock_guard lock(mu_);
    return bad_releases_;
  }

  WriteTotals write_totals() const override {
    std::lock_guard lock(mu_);
    return WriteTotals{used_, 0};
  }

  void VisitCounters(CounterVisitor& v) const override {
    std::lock_guard lock(mu_);
    v.Visit("maptier.blocks", static_cast<int64_t>(blocks_.size()));
    v.Visit("maptier.writes", writes_);
    v.Visit("maptier.reads", reads_);
  }

  size_t blocks() const {
    std::lock_guard lock(mu_);
    return blocks_.size();
  }

 private:
  struct Stored {
    BlockInfo info;
    std::vector<std::byte> bytes;
    uint64_t offset = 0;
    int64_t holds = 0;
  };
  const uint64_t capacity_ = 1ull << 40;
  const std::string name_ = "maptier";
  mutable std::mutex mu_;
  std::unordered_map<BlockKey, Stored> blocks_;        // guarded by mu_
  std::unordered_map<uint64_t, Stored> dropped_held_;  // guarded by mu_: erased while held, by offset
  uint64_t used_ = 0;                                  // guarded by mu_
  uint64_t next_offset_ = 0;                           // guarded by mu_
  int64_t writes_ = 0, reads_ = 0, bad_releases_ = 0;  // guarded by mu_
  WorkerPool completions_{1};                          // declared last: drained first
};

}  // namespace kvtier::testing

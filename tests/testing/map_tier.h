// MapTier: a BlockTier kept in a map, defined only for tests: the third
// tier of the tier-stack test (no production code knows it) and one of the
// implementations the tier contract test runs against. Completions run on
// its own thread, as the BlockTier contract asks, and every read checks the
// stored checksum.
#pragma once

#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "common/checksum.h"
#include "common/worker_pool.h"
#include "tiers/tier.h"

namespace kvtier::testing {

class MapTier final : public BlockTier {
 public:
  Tier kind() const override { return Tier::kRemote; }
  std::string_view name() const override { return "maptier"; }
  bool asynchronous() const override { return false; }
  uint64_t capacity_bytes() const override { return 1ull << 40; }
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

  Status Write(const NamespaceFingerprint& ns, const BlockKey& key, uint32_t layer_count,
               std::span<const std::byte> payload, WriteDone done,
               std::optional<uint64_t> payload_checksum) override {
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
    used_ -= it->second.info.payload_bytes;
    blocks_.erase(it);
    return Status::Ok();
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
  };
  mutable std::mutex mu_;
  std::unordered_map<BlockKey, Stored> blocks_;  // guarded by mu_
  uint64_t used_ = 0;                             // guarded by mu_
  int64_t writes_ = 0, reads_ = 0;                // guarded by mu_
  WorkerPool completions_{1};                     // declared last: drained first
};

}  // namespace kvtier::testing

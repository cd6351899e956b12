#include "daemon/engine/host_block_tier.h"

#include <cstring>
#include <string>

#include <utility>

#include "common/checksum.h"
#include "daemon/engine/block_index.h"

namespace kvtier {

HostBlockTier::HostBlockTier(const std::vector<std::unique_ptr<BlockIndex>>& shards, HostTier& host, const Clock& clock,
                             Writer& writer, Pinner& pinner, Mover& io, Hooks hooks)
    : shards_(shards),
      host_(host),
      clock_(clock),
      writer_(writer),
      pinner_(pinner),
      io_(io),
      hooks_(std::move(hooks)) {}

BlockIndex& HostBlockTier::ShardFor(const BlockKey& key) const { return ShardOf(shards_, key); }

uint64_t HostBlockTier::capacity_bytes() const { return host_.capacity_bytes(); }
uint64_t HostBlockTier::used_bytes() const { return host_.used_bytes(); }

std::optional<BlockTier::BlockInfo> HostBlockTier::Find(const BlockKey& key) const {
  BlockIndex& shard = ShardFor(key);
  NamespaceFingerprint ns;
  uint64_t size = 0, checksum = 0;
  {
    MutexLock lock(shard.mu);
    auto it = shard.index.find(key);
    if (it == shard.index.end() || !it->second.cached()) return std::nullopt;
    ns = it->second.ns;
    size = it->second.size;
    checksum = it->second.checksum;
  }
  return BlockInfo{ns, size, hooks_.layer_count(ns, size), checksum};
}

void HostBlockTier::ForEachBlock(const BlockVisitor& visit) const {
  std::vector<std::pair<BlockKey, BlockInfo>> blocks;
  for (const auto& shard : shards_) {
    blocks.clear();
    {
      MutexLock lock(shard->mu);
      for (const auto& [key, entry] : shard->index) {
        if (entry.cached()) blocks.emplace_back(key, BlockInfo{entry.ns, entry.size, 1, entry.checksum});
      }
    }
    // The layer split as Find gives it, with no shard lock held.
    for (auto& [key, info] : blocks) {
      info.layer_count = hooks_.layer_count(info.ns, info.payload_bytes);
      visit(key, info);
    }
  }
}

Status HostBlockTier::Write(const NamespaceFingerprint& ns, const BlockKey& key, uint32_t layer_count,
                            std::span<const std::byte> payload, WriteDone done,
                            std::optional<uint64_t> payload_checksum) {
  const uint64_t size = payload.size();
  if (size == 0) return InvalidArgument("host tier: an empty block");
  const uint32_t layers = hooks_.layer_count(ns, size);
  if (layer_count != layers) {
    return InvalidArgument("host tier: block " + key.ToHex() + " of " + std::to_string(size) + " bytes has " +
                           std::to_string(layers) + " layers in its namespace's layout, not " +
                           std::to_string(layer_count));
  }
  if (!io_.TryReserve(0)) return Busy("host tier: its completion queue is full; retry");
  const auto refuse = [this](Status s) {
    io_.Unreserve(0);
    return s;
  };
  const ConnectionId self = kHostTierConnection;
  const SlotGrant grant = writer_.Reserve(self, ns, {&key, 1}, {&size, 1})[0];
  if (!grant.status.ok()) return refuse(grant.status);
  std::span<std::byte> slot = host_.Bytes(HostTier::Extent{grant.offset, size});
  // The block's and its layers' checksums as it is copied (one pass).
  std::vector<uint64_t> layer_sums(layers);
  const uint64_t checksum = CopyWithLayerChecksums(slot, payload, layer_sums);
  if (payload_checksum && *payload_checksum != checksum) {
    writer_.Abort(self, {&key, 1});
    return refuse(Corruption("host tier: block " + key.ToHex() + " does not hash to the checksum it came with"));
  }
  if (layers == 1) layer_sums.clear();  // a block of one layer sends none
  const Status committed = writer_.Commit(self, ns, {&key, 1}, {&size, 1}, {&checksum, 1}, layer_sums)[0];
  if (!committed.ok()) return refuse(committed);
  written_bytes_.fetch_add(size, std::memory_order_relaxed);
  writes_.fetch_add(1, std::memory_order_relaxed);
  hooks_.io_started();
  io_.Submit(0, [this, done = std::move(done)] {
    done(Status::Ok());
    hooks_.io_finished();
  });
  return Status::Ok();
}

Status HostBlockTier::Read(const BlockKey& key, uint32_t first_layer, uint32_t last_layer, std::span<std::byte> dst,
                           ReadDone done) {
  return StartRead(key, first_layer, last_layer, dst, [done = std::move(done)](Result<LayerRead> read) {
    done(read.ok() ? Result<size_t>(read->bytes) : Result<size_t>(read.status()));
  });
}

Status HostBlockTier::ReadWithLayerChecksums(const BlockKey& key, uint32_t first_layer, uint32_t last_layer,
                                             std::span<std::byte> dst, LayerReadDone done) {
  return StartRead(key, first_layer, last_layer, dst, std::move(done));
}

Status HostBlockTier::StartRead(const BlockKey& key, uint32_t first_layer, uint32_t last_layer,
                                std::span<std::byte> dst, LayerReadDone done) {
  BlockIndex& shard = ShardFor(key);
  PinGrant pin;
  uint64_t first_byte = 0, bytes = 0;
  std::vector<uint64_t> sums;  // of the layers read
  {
    MutexLock lock(shard.mu);
    auto it = shard.index.find(key);
    if (it == shard.index.end() || !it->second.cached()) {
      return NotFound("host tier: block " + key.ToHex() + " is not cached");
    }
    const uint32_t layers = hooks_.layer_count(it->second.ns, it->second.size);
    if (first_layer >= last_layer || last_layer > layers) {
      return InvalidArgument("host tier: layers [" + std::to_string(first_layer) + ", " + std::to_string(last_layer) +
                             ") are not within the " + std::to_string(layers) + " layers of block " + key.ToHex());
    }
    const uint64_t layer_bytes = it->second.size / layers;
    first_byte = first_layer * layer_bytes;
    bytes = (last_layer - first_layer) * layer_bytes;
    if (dst.size() < bytes) {
      return InvalidArgument("host tier: " + std::to_string(dst.size()) + " bytes cannot hold the " +
                             std::to_string(bytes) + " asked for");
    }
    sums = Pinner::LayerChecksumsOf(it->second, layers, first_layer, last_layer);
    if (!io_.TryReserve(0)) return Busy("host tier: its completion queue is full; retry");
    pin = pinner_.PinLocked(shard, kHostTierConnection, key, clock_.NowUs());
  }
  reads_.fetch_add(1, std::memory_order_relaxed);
  hooks_.io_started();
  io_.Submit(0, [this, key, pin, first_byte, bytes, dst, count = last_layer - first_layer, sums = std::move(sums),
                 done = std::move(done)]() mutable {
    const std::span<const std::byte> block = host_.Bytes(HostTier::Extent{pin.offset, pin.length});
    // The copy is what gets checked: the layers against their own
    // checksums (no layer checksums recorded: the whole block, then copy).
    bool intact;
    if (!sums.empty()) {
      std::memcpy(dst.data(), block.data() + first_byte, bytes);
      intact = FirstBadLayer(dst.first(bytes), sums) == sums.size();
    } else {
      intact = BlockChecksum(block) == pin.checksum;
      if (intact) std::memcpy(dst.data(), block.data() + first_byte, bytes);
      for (uint32_t i = 0; intact && i < count; ++i) {
        sums.push_back(BlockChecksum(dst.subspan(i * (bytes / count), bytes / count)));
      }
    }
    pinner_.Release(kHostTierConnection, {&pin.lease, 1});
    if (intact) {
      read_bytes_.fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed);
      done(LayerRead{bytes, std::move(sums)});
    } else {
      corrupt_reads_.fetch_add(1, std::memory_order_relaxed);
      Erase(key).IgnoreError();  // later reads miss
      if (hooks_.corrupt) hooks_.corrupt(key);
      done(Corruption("host tier: block " + key.ToHex() + " does not match its checksum; dropped"));
    }
    hooks_.io_finished();
  });
  return Status::Ok();
}

Status HostBlockTier::Erase(const BlockKey& key) {
  BlockIndex& shard = ShardFor(key);
  MutexLock lock(shard.mu);
  auto it = shard.index.find(key);
  if (it == shard.index.end() || !it->second.cached()) {
    return NotFound("host tier: block " + key.ToHex() + " is not cached");
  }
  shard.RemoveCommitted(it);
  erases_.fetch_add(1, std::memory_order_relaxed);
  return Status::Ok();
}

BlockTier::WriteTotals HostBlockTier::write_totals() const {
  return WriteTotals{written_bytes_.load(std::memory_order_relaxed), 0};
}

void HostBlockTier::CheckHealth(HealthFindings& out) const { host_.CheckHealth(out); }

void HostBlockTier::VisitCounters(CounterVisitor& v) const {
  const auto load = [](const std::atomic<int64_t>& c) { return c.load(std::memory_order_relaxed); };
  v.Visit("host.tier_writes", load(writes_));
  v.Visit("host.tier_written_bytes", static_cast<int64_t>(written_bytes_.load(std::memory_order_relaxed)));
  v.Visit("host.tier_reads", load(reads_));
  v.Visit("host.tier_read_bytes", load(read_bytes_));
  v.Visit("host.tier_corrupt_reads", load(corrupt_reads_));
  v.Visit("host.tier_erases", load(erases_));
}

}  // namespace kvtier

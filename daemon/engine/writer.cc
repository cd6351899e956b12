#include "daemon/engine/writer.h"

#include <string>
#include <utility>

#include "common/check.h"
#include "common/checksum.h"
#include "daemon/engine/block_index.h"

namespace kvtier {
namespace {

// How many layer checksums a Commit carries for a block of `layers` layers
// (none for a block of one layer: its checksum is the block's).
size_t SentLayers(uint32_t layers) { return layers > 1 ? layers : 0; }

}  // namespace

Writer::Writer(const std::vector<std::unique_ptr<BlockIndex>>& shards, HostTier& host, Lineage& lineage,
               const Clock& clock, bool verify_commits, EngineCounters& counters, Hooks hooks)
    : shards_(shards),
      host_(host),
      lineage_(lineage),
      clock_(clock),
      verify_commits_(verify_commits),
      counters_(counters),
      hooks_(std::move(hooks)) {}

BlockIndex& Writer::ShardFor(const BlockKey& key) const { return ShardOf(shards_, key); }

std::vector<SlotGrant> Writer::Reserve(ConnectionId connection, const NamespaceFingerprint& ns,
                                       std::span<const BlockKey> keys, std::span<const uint64_t> sizes,
                                       const ReserveChain& links) {
  KVTIER_CHECK(keys.size() == sizes.size(), "Reserve: keys and sizes differ in length");
  if (links.chain) {
    lineage_.RecordLinks(keys, links.parent);
    Bump(counters_.chain_links, static_cast<int64_t>(keys.size()));
  }
  std::vector<SlotGrant> grants(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    const BlockKey& key = keys[i];
    SlotGrant& grant = grants[i];
    Bump(counters_.reserves);
    if (!host_.CanEverHold(sizes[i])) {
      grant.status =
          InvalidArgument("block size " + std::to_string(sizes[i]) + " can never fit the host tier (" +
                          std::to_string(host_.capacity_bytes()) + "-byte arena, sizes rounded up to their class)");
      Bump(counters_.reserve_failures);
      continue;
    }
    BlockIndex& shard = ShardFor(key);
    {
      // Claim the key first so that a concurrent writer sees it as taken.
      MutexLock lock(shard.mu);
      if (Status taken = shard.Reserve(key, ns, sizes[i], connection); !taken.ok()) {
        grant.status = std::move(taken);
        continue;
      }
    }
    Result<HostTier::Extent> extent = hooks_.allocate(sizes[i]);
    MutexLock lock(shard.mu);
    auto it = shard.index.find(key);
    KVTIER_CHECK(it != shard.index.end() && it->second.writer == connection, "reservation vanished");
    if (!extent.ok()) {
      shard.DropReservation(connection, key);
      grant.status = extent.status();
      Bump(counters_.reserve_failures);
      continue;
    }
    it->second.extent = *extent;
    it->second.allocated = true;
    grant.offset = extent->offset;
    grant.length = sizes[i];
  }
  return grants;
}

std::vector<Status> Writer::Commit(ConnectionId connection, const NamespaceFingerprint& ns,
                                   std::span<const BlockKey> keys, std::span<const uint64_t> sizes,
                                   std::span<const uint64_t> checksums, std::span<const uint64_t> layer_checksums) {
  KVTIER_CHECK(keys.size() == sizes.size(), "Commit: keys and sizes differ in length");
  KVTIER_CHECK(checksums.empty() || checksums.size() == keys.size(), "Commit: keys and checksums differ in length");
  // The layer split of each block, and whether the client sent every
  // layer checksum (anything else is ignored: the block has none).
  std::vector<uint32_t> layer_counts(keys.size());
  size_t expected_layers = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    layer_counts[i] = hooks_.layer_count(ns, sizes[i]);
    expected_layers += SentLayers(layer_counts[i]);
  }
  const bool layers_sent = !layer_checksums.empty() && layer_checksums.size() == expected_layers;
  size_t next_sent = 0;  // index into layer_checksums of keys[i]'s first
  std::vector<Status> out(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    const BlockKey& key = keys[i];
    const uint32_t layers = layer_counts[i];
    const std::span<const uint64_t> sent_layers =
        layers_sent ? layer_checksums.subspan(next_sent, SentLayers(layers)) : std::span<const uint64_t>();
    next_sent += SentLayers(layers);
    BlockIndex& shard = ShardFor(key);
    HostTier::Extent extent;
    uint64_t size = 0;
    {
      MutexLock lock(shard.mu);
      auto it = shard.index.find(key);
      if (it == shard.index.end() || it->second.state() != BlockState::kReserved || it->second.writer != connection ||
          it->second.ns != ns) {
        out[i] =
            FailedPrecondition("Commit without Reserve: block " + key.ToHex() + " is not reserved by this connection");
        Bump(counters_.commit_failures);
        continue;
      }
      if (sizes[i] != it->second.size) {
        out[i] =
            InvalidArgument("size mismatch for block " + key.ToHex() + ": reserved " + std::to_string(it->second.size) +
                            " bytes, committed " + std::to_string(sizes[i]) + "; the reservation is dropped");
        shard.DropReservation(connection, key);
        Bump(counters_.commit_failures);
        continue;
      }
      extent = it->second.extent;
      size = it->second.size;
    }
    out[i] = CommitOne(connection, key, host_.Bytes(extent).first(size), checksums.empty() ? nullptr : &checksums[i],
                       sent_layers, layers);
  }
  return out;
}

Status Writer::CommitOne(ConnectionId connection, const BlockKey& key, std::span<const std::byte> bytes,
                         const uint64_t* sent, std::span<const uint64_t> sent_layers, uint32_t layers) {
  // Hash outside the lock: only this connection may touch its reservation.
  const bool hash = sent == nullptr || verify_commits_;
  // Layer checksums as sent (never hashed here unless verify_commits
  // checks them: a block without them costs nothing more).
  std::vector<uint64_t> layer_sums(sent_layers.begin(), sent_layers.end());
  uint64_t checksum = hash ? 0 : *sent;
  bool layers_differ = false;
  if (hash && verify_commits_ && !sent_layers.empty()) {
    std::vector<uint64_t> hashed(layers);
    checksum = ChecksumWithLayers(bytes, hashed);  // one pass for both
    layers_differ = hashed != layer_sums;
  } else if (hash) {
    checksum = BlockChecksum(bytes);
  }
  const bool whole_differs = hash && sent != nullptr && checksum != *sent;
  const uint64_t now = clock_.NowUs();
  BlockIndex& shard = ShardFor(key);
  MutexLock lock(shard.mu);
  auto it = shard.index.find(key);
  KVTIER_CHECK(it != shard.index.end() && it->second.writer == connection, "reservation vanished");
  if (whole_differs || layers_differ) {
    shard.DropReservation(connection, key);
    Bump(counters_.commit_failures);
    return Corruption("block " + key.ToHex() + ": its bytes do not match the " +
                      (whole_differs ? "checksum" : "layer checksums") +
                      " the client sent; the reservation is dropped");
  }
  shard.CommitReserved(it, connection, checksum, std::move(layer_sums), hooks_.next_handle(), now);
  Bump(counters_.commits);
  Bump(counters_.host_committed_bytes, static_cast<int64_t>(it->second.size));
  if (sent != nullptr) Bump(counters_.commit_checksums_sent);
  return Status::Ok();
}

std::optional<std::pair<HostTier::Extent, uint64_t>> Writer::Reserved(ConnectionId connection,
                                                                      const NamespaceFingerprint& ns,
                                                                      const BlockKey& key) const {
  BlockIndex& shard = ShardFor(key);
  MutexLock lock(shard.mu);
  auto it = shard.index.find(key);
  if (it == shard.index.end() || it->second.state() != BlockState::kReserved || it->second.writer != connection ||
      it->second.ns != ns || !it->second.allocated) {
    return std::nullopt;
  }
  return std::make_pair(it->second.extent, it->second.size);
}

size_t Writer::Abort(ConnectionId connection, std::span<const BlockKey> keys) {
  size_t aborted = 0;
  for (const BlockKey& key : keys) {
    BlockIndex& shard = ShardFor(key);
    MutexLock lock(shard.mu);
    if (shard.DropReservation(connection, key)) ++aborted;
  }
  Bump(counters_.aborts, static_cast<int64_t>(aborted));
  return aborted;
}

}  // namespace kvtier

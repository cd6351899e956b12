// MeasuredTier: a BlockTier that forwards every call to the tier it wraps
// and measures what passes: read and write latency (from the call to its
// completion, so queueing in the tier counts), payload bytes read and
// written, completed and failed operations. The engine wraps every tier of
// its stack in one, so each tier reports the same families whatever it is:
//   tier.read_seconds{tier="<name>"}, tier.write_seconds{...} (histograms),
//   tier.read_bytes{...}, tier.written_bytes{...}, tier.reads{...},
//   tier.writes{...}, tier.read_errors{...}, tier.write_errors{...}
//   (counters), tier.capacity_bytes{...}, tier.used_bytes{...} (gauges),
// then the wrapped tier's own counters.
//
// Thread-safety: as the wrapped tier; the measurements are atomics.
#pragma once

#include <atomic>
#include <string>

#include "common/histogram.h"
#include "tiers/tier.h"

namespace kvtier {

class MeasuredTier final : public BlockTier {
 public:
  explicit MeasuredTier(BlockTier& inner);  // borrowed; outlives this

  BlockTier& inner() const { return inner_; }

  Tier kind() const override { return inner_.kind(); }
  std::string_view name() const override { return inner_.name(); }
  bool asynchronous() const override { return inner_.asynchronous(); }
  uint64_t capacity_bytes() const override { return inner_.capacity_bytes(); }
  uint64_t used_bytes() const override { return inner_.used_bytes(); }
  uint64_t StoredBytes(uint64_t payload_bytes) const override { return inner_.StoredBytes(payload_bytes); }
  std::optional<BlockInfo> Find(const BlockKey& key) const override { return inner_.Find(key); }
  void Probe(const NamespaceFingerprint& ns, std::span<const BlockKey> keys) override { inner_.Probe(ns, keys); }
  bool probes() const override { return inner_.probes(); }
  void ForEachBlock(const BlockVisitor& visit) const override { inner_.ForEachBlock(visit); }
  Status Write(const NamespaceFingerprint& ns, const BlockKey& key, uint32_t layer_count,
               std::span<const std::byte> payload, WriteDone done,
               std::optional<uint64_t> payload_checksum = std::nullopt) override;
  Status Read(const BlockKey& key, uint32_t first_layer, uint32_t last_layer, std::span<std::byte> dst,
              ReadDone done) override;
  Status ReadWithLayerChecksums(const BlockKey& key, uint32_t first_layer, uint32_t last_layer,
                                std::span<std::byte> dst, LayerReadDone done) override;
  bool keeps_layer_checksums() const override { return inner_.keeps_layer_checksums(); }
  Status Erase(const BlockKey& key) override { return inner_.Erase(key); }
  WriteTotals write_totals() const override { return inner_.write_totals(); }
  void SetNeededHint(NeededHint needed) override { inner_.SetNeededHint(std::move(needed)); }
  void SetEvictionSink(EvictionSink sink) override { inner_.SetEvictionSink(std::move(sink)); }
  Result<InPlace> HoldInPlace(const BlockKey& key) override { return inner_.HoldInPlace(key); }
  void ReleaseInPlace(const BlockKey& key, uint64_t offset) override { inner_.ReleaseInPlace(key, offset); }
  void VisitCounters(CounterVisitor& visitor) const override;

 private:
  BlockTier& inner_;
  const std::string label_;  // {tier="<name>"}
  LatencyHistogram read_latency_, write_latency_;
  std::atomic<int64_t> reads_{0}, writes_{0}, read_errors_{0}, write_errors_{0};
  std::atomic<int64_t> read_bytes_{0}, written_bytes_{0};
};

}  // namespace kvtier

// ForwardingTier: a BlockTier that hands every call to the tier it wraps,
// for wrappers (daemon/engine/measured_tier.h) that change a few calls and must
// keep the rest, as a storage Env wrapper does: a subclass overrides only
// what it changes, and a method BlockTier gains is forwarded here once
// instead of silently falling back to its default in every wrapper (a
// wrapper that did not forward ForEachNamespaceBytes made each scrape walk
// every NVMe entry). tests/unit/forwarding_tier_test.cc calls every method
// through one and checks it reached the wrapped tier.
//
// Thread-safety: as the wrapped tier.
#pragma once

#include "tiers/tier.h"

namespace kvtier {

class ForwardingTier : public BlockTier {
 public:
  explicit ForwardingTier(BlockTier& inner) : inner_(inner) {}  // borrowed; outlives this

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
  Status Write(const NamespaceFingerprint& ns, const BlockKey& key, uint32_t layer_count,
               std::span<const std::byte> payload, WriteDone done,
               std::optional<uint64_t> payload_checksum = std::nullopt) override {
    return inner_.Write(ns, key, layer_count, payload, std::move(done), payload_checksum);
  }
  Status Read(const BlockKey& key, uint32_t first_layer, uint32_t last_layer, std::span<std::byte> dst,
              ReadDone done) override {
    return inner_.Read(key, first_layer, last_layer, dst, std::move(done));
  }
  bool keeps_layer_checksums() const override { return inner_.keeps_layer_checksums(); }
  Status ReadWithLayerChecksums(const BlockKey& key, uint32_t first_layer, uint32_t last_layer,
                                std::span<std::byte> dst, LayerReadDone done) override {
    return inner_.ReadWithLayerChecksums(key, first_layer, last_layer, dst, std::move(done));
  }
  void ForEachBlock(const BlockVisitor& visit) const override { inner_.ForEachBlock(visit); }
  void ForEachNamespaceBytes(const NamespaceBytesVisitor& visit) const override {
    inner_.ForEachNamespaceBytes(visit);
  }
  Status Erase(const BlockKey& key) override { return inner_.Erase(key); }
  WriteTotals write_totals() const override { return inner_.write_totals(); }
  void SetNeededHint(NeededHint needed) override { inner_.SetNeededHint(std::move(needed)); }
  void SetEvictionSink(EvictionSink sink) override { inner_.SetEvictionSink(std::move(sink)); }
  void SetShares(ShareOf shares) override { inner_.SetShares(std::move(shares)); }
  uint64_t shareable_bytes() const override { return inner_.shareable_bytes(); }
  Result<InPlace> HoldInPlace(const BlockKey& key) override { return inner_.HoldInPlace(key); }
  void ReleaseInPlace(const BlockKey& key, uint64_t offset) override { inner_.ReleaseInPlace(key, offset); }
  void VisitCounters(CounterVisitor& visitor) const override { inner_.VisitCounters(visitor); }

 private:
  BlockTier& inner_;
};

}  // namespace kvtier

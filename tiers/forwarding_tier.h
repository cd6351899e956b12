// ForwardingTier: a BlockTier that hands every call to the tier it wraps,
// for wrappers (daemon/engine/measured_tier.h, daemon/tenants/tenant_tier.h)
// that change a few calls and must keep the rest, as a storage Env wrapper
// does: a subclass overrides only what it changes, and a method BlockTier
// gains is forwarded here once instead of silently falling back to its
// default in every wrapper (a wrapper that did not forward the namespace
// sums made each scrape walk every NVMe entry).
//
// The capability accessors (tiers/tier.h) answer the wrapped tier's own
// capabilities, so a wrapper has exactly the capabilities of the tier it
// wraps, and calls through them go straight to that tier. A wrapper that
// changes what a capability does implements that interface itself and
// answers `this` where the wrapped tier has it (and nullptr where not); one
// that must not pass a capability on (a tenant's view must not install
// shares on the shared tier) answers nullptr. tests/unit/forwarding_tier_test.cc
// calls every method through one and checks it reached the wrapped tier,
// and checks each capability is kept and never invented.
//
// Thread-safety: as the wrapped tier.
#pragma once

#include "tiers/tier.h"

namespace kvtier {

class ForwardingTier : public BlockTier {
 public:
  explicit ForwardingTier(BlockTier& inner) : inner_(inner) {}  // borrowed; outlives this

  BlockTier& inner() const { return inner_; }

  std::string_view name() const override { return inner_.name(); }
  bool asynchronous() const override { return inner_.asynchronous(); }
  uint64_t capacity_bytes() const override { return inner_.capacity_bytes(); }
  uint64_t used_bytes() const override { return inner_.used_bytes(); }
  uint64_t StoredBytes(uint64_t payload_bytes) const override { return inner_.StoredBytes(payload_bytes); }
  std::optional<BlockInfo> Find(const BlockKey& key) const override { return inner_.Find(key); }
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
  Status Erase(const BlockKey& key) override { return inner_.Erase(key); }
  WriteTotals write_totals() const override { return inner_.write_totals(); }
  Prober* prober() override { return inner_.prober(); }
  InPlaceHolds* in_place_holds() override { return inner_.in_place_holds(); }
  ReclaimHooks* reclaim_hooks() override { return inner_.reclaim_hooks(); }
  ReclaimShares* reclaim_shares() override { return inner_.reclaim_shares(); }
  const NamespaceSums* namespace_sums() const override { return inner_.namespace_sums(); }
  void VisitCounters(CounterVisitor& visitor) const override { inner_.VisitCounters(visitor); }
  void CheckHealth(HealthFindings& out) const override { inner_.CheckHealth(out); }

 private:
  BlockTier& inner_;
};

}  // namespace kvtier

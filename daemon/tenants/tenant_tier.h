// Tiers that several tenants share (the NVMe tier, later the remote tier),
// when [[tenant]] tables are configured. Each tenant has an Engine of its
// own (its own arena, index and policies); each such engine reaches a
// shared tier through a TenantTier, and one SharedTier stands between the
// tier and all of them.
//
// TenantTier, for one tenant (its TenantScope, daemon/tenants/tenant_scope.h):
// - stores the tenant's key k as scope.Scope(k), in the tenant's scoped
//   namespaces only (a Write of another namespace is InvalidArgument);
// - sees only the tenant's blocks: Find, Probe, Read, Erase, HoldInPlace answer
//   NotFound for a block of another tenant's namespace, ForEachBlock and
//   ForEachNamespaceBytes skip them and give keys back unscoped;
// - enforces the tenant's quota: a Write that would take the tenant's
//   payload bytes there (stored, plus writes in flight) past `quota_bytes`
//   is NoSpace, counted in <tier>.quota_refusals;
// - has a protected share on a tier that protects shares (shareable_bytes()
//   above 0: the NVMe tier): its quota, or, without one, an equal part of
//   what the quotas leave of shareable_bytes(). SharedTier installs them
//   on the tier (ReclaimShares::SetShares), whose reclaim then never drops a
//   block of a tenant within its share (policy/share_guard.h). Blocks of
//   no registered tenant have no share;
// - reports, as its write totals, the bytes its own writes sent to the
//   medium plus an equal share of the tier's reinsertion (which no tenant
//   decided), so each tenant's DWPD admission charges its own writes.
// SharedTier installs one eviction sink and one needed-hint on the tier and
// hands each call to the tenant whose namespace it concerns (the key
// unscoped); an evicted block of no registered tenant is dropped
// (<tier>.unowned_evictions).
//
// Thread-safe. Lock order: install_mu_ -> the shared tier's own lock ->
// SharedTier::mu_ -> the tenants' hints' leaf locks. The tier is never
// called with mu_ held.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/mutex.h"
#include "daemon/tenants/tenant_scope.h"
#include "tiers/forwarding_tier.h"
#include "tiers/tier.h"

namespace kvtier {

class SharedTier {
 public:
  explicit SharedTier(BlockTier& tier);  // borrowed; outlives this
  ~SharedTier();                         // clears the sink and hint it installed

  BlockTier& tier() const { return tier_; }
  size_t tenants() const EXCLUDES(mu_);

  // A tenant's sink and hint (empty: cleared). `scope` is borrowed and
  // outlives its registration; called by TenantTier.
  void SetSink(const TenantScope* scope, BlockTier::EvictionSink sink) EXCLUDES(install_mu_, mu_);
  void SetHint(const TenantScope* scope, BlockTier::NeededHint hint) EXCLUDES(mu_);
  void SetDropListener(const TenantScope* scope, ReclaimHooks::DropListener listener) EXCLUDES(mu_);
  // Registers `scope` as one of the tenants (for the reinsertion share and
  // the protected shares), with its quota (0: none); TenantTier's
  // constructor and destructor call these.
  void Join(const TenantScope* scope, uint64_t quota_bytes) EXCLUDES(install_mu_, mu_);
  void Leave(const TenantScope* scope) EXCLUDES(install_mu_, mu_);
  // The protected share of `scope`'s blocks on the tier (0: none, or the
  // tier protects no share).
  uint64_t ShareOf(const TenantScope* scope) const EXCLUDES(mu_);

  // The tier's own counters, once for all tenants, then <tier>.unowned_evictions.
  void VisitCounters(CounterVisitor& visitor) const;

 private:
  struct Tenant {
    const TenantScope* scope = nullptr;
    BlockTier::EvictionSink sink;
    BlockTier::NeededHint hint;
    ReclaimHooks::DropListener dropped;
    uint32_t owner = 0;        // its id among the tier's share owners (1, 2, ...)
    uint64_t quota_bytes = 0;  // 0: none; its share is then unquoted_share_
  };
  Tenant* Find(const TenantScope* scope) REQUIRES(mu_);
  // Installs the sink on the tier while some tenant has one, clears it
  // otherwise. Caller holds neither lock.
  void Install() EXCLUDES(install_mu_, mu_);
  void OnEvicted(const BlockTier::Evicted& block, std::span<const std::byte> payload) EXCLUDES(mu_);
  bool Needed(const BlockKey& key) const EXCLUDES(mu_);
  // The tier dropped `scoped`: tells the tenant that owns `ns`.
  void OnDropped(const NamespaceFingerprint& ns, const BlockKey& scoped) const EXCLUDES(mu_);
  // Whose block of `ns` is, and its share (BlockTier::ShareOf).
  ShareOwner OwnerOf(const NamespaceFingerprint& ns) const EXCLUDES(mu_);
  // The tier's ReclaimShares::shareable_bytes (0: it protects no share).
  uint64_t ShareableBytes() const;
  // Recomputes unquoted_share_. Caller holds mu_ uniquely.
  void ComputeShares() REQUIRES(mu_);
  // Installs OwnerOf on the tier while tenants share it (the tier re-reads
  // every namespace's owner). Caller holds neither lock.
  void InstallShares() EXCLUDES(install_mu_, mu_);

  BlockTier& tier_;
  Mutex install_mu_ ACQUIRED_BEFORE(mu_);  // taken before the tier's lock, never under it
  bool sink_installed_ GUARDED_BY(install_mu_) = false;
  mutable SharedMutex mu_;
  std::vector<Tenant> tenants_ GUARDED_BY(mu_);
  uint32_t next_owner_ GUARDED_BY(mu_) = 1;
  // The share of each tenant without a quota: an equal part of what the
  // quotas leave of the tier's shareable_bytes() (0 when they leave none).
  uint64_t unquoted_share_ GUARDED_BY(mu_) = 0;
  std::atomic<int64_t> unowned_evictions_{0};
};

// A ForwardingTier over the shared tier: name, asynchronous,
// StoredBytes and keeps_layer_checksums are the tier's, and so is its
// health (CheckHealth: each tenant hears that the tier it shares fails). Of the tier's
// capabilities it keeps probes, in-place holds, reclaim hooks and namespace
// sums, each scoped to the tenant as above (answered only where the tier
// has them); it never has ReclaimShares, whatever the tier: shares change
// the tier for every tenant, and only SharedTier installs them.
class TenantTier final : public ForwardingTier,
                         public Prober,
                         public InPlaceHolds,
                         public ReclaimHooks,
                         public NamespaceSums {
 public:
  // `shared` and `scope` are borrowed and outlive this. `quota_bytes` 0: no
  // quota beyond the tier's capacity.
  TenantTier(SharedTier& shared, const TenantScope& scope, uint64_t quota_bytes);
  ~TenantTier() override;

  uint64_t capacity_bytes() const override;
  uint64_t used_bytes() const override;
  std::optional<BlockInfo> Find(const BlockKey& key) const override;
  Status Write(const NamespaceFingerprint& ns, const BlockKey& key, uint32_t layer_count,
               std::span<const std::byte> payload, WriteDone done,
               std::optional<uint64_t> payload_checksum = std::nullopt) override;
  Status Read(const BlockKey& key, uint32_t first_layer, uint32_t last_layer, std::span<std::byte> dst,
              ReadDone done) override;
  Status ReadWithLayerChecksums(const BlockKey& key, uint32_t first_layer, uint32_t last_layer,
                                std::span<std::byte> dst, LayerReadDone done) override;
  void ForEachBlock(const BlockVisitor& visit) const override;
  Status Erase(const BlockKey& key) override;
  WriteTotals write_totals() const override;
  // <tier>.quota_bytes (gauge, 0: none), <tier>.share_bytes (gauge, its
  // protected share, 0: none) and <tier>.quota_refusals; the shared tier's
  // own counters are SharedTier's to report.
  void VisitCounters(CounterVisitor& visitor) const override;

  // The capabilities: this, where the shared tier has them.
  Prober* prober() override { return inner().prober() != nullptr ? this : nullptr; }
  InPlaceHolds* in_place_holds() override { return inner().in_place_holds() != nullptr ? this : nullptr; }
  ReclaimHooks* reclaim_hooks() override { return inner().reclaim_hooks() != nullptr ? this : nullptr; }
  const NamespaceSums* namespace_sums() const override { return inner().namespace_sums() != nullptr ? this : nullptr; }
  // Never: see above.
  ReclaimShares* reclaim_shares() override { return nullptr; }

  void Probe(const NamespaceFingerprint& ns, std::span<const BlockKey> keys) override;
  Result<InPlace> HoldInPlace(const BlockKey& key) override;
  void ReleaseInPlace(const BlockKey& key, uint64_t offset) override;
  // To SharedTier, which hands the tier's calls to the tenant they concern.
  void SetNeededHint(NeededHint needed) override { shared_.SetHint(&scope_, std::move(needed)); }
  void SetEvictionSink(EvictionSink sink) override { shared_.SetSink(&scope_, std::move(sink)); }
  void SetDropListener(DropListener listener) override { shared_.SetDropListener(&scope_, std::move(listener)); }
  void ForEachNamespaceBytes(const NamespaceBytesVisitor& visit) const override;

 private:
  bool Mine(const BlockKey& scoped) const;  // the tier holds `scoped` in one of this tenant's namespaces

  SharedTier& shared_;
  const TenantScope& scope_;
  const uint64_t quota_bytes_;
  const std::string quota_bytes_name_, share_bytes_name_, quota_refusals_name_;
  // Writes accepted and not yet done: payload bytes (the quota counts
  // them) and, once done well, the stored bytes they sent (write totals).
  std::atomic<uint64_t> pending_payload_bytes_{0};
  std::atomic<uint64_t> written_device_bytes_{0};
  std::atomic<int64_t> quota_refusals_{0};
};

}  // namespace kvtier

#include "daemon/tenants/tenant_tier.h"

#include <algorithm>

namespace kvtier {

uint64_t SharedTier::ShareableBytes() const {
  const ReclaimShares* shares = tier_.reclaim_shares();
  return shares != nullptr ? shares->shareable_bytes() : 0;
}

SharedTier::SharedTier(BlockTier& tier) : tier_(tier) {
  if (ReclaimHooks* hooks = tier_.reclaim_hooks()) {
    hooks->SetNeededHint([this](const BlockKey& key) { return Needed(key); });
    hooks->SetDropListener([this](const NamespaceFingerprint& ns, const BlockKey& key) { OnDropped(ns, key); });
  }
}

SharedTier::~SharedTier() {
  MutexLock install(install_mu_);
  if (ReclaimHooks* hooks = tier_.reclaim_hooks()) {
    if (sink_installed_) hooks->SetEvictionSink(nullptr);
    hooks->SetNeededHint(nullptr);
    hooks->SetDropListener(nullptr);
  }
  if (ReclaimShares* shares = tier_.reclaim_shares()) shares->SetShares(nullptr);
}

size_t SharedTier::tenants() const {
  ReaderMutexLock lock(mu_);
  return tenants_.size();
}

SharedTier::Tenant* SharedTier::Find(const TenantScope* scope) {
  for (Tenant& t : tenants_) {
    if (t.scope == scope) return &t;
  }
  return nullptr;
}

void SharedTier::Join(const TenantScope* scope, uint64_t quota_bytes) {
  {
    WriterMutexLock lock(mu_);
    if (Find(scope) == nullptr)
      tenants_.push_back(Tenant{scope, nullptr, nullptr, nullptr, next_owner_++, quota_bytes});
    ComputeShares();
  }
  InstallShares();
}

void SharedTier::Leave(const TenantScope* scope) {
  {
    WriterMutexLock lock(mu_);
    std::erase_if(tenants_, [scope](const Tenant& t) { return t.scope == scope; });
    ComputeShares();
  }
  Install();
  InstallShares();
}

void SharedTier::ComputeShares() {
  uint64_t quotas = 0;
  uint64_t unquoted = 0;
  for (const Tenant& t : tenants_) {
    quotas += t.quota_bytes;
    unquoted += t.quota_bytes == 0 ? 1 : 0;
  }
  const uint64_t shareable = ShareableBytes();
  unquoted_share_ = unquoted == 0 || quotas >= shareable ? 0 : (shareable - quotas) / unquoted;
}

void SharedTier::InstallShares() {
  ReclaimShares* shares = tier_.reclaim_shares();
  if (ShareableBytes() == 0) return;  // the tier protects no share
  MutexLock install(install_mu_);
  bool any = false;
  {
    ReaderMutexLock lock(mu_);
    any = !tenants_.empty();
  }
  if (!any) return shares->SetShares(nullptr);
  shares->SetShares([this](const NamespaceFingerprint& ns) { return OwnerOf(ns); });
}

ShareOwner SharedTier::OwnerOf(const NamespaceFingerprint& ns) const {
  ReaderMutexLock lock(mu_);
  for (const Tenant& t : tenants_) {
    if (t.scope->Owns(ns)) return ShareOwner{t.owner, t.quota_bytes != 0 ? t.quota_bytes : unquoted_share_};
  }
  return ShareOwner{};  // no tenant's: no share
}

uint64_t SharedTier::ShareOf(const TenantScope* scope) const {
  if (ShareableBytes() == 0) return 0;
  ReaderMutexLock lock(mu_);
  for (const Tenant& t : tenants_) {
    if (t.scope == scope) return t.quota_bytes != 0 ? t.quota_bytes : unquoted_share_;
  }
  return 0;
}

void SharedTier::SetSink(const TenantScope* scope, BlockTier::EvictionSink sink) {
  {
    WriterMutexLock lock(mu_);
    if (Tenant* t = Find(scope)) t->sink = std::move(sink);
  }
  Install();
}

void SharedTier::SetHint(const TenantScope* scope, BlockTier::NeededHint hint) {
  WriterMutexLock lock(mu_);
  if (Tenant* t = Find(scope)) t->hint = std::move(hint);
}

// The tier takes its own lock in SetEvictionSink and calls the sink and the
// hint with it held or from its threads, which take mu_: so the tier is
// never called with mu_ held (install_mu_ orders the callers instead).
void SharedTier::Install() {
  MutexLock install(install_mu_);
  bool want_sink = false;
  {
    ReaderMutexLock lock(mu_);
    want_sink = std::any_of(tenants_.begin(), tenants_.end(), [](const Tenant& t) { return bool(t.sink); });
  }
  ReclaimHooks* hooks = tier_.reclaim_hooks();
  if (hooks == nullptr || want_sink == sink_installed_) return;
  sink_installed_ = want_sink;
  if (!want_sink) {
    hooks->SetEvictionSink(nullptr);  // the tier stops reading its victims back
    return;
  }
  hooks->SetEvictionSink(
      [this](const BlockTier::Evicted& block, std::span<const std::byte> payload) { OnEvicted(block, payload); });
}

void SharedTier::OnEvicted(const BlockTier::Evicted& block, std::span<const std::byte> payload) {
  BlockTier::EvictionSink sink;
  BlockTier::Evicted mine = block;
  {
    ReaderMutexLock lock(mu_);
    for (const Tenant& t : tenants_) {
      if (t.scope->Owns(block.ns)) {
        sink = t.sink;
        mine.key = t.scope->Unscope(block.key);
        break;
      }
    }
  }
  if (!sink) {
    unowned_evictions_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  sink(mine, payload);
}

void SharedTier::SetDropListener(const TenantScope* scope, ReclaimHooks::DropListener listener) {
  WriterMutexLock lock(mu_);
  if (Tenant* t = Find(scope)) t->dropped = std::move(listener);
}

// Called with the tier's lock held: mu_ comes after it (docs/ARCHITECTURE.md).
void SharedTier::OnDropped(const NamespaceFingerprint& ns, const BlockKey& scoped) const {
  ReaderMutexLock lock(mu_);
  for (const Tenant& t : tenants_) {
    if (!t.scope->Owns(ns)) continue;
    if (t.dropped) t.dropped(ns, t.scope->Unscope(scoped));
    return;
  }
}

bool SharedTier::Needed(const BlockKey& key) const {
  ReaderMutexLock lock(mu_);
  return std::any_of(tenants_.begin(), tenants_.end(),
                     [&key](const Tenant& t) { return t.hint && t.hint(t.scope->Unscope(key)); });
}

void SharedTier::VisitCounters(CounterVisitor& visitor) const {
  tier_.VisitCounters(visitor);
  visitor.Visit(std::string(tier_.name()) + ".unowned_evictions", unowned_evictions_.load(std::memory_order_relaxed));
}

TenantTier::TenantTier(SharedTier& shared, const TenantScope& scope, uint64_t quota_bytes)
    : ForwardingTier(shared.tier()),
      shared_(shared),
      scope_(scope),
      quota_bytes_(quota_bytes),
      quota_bytes_name_(std::string(shared.tier().name()) + ".quota_bytes"),
      share_bytes_name_(std::string(shared.tier().name()) + ".share_bytes"),
      quota_refusals_name_(std::string(shared.tier().name()) + ".quota_refusals") {
  shared_.Join(&scope_, quota_bytes_);
}

TenantTier::~TenantTier() { shared_.Leave(&scope_); }

uint64_t TenantTier::capacity_bytes() const {
  const uint64_t tier = inner().capacity_bytes();
  return quota_bytes_ == 0 ? tier : std::min(tier, quota_bytes_);
}

uint64_t TenantTier::used_bytes() const {
  uint64_t used = 0;
  ForEachNamespaceBytes([&used](const NamespaceFingerprint&, uint64_t bytes) { used += bytes; });
  return used;
}

bool TenantTier::Mine(const BlockKey& scoped) const {
  auto info = inner().Find(scoped);
  return info.has_value() && scope_.Owns(info->ns);
}

std::optional<BlockTier::BlockInfo> TenantTier::Find(const BlockKey& key) const {
  auto info = inner().Find(scope_.Scope(key));
  if (!info.has_value() || !scope_.Owns(info->ns)) return std::nullopt;
  return info;
}

void TenantTier::Probe(const NamespaceFingerprint& ns, std::span<const BlockKey> keys) {
  Prober* tier_prober = inner().prober();
  if (tier_prober == nullptr || !scope_.Owns(ns)) return;
  std::vector<BlockKey> scoped;
  scoped.reserve(keys.size());
  for (const BlockKey& key : keys) scoped.push_back(scope_.Scope(key));
  tier_prober->Probe(ns, scoped);
}

Status TenantTier::Write(const NamespaceFingerprint& ns, const BlockKey& key, uint32_t layer_count,
                         std::span<const std::byte> payload, WriteDone done, std::optional<uint64_t> payload_checksum) {
  if (!scope_.Owns(ns)) return InvalidArgument("the namespace is not this tenant's");
  const uint64_t bytes = payload.size();
  if (quota_bytes_ > 0) {
    // Checked, not reserved: two writes racing past the check may overshoot
    // the quota by one block each, never more.
    const uint64_t held = used_bytes() + pending_payload_bytes_.load(std::memory_order_relaxed);
    if (held + bytes > quota_bytes_) {
      quota_refusals_.fetch_add(1, std::memory_order_relaxed);
      return NoSpace("the tenant's quota of " + std::to_string(quota_bytes_) + " bytes in the " + std::string(name()) +
                     " tier is used");
    }
  }
  const uint64_t stored = inner().StoredBytes(bytes);
  pending_payload_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  WriteDone counted = [this, bytes, stored, done = std::move(done)](Status status) {
    if (status.ok()) written_device_bytes_.fetch_add(stored, std::memory_order_relaxed);
    pending_payload_bytes_.fetch_sub(bytes, std::memory_order_relaxed);
    done(std::move(status));
  };
  Status accepted = inner().Write(ns, scope_.Scope(key), layer_count, payload, std::move(counted), payload_checksum);
  if (!accepted.ok()) pending_payload_bytes_.fetch_sub(bytes, std::memory_order_relaxed);  // `done` never runs
  return accepted;
}

Status TenantTier::Read(const BlockKey& key, uint32_t first_layer, uint32_t last_layer, std::span<std::byte> dst,
                        ReadDone done) {
  const BlockKey scoped = scope_.Scope(key);
  if (!Mine(scoped)) return NotFound("block is not in the " + std::string(name()) + " tier");
  return inner().Read(scoped, first_layer, last_layer, dst, std::move(done));
}

Status TenantTier::ReadWithLayerChecksums(const BlockKey& key, uint32_t first_layer, uint32_t last_layer,
                                          std::span<std::byte> dst, LayerReadDone done) {
  const BlockKey scoped = scope_.Scope(key);
  if (!Mine(scoped)) return NotFound("block is not in the " + std::string(name()) + " tier");
  return inner().ReadWithLayerChecksums(scoped, first_layer, last_layer, dst, std::move(done));
}

void TenantTier::ForEachBlock(const BlockVisitor& visit) const {
  inner().ForEachBlock([this, &visit](const BlockKey& scoped, const BlockInfo& info) {
    if (scope_.Owns(info.ns)) visit(scope_.Unscope(scoped), info);
  });
}

void TenantTier::ForEachNamespaceBytes(const NamespaceBytesVisitor& visit) const {
  // The tier's kept sums where it has them (namespace_sums() offers this
  // only then); a walk of its blocks otherwise.
  VisitNamespaceBytes(inner(), [this, &visit](const NamespaceFingerprint& ns, uint64_t bytes) {
    if (scope_.Owns(ns)) visit(ns, bytes);
  });
}

Status TenantTier::Erase(const BlockKey& key) {
  const BlockKey scoped = scope_.Scope(key);
  if (!Mine(scoped)) return NotFound("block is not in the " + std::string(name()) + " tier");
  return inner().Erase(scoped);
}

BlockTier::WriteTotals TenantTier::write_totals() const {
  const WriteTotals tier = inner().write_totals();
  const uint64_t share = tier.reinserted_bytes / std::max<size_t>(shared_.tenants(), 1);
  return WriteTotals{written_device_bytes_.load(std::memory_order_relaxed) + share, share};
}

Result<BlockTier::InPlace> TenantTier::HoldInPlace(const BlockKey& key) {
  InPlaceHolds* holds = inner().in_place_holds();
  if (holds == nullptr) return Unimplemented(std::string(name()) + " tier blocks cannot be held in place");
  const BlockKey scoped = scope_.Scope(key);
  if (!Mine(scoped)) return NotFound("block is not in the " + std::string(name()) + " tier");
  return holds->HoldInPlace(scoped);
}

void TenantTier::ReleaseInPlace(const BlockKey& key, uint64_t offset) {
  InPlaceHolds* holds = inner().in_place_holds();
  if (holds != nullptr) holds->ReleaseInPlace(scope_.Scope(key), offset);
}

void TenantTier::VisitCounters(CounterVisitor& visitor) const {
  visitor.VisitGauge(quota_bytes_name_, static_cast<int64_t>(quota_bytes_));
  visitor.VisitGauge(share_bytes_name_, static_cast<int64_t>(shared_.ShareOf(&scope_)));
  visitor.Visit(quota_refusals_name_, quota_refusals_.load(std::memory_order_relaxed));
}

}  // namespace kvtier

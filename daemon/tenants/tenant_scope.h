// TenantScope: how one tenant's names are kept apart from every other
// tenant's where tenants meet, in the tiers they share (NVMe, later the
// remote tier) and in namespace fingerprints.
//
// - Namespaces. A tenant's namespace fingerprint is the descriptor's
//   fingerprint (FingerprintNamespace) with its top 32 bits replaced by the
//   tenant's tag (a hash of the tenant's name), so two tenants registering
//   the same model get different namespaces, and every block a shared tier
//   holds says whose it is (Owns). The daemon computes it at Hello; a client
//   cannot choose it.
// - Keys. Clients compute their keys (prefix chains, with or without a cache
//   salt); in a shared tier a tenant's key k is stored as Scope(k), a keyed
//   permutation (a 4-round Feistel network over the two 64-bit halves, XXH3
//   rounds keyed by the daemon's tenant key and the tenant's name). The same
//   prompt in two tenants is two blocks, a tenant cannot name another's block
//   without the daemon's key, and Unscope gives the tenant's key back (for
//   enumeration and eviction). So the cache salt is tied to the tenant by the
//   daemon, whatever salt the client used.
//
// Immutable after construction; thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "kvtier/block_key.h"
#include "kvtier/result.h"

namespace kvtier {

class TenantScope {
 public:
  // `secret`: the daemon's tenant key (LoadTenantKey); `name`: the tenant's.
  TenantScope(std::string_view secret, std::string_view name);

  // The tag in the top 32 bits of this tenant's namespace fingerprints.
  static uint32_t TagOf(std::string_view name);
  uint32_t tag() const { return tag_; }

  NamespaceFingerprint ScopeNamespace(const NamespaceFingerprint& fingerprint) const;
  bool Owns(const NamespaceFingerprint& scoped) const { return static_cast<uint32_t>(scoped.hi >> 32) == tag_; }

  BlockKey Scope(const BlockKey& key) const;
  BlockKey Unscope(const BlockKey& scoped) const;  // Unscope(Scope(k)) == k

 private:
  uint64_t Round(int round, uint64_t half) const;

  uint32_t tag_ = 0;
  std::array<uint64_t, 4> round_keys_{};
};

inline constexpr size_t kTenantKeyBytes = 32;

// The daemon's tenant key from `path`, loaded or created as
// LoadOrCreateSecret (secret_file.h) does, with its errors. An empty `path`
// gives a fresh random key (nothing persists, so nothing has to match after
// a restart).
Result<std::string> LoadTenantKey(const std::string& path);

}  // namespace kvtier

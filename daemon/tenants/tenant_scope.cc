#include "daemon/tenants/tenant_scope.h"

#include <xxhash.h>

#include "daemon/config/secret_file.h"

namespace kvtier {

uint32_t TenantScope::TagOf(std::string_view name) {
  const std::string domain = std::string("kvtier tenant tag\0", 18) + std::string(name);
  return static_cast<uint32_t>(XXH3_64bits(domain.data(), domain.size()));
}

TenantScope::TenantScope(std::string_view secret, std::string_view name) : tag_(TagOf(name)) {
  for (size_t i = 0; i < round_keys_.size(); ++i) {
    std::string material = std::string("kvtier tenant key round\0", 24);
    material += static_cast<char>(i);
    material += secret;
    material += '\0';
    material += name;
    round_keys_[i] = XXH3_64bits(material.data(), material.size());
  }
}

NamespaceFingerprint TenantScope::ScopeNamespace(const NamespaceFingerprint& fingerprint) const {
  NamespaceFingerprint scoped = fingerprint;
  scoped.hi = (static_cast<uint64_t>(tag_) << 32) | (fingerprint.hi & 0xffffffffULL);
  return scoped;
}

uint64_t TenantScope::Round(int round, uint64_t half) const {
  return XXH3_64bits_withSeed(&half, sizeof half, round_keys_[static_cast<size_t>(round)]);
}

BlockKey TenantScope::Scope(const BlockKey& key) const {
  uint64_t left = key.hi, right = key.lo;
  for (int r = 0; r < 4; ++r) {
    const uint64_t next = left ^ Round(r, right);
    left = right;
    right = next;
  }
  return BlockKey{left, right};
}

BlockKey TenantScope::Unscope(const BlockKey& scoped) const {
  uint64_t left = scoped.hi, right = scoped.lo;
  for (int r = 3; r >= 0; --r) {
    const uint64_t previous = right ^ Round(r, left);
    right = left;
    left = previous;
  }
  return BlockKey{left, right};
}

Result<std::string> LoadTenantKey(const std::string& path) {
  if (path.empty()) return RandomSecret(kTenantKeyBytes);
  return LoadOrCreateSecret(path, kTenantKeyBytes, "the tenant key");
}

}  // namespace kvtier

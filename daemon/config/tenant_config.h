// The [[tenant]] tables of kvtierd's configuration (TenantConfig in
// daemon/config/config.h): parsing, writing back, and sizing each tenant's share
// of the tiers once the machine-dependent sizes are known.
//
//   [[tenant]]
//   name = "team-a"
//   uids = [1001, 1002]          # and/or
//   gids = [3000]                # primary or supplementary group of the caller
//   host_bytes = "8GiB"          # its own arena; 0 or absent: an equal share of the rest
//   hbm_bytes = "4GiB"           # its own HBM pool; 0 or absent: an equal share
//   nvme_bytes = "1TiB"          # payload it may keep in each tier below; 0 or absent: no quota
//   models = ["meta-llama/Llama-3.1-8B"]   # model ids it may register; absent: any
//
// Pure functions; thread-compatible.
#pragma once

#include <string>
#include <string_view>
#include <toml++/toml.h>
#include <vector>

#include "daemon/config/config.h"
#include "kvtier/status.h"

namespace kvtier {

// Smallest arena a tenant gets (its share of host.capacity_bytes).
inline constexpr int64_t kMinTenantHostBytes = int64_t{16} << 20;
inline constexpr size_t kMaxTenants = 64;

// Appends the tenants of `node` (the value of the top-level key "tenant",
// an array of tables) to `tenants`. InvalidArgument naming `origin` and the
// line for: not an array of tables, an unknown key, a wrong type, a bad or
// duplicate name, a tenant with neither uids nor gids, a uid or gid listed
// by two tenants, more than kMaxTenants, a negative size.
Status ApplyTenants(const toml::node& node, std::string_view origin, std::vector<TenantConfig>& tenants);

// The tenants as [[tenant]] tables (sizes as plain integers), which
// ApplyTenants reads back to the same values; empty for no tenants.
std::string TenantsToml(const std::vector<TenantConfig>& tenants);

// Fills every tenant's host_bytes (and hbm_bytes, when `hbm_capacity_bytes`
// > 0) left 0 with an equal share of what the sized ones leave of the
// capacity. InvalidArgument when the sized ones exceed it or a share falls
// below kMinTenantHostBytes (host). Call after the auto sizes are resolved.
Status ResolveTenantShares(int64_t host_capacity_bytes, int64_t hbm_capacity_bytes, std::vector<TenantConfig>& tenants);

}  // namespace kvtier

#include "daemon/config/tenant_config.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>

namespace kvtier {
namespace {

std::string Where(std::string_view origin, const toml::node& node) {
  std::ostringstream out;
  out << origin;
  if (node.source().begin) out << ":" << node.source().begin.line;
  return out.str();
}

bool ValidName(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
           c == '-';
  });
}

Status ReadIds(const toml::node& node, const std::string& what, std::vector<uint32_t>& ids) {
  const toml::array* array = node.as_array();
  if (array == nullptr) return InvalidArgument(what + " must be an array of integers");
  for (const toml::node& item : *array) {
    if (!item.is_integer()) return InvalidArgument(what + " must be an array of integers");
    const int64_t id = item.as_integer()->get();
    // (uid_t)-1 means "no id" to the kernel's set*id calls: never a tenant's.
    if (id < 0 || id >= 0xffffffffLL) return InvalidArgument(what + ": " + std::to_string(id) + " is not a valid id");
    ids.push_back(static_cast<uint32_t>(id));
  }
  return Status::Ok();
}

Status ReadBytes(const toml::node& node, const std::string& what, int64_t& bytes) {
  if (node.is_integer()) {
    bytes = node.as_integer()->get();
  } else if (node.is_string()) {
    auto parsed = ParseBytes(node.as_string()->get());
    if (!parsed.ok()) return InvalidArgument(what + ": " + parsed.status().message());
    bytes = *parsed;
  } else {
    return InvalidArgument(what + " must be a size like \"8GiB\" or an integer");
  }
  if (bytes < 0) return InvalidArgument(what + " must not be negative");
  return Status::Ok();
}

Status ReadTenant(const toml::table& table, TenantConfig& tenant) {
  for (const auto& [key, node] : table) {
    const std::string k(key.str());
    const std::string what = "tenant." + k;
    Status s;
    if (k == "name") {
      if (!node.is_string()) return InvalidArgument("tenant.name must be a string");
      tenant.name = node.as_string()->get();
    } else if (k == "uids") {
      s = ReadIds(node, what, tenant.uids);
    } else if (k == "gids") {
      s = ReadIds(node, what, tenant.gids);
    } else if (k == "host_bytes") {
      s = ReadBytes(node, what, tenant.host_bytes);
    } else if (k == "hbm_bytes") {
      s = ReadBytes(node, what, tenant.hbm_bytes);
    } else if (k == "nvme_bytes") {
      s = ReadBytes(node, what, tenant.nvme_bytes);
    } else if (k == "models") {
      const toml::array* array = node.as_array();
      if (array == nullptr) return InvalidArgument("tenant.models must be an array of strings");
      for (const toml::node& item : *array) {
        if (!item.is_string() || item.as_string()->get().empty()) {
          return InvalidArgument("tenant.models must be an array of non-empty strings");
        }
        tenant.models.push_back(item.as_string()->get());
      }
    } else {
      return InvalidArgument("unknown tenant option '" + k +
                             "' (a tenant has name, uids, gids, host_bytes, hbm_bytes, nvme_bytes, models)");
    }
    if (!s.ok()) return s;
  }
  if (!ValidName(tenant.name)) {
    return InvalidArgument("tenant.name \"" + tenant.name + "\" must be 1..64 characters of [A-Za-z0-9_.-]");
  }
  if (tenant.uids.empty() && tenant.gids.empty()) {
    return InvalidArgument("tenant " + tenant.name + " names no uids and no gids: nobody could be it");
  }
  return Status::Ok();
}

// No name, uid or gid twice across `tenants`.
Status CheckDistinct(const std::vector<TenantConfig>& tenants) {
  std::map<std::string, std::string> names;
  std::map<uint32_t, std::string> uids, gids;
  for (const TenantConfig& t : tenants) {
    if (!names.emplace(t.name, t.name).second) return InvalidArgument("tenant " + t.name + " is declared twice");
    for (uint32_t uid : t.uids) {
      auto [it, added] = uids.emplace(uid, t.name);
      if (!added && it->second != t.name) {
        return InvalidArgument("uid " + std::to_string(uid) + " is in tenants " + it->second + " and " + t.name);
      }
    }
    for (uint32_t gid : t.gids) {
      auto [it, added] = gids.emplace(gid, t.name);
      if (!added && it->second != t.name) {
        return InvalidArgument("gid " + std::to_string(gid) + " is in tenants " + it->second + " and " + t.name);
      }
    }
  }
  return Status::Ok();
}

// A TOML basic string: quotes and backslashes escaped, and control
// characters too (toml++ unescapes "\n" in a model id into a newline, which
// a basic string may not hold raw).
template <typename T, typename Format>
std::string TomlArray(const std::vector<T>& items, Format format) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) out += (i > 0 ? ", " : "") + format(items[i]);
  return out + "]";
}

// Fills the zero fields `field` of `tenants` with equal shares of what the
// others leave of `capacity`; the share, or an error naming `what`.
Status FillShares(int64_t capacity, int64_t minimum, const char* what, int64_t TenantConfig::*field,
                  std::vector<TenantConfig>& tenants) {
  int64_t sized = 0;
  size_t unsized = 0;
  for (const TenantConfig& t : tenants) {
    // Compared before adding, so huge sizes cannot overflow the sum.
    if (t.*field > capacity - sized) {
      return InvalidArgument(std::string("the tenants' ") + what + " add up to more than the tier's " +
                             std::to_string(capacity) + " bytes");
    }
    sized += t.*field;
    if (t.*field == 0) ++unsized;
  }
  if (unsized == 0) return Status::Ok();
  const int64_t share = (capacity - sized) / static_cast<int64_t>(unsized);
  if (share < minimum) {
    return InvalidArgument(std::string("tenants without ") + what + " would get " + std::to_string(share) +
                           " bytes each, less than " + std::to_string(minimum) + ": size them or grow the tier");
  }
  for (TenantConfig& t : tenants) {
    if (t.*field == 0) t.*field = share;
  }
  return Status::Ok();
}

}  // namespace

Status ApplyTenants(const toml::node& node, std::string_view origin, std::vector<TenantConfig>& tenants) {
  const toml::array* array = node.as_array();
  if (array == nullptr || !array->is_array_of_tables()) {
    return InvalidArgument(Where(origin, node) + ": 'tenant' must be [[tenant]] tables");
  }
  for (const toml::node& item : *array) {
    TenantConfig tenant;
    Status s = ReadTenant(*item.as_table(), tenant);
    if (!s.ok()) return InvalidArgument(Where(origin, item) + ": " + s.message());
    tenants.push_back(std::move(tenant));
    if (tenants.size() > kMaxTenants) {
      return InvalidArgument(Where(origin, item) + ": at most " + std::to_string(kMaxTenants) + " tenants");
    }
    // Checked per table, so the error names the line of the second one.
    Status distinct = CheckDistinct(tenants);
    if (!distinct.ok()) return InvalidArgument(Where(origin, item) + ": " + distinct.message());
  }
  return Status::Ok();
}

std::string TenantsToml(const std::vector<TenantConfig>& tenants) {
  std::string out;
  const auto number = [](uint32_t id) { return std::to_string(id); };
  for (const TenantConfig& t : tenants) {
    out += "\n[[tenant]]\nname = " + TomlQuoted(t.name) + "\n";
    out += "uids = " + TomlArray(t.uids, number) + "\n";
    out += "gids = " + TomlArray(t.gids, number) + "\n";
    out += "host_bytes = " + std::to_string(t.host_bytes) + "\n";
    out += "hbm_bytes = " + std::to_string(t.hbm_bytes) + "\n";
    out += "nvme_bytes = " + std::to_string(t.nvme_bytes) + "\n";
    out += "models = " + TomlArray(t.models, [](const std::string& m) { return TomlQuoted(m); }) + "\n";
  }
  return out;
}

Status ResolveTenantShares(int64_t host_capacity_bytes, int64_t hbm_capacity_bytes,
                           std::vector<TenantConfig>& tenants) {
  if (tenants.empty()) return Status::Ok();
  Status host = FillShares(host_capacity_bytes, kMinTenantHostBytes, "host_bytes", &TenantConfig::host_bytes, tenants);
  if (!host.ok()) return InvalidArgument("host.capacity_bytes: " + host.message());
  for (const TenantConfig& t : tenants) {
    if (t.host_bytes < kMinTenantHostBytes) {
      return InvalidArgument("tenant " + t.name + ": host_bytes must be at least " +
                             std::to_string(kMinTenantHostBytes));
    }
  }
  if (hbm_capacity_bytes <= 0) return Status::Ok();
  Status hbm = FillShares(hbm_capacity_bytes, 1, "hbm_bytes", &TenantConfig::hbm_bytes, tenants);
  if (!hbm.ok()) return InvalidArgument("hbm.capacity_bytes: " + hbm.message());
  return Status::Ok();
}

}  // namespace kvtier

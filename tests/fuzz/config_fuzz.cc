// Fuzzes kvtierd's configuration parser (daemon/config/config.h): ParseConfig over
// any text, [[tenant]] tables included. Beyond "no crash, no leak, no UB":
// - a config that parses writes back (ConfigToml) to TOML that parses to
//   the same values, tenants included (what `kvtier config get` relies on);
// - sizing the tenants' shares (ResolveTenantShares) either fails or gives
//   every tenant at least kMinTenantHostBytes within host.capacity_bytes.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "daemon/config/config.h"
#include "daemon/config/tenant_config.h"

namespace kvtier {
namespace {

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "config_fuzz: %s\n%s\n", what, detail.c_str());
  std::abort();
}

void CheckRoundTrip(const DaemonConfig& config) {
  const std::string written = ConfigToml(config);
  Result<DaemonConfig> again = ParseConfig(written, "<written back>");
  if (!again.ok()) Fail("ConfigToml wrote a config ParseConfig refuses", again.status().ToString() + "\n" + written);
  std::string changed;
  for (const OptionSpec* spec : ChangedOptions(config, *again)) changed += std::string(spec->name) + " ";
  if (!changed.empty()) Fail("options changed through ConfigToml and back", changed + "\n" + written);
  if (again->tenants != config.tenants) Fail("tenants changed through ConfigToml and back", written);
}

void CheckTenantShares(const DaemonConfig& config) {
  if (config.tenants.empty() || config.host_capacity_bytes <= 0) return;  // 0: sized at start
  std::vector<TenantConfig> tenants = config.tenants;
  if (!ResolveTenantShares(config.host_capacity_bytes, config.hbm_capacity_bytes, tenants).ok()) return;
  int64_t host_total = 0;
  for (const TenantConfig& t : tenants) {
    if (t.host_bytes < kMinTenantHostBytes) Fail("a tenant's host share is under the minimum", t.name);
    if (config.hbm_capacity_bytes > 0 && t.hbm_bytes <= 0) Fail("a tenant got no HBM share", t.name);
    host_total += t.host_bytes;  // each is <= the capacity, 64 tenants at most: no overflow
  }
  if (host_total > config.host_capacity_bytes) Fail("the tenants' host shares exceed the capacity", "");
}

}  // namespace
}  // namespace kvtier

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  kvtier::Result<kvtier::DaemonConfig> config = kvtier::ParseConfig(text, "<fuzz>");
  if (!config.ok()) return 0;
  kvtier::CheckRoundTrip(*config);
  kvtier::CheckTenantShares(*config);
  return 0;
}

// TenantStack: what kvtierd builds from a configuration with [[tenant]]
// tables, short of its server: the configuration (a 64 MiB host arena, a
// 32 MiB NVMe file of 4 MiB regions in `dir`, admission "all", then
// `tenant_tables`), the tier stack and the tenants' engines, as
// daemon/main.cc makes them. Tests of tenants on shared tiers start here.
//
// Thread-compatible. The destructor closes the engines before the tiers
// (the caller removes `dir`).
#pragma once

#include <memory>
#include <string>

#include "common/clock.h"
#include "daemon/config/config.h"
#include "daemon/setup/tenant_engines.h"
#include "daemon/setup/tier_stack.h"

namespace kvtier::testing {

class TenantStack {
 public:
  // A configuration that does not parse, or tiers that do not open, fail
  // the test; engines that do not open leave their status in opened()
  // (some tests expect that).
  TenantStack(const std::string& dir, const std::string& tenant_tables);
  ~TenantStack();
  TenantStack(const TenantStack&) = delete;
  TenantStack& operator=(const TenantStack&) = delete;

  const Status& opened() const { return opened_; }

  DaemonConfig config;
  SystemClock clock;
  TierStack stack;
  std::unique_ptr<DaemonEngines> engines;  // null unless opened()

 private:
  Status opened_;
};

}  // namespace kvtier::testing

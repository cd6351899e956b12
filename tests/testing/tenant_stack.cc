#include "tests/testing/tenant_stack.h"

#include <gtest/gtest.h>

#include "daemon/config/tenant_config.h"

namespace kvtier::testing {

TenantStack::TenantStack(const std::string& dir, const std::string& tenant_tables) {
  const std::string toml = "[server]\nsocket_path = \"" + dir +
                           "/kvtierd.sock\"\n"
                           "[host]\ncapacity_bytes = \"64MiB\"\nlock_memory = \"off\"\n[hbm]\nenabled = \"off\"\n"
                           "[nvme]\npath = \"" +
                           dir +
                           "/nvme.dat\"\ncapacity_bytes = \"32MiB\"\n"
                           "region_bytes = \"4MiB\"\nstaging_bytes = \"8MiB\"\ndirect_io = false\n"
                           "admission = \"all\"\n" +
                           tenant_tables;
  auto parsed = ParseConfig(toml, "test");
  EXPECT_TRUE(parsed.ok()) << parsed.status().ToString();
  if (!parsed.ok()) {
    opened_ = parsed.status();
    return;
  }
  config = *parsed;
  EXPECT_TRUE(ResolveTenantShares(config.host_capacity_bytes, 0, config.tenants).ok());
  auto tiers = OpenTierStack(config, clock);
  EXPECT_TRUE(tiers.ok()) << tiers.status().ToString();
  if (!tiers.ok()) {
    opened_ = tiers.status();
    return;
  }
  stack = std::move(*tiers);
  auto opened = DaemonEngines::Open(config, stack, clock);
  opened_ = opened.status();
  if (opened.ok()) engines = std::move(*opened);
}

TenantStack::~TenantStack() {
  engines.reset();
  stack.tiers.clear();
}

}  // namespace kvtier::testing

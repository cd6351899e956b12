// The defaults of policy/option_defaults.h: a kvtierd given no option
// builds the same EngineOptions, BlockDeviceOptions, NvmeTierOptions,
// RemoteTierOptions and DwpdOptions as the structs' own defaults, for every
// option that maps onto one of their fields. The few
// options whose daemon default is deliberately not the library's are
// listed here, each with its reason.
#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "daemon/config/config.h"
#include "daemon/config/option_field.h"
#include "daemon/engine/engine.h"
#include "daemon/setup/nvme_setup.h"
#include "daemon/setup/remote_setup.h"
#include "daemon/setup/tenant_engines.h"
#include "policy/dwpd_budget.h"
#include "policy/option_defaults.h"
#include "tiers/nvme/block_device.h"
#include "tiers/nvme/nvme_tier.h"
#include "tiers/remote/remote_tier.h"

namespace kvtier {
namespace {

DaemonConfig Defaults() {
  auto config = ParseConfig("", "empty.toml");
  EXPECT_TRUE(config.ok()) << config.status().ToString();
  return config.ok() ? *config : DaemonConfig{};
}

// The default texts the table is built from read as they were written by hand.
static_assert(config_internal::DefaultInt<2000>() == "2000");
static_assert(config_internal::DefaultInt<0>() == "0");
static_assert(config_internal::DefaultBytes<uint64_t{256} << 20>() == "\"256MiB\"");
static_assert(config_internal::DefaultBytes<uint64_t{64} << 30>() == "\"64GiB\"");
static_assert(config_internal::DefaultBytes<1000>() == "1000");
static_assert(config_internal::DefaultBytes<0>() == "0");
static_assert(config_internal::DefaultBool(false) == "false");
constexpr double kQuarter = 0.25;
static_assert(config_internal::DefaultReal<&kQuarter>() == "0.25");
static_assert(config_internal::DefaultReal<&defaults::kDwpdWarrantyYears>() == "5.0");

TEST(ConfigDefaultsTest, AnEmptyConfigGivesTheEngineItsOwnDefaults) {
  const EngineOptions from_config = EngineOptionsFromConfig(Defaults());
  const EngineOptions plain;
  EXPECT_EQ(from_config.shards, plain.shards);
  EXPECT_EQ(from_config.lookahead_us, plain.lookahead_us);
  EXPECT_EQ(from_config.prefetch_share, plain.prefetch_share);
  EXPECT_EQ(from_config.prefetch_min_blocks, plain.prefetch_min_blocks);
  EXPECT_EQ(from_config.demotion_buffer_bytes, plain.demotion_buffer_bytes);
  EXPECT_EQ(from_config.verify_commits, plain.verify_commits);
  // On purpose: kvtierd evicts queue_aware; a bare EngineOptions (the
  // engine's own tests, the benches) keeps the plain LRU.
  EXPECT_EQ(from_config.eviction, EvictionPolicyId::kQueueAware);
  EXPECT_EQ(plain.eviction, EvictionPolicyId::kLru);
}

TEST(ConfigDefaultsTest, AnEmptyConfigGivesTheNvmeTierItsOwnDefaults) {
  const DaemonConfig config = Defaults();
  const BlockDeviceOptions device = BlockDeviceOptionsFromConfig(config);
  const BlockDeviceOptions plain_device;
  EXPECT_EQ(device.direct_io, plain_device.direct_io);
  EXPECT_EQ(device.preallocate, plain_device.preallocate);
  EXPECT_EQ(device.queue_depth, plain_device.queue_depth);
  EXPECT_EQ(device.io_threads, plain_device.io_threads);
  EXPECT_EQ(device.engine, plain_device.engine);
  // On purpose: the option is the file's size to create (16GiB); the
  // struct's 0 means a block device's whole size.
  EXPECT_EQ(plain_device.capacity_bytes, 0u);

  const NvmeTierOptions tier = NvmeTierOptionsFromConfig(config);
  const NvmeTierOptions plain_tier;
  EXPECT_EQ(tier.region_bytes, plain_tier.region_bytes);
  EXPECT_EQ(tier.staging_bytes, plain_tier.staging_bytes);
  EXPECT_EQ(tier.reinsert_share, plain_tier.reinsert_share);
  // On purpose: kvtierd reclaims queue_aware; a bare tier lru.
  EXPECT_EQ(tier.reclaim, ReclaimOrder::kQueueAware);
  EXPECT_EQ(plain_tier.reclaim, ReclaimOrder::kLru);
}

// nvme.io_engine's names reach the device as its engines.
TEST(ConfigDefaultsTest, EachIoEngineNameGivesTheDeviceThatEngine) {
  const std::pair<const char*, IoEngine> rows[] = {
      {"auto", IoEngine::kAuto}, {"io_uring", IoEngine::kIoUring}, {"threads", IoEngine::kThreads}};
  for (const auto& [name, engine] : rows) {
    auto config = ParseConfig("[nvme]\nio_engine = \"" + std::string(name) + "\"\n", "test.toml");
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    EXPECT_EQ(BlockDeviceOptionsFromConfig(*config).engine, engine) << name;
  }
}

TEST(ConfigDefaultsTest, AnEmptyConfigGivesTheRemoteTierItsOwnDefaults) {
  auto remote = RemoteOptionsFromConfig(Defaults());
  ASSERT_TRUE(remote.ok()) << remote.status().ToString();
  const RemoteTierOptions plain;
  EXPECT_EQ(remote->capacity_bytes, plain.capacity_bytes);
  EXPECT_EQ(remote->timeout, plain.timeout);
  EXPECT_EQ(remote->probe_timeout, plain.probe_timeout);
  EXPECT_EQ(remote->retry_interval, plain.retry_interval);
  EXPECT_EQ(remote->threads, plain.threads);
  EXPECT_EQ(remote->staging_bytes, plain.staging_bytes);
  EXPECT_EQ(remote->ttl_seconds, plain.ttl_seconds);
  // On purpose: kvtierd keeps 8 idle connections per node; the cluster
  // client alone keeps 16.
  EXPECT_EQ(remote->cluster.idle_connections_per_node, 8u);
  EXPECT_EQ(plain.cluster.idle_connections_per_node, 16u);
}

TEST(ConfigDefaultsTest, AnEmptyConfigGivesTheDwpdBudgetItsOwnDefaults) {
  auto dwpd = DwpdFromConfig(Defaults());  // no nvme.path: the drive size stays 0
  ASSERT_TRUE(dwpd.ok()) << dwpd.status().ToString();
  const DwpdOptions plain;
  EXPECT_EQ(dwpd->drive_capacity_bytes, plain.drive_capacity_bytes);
  EXPECT_EQ(dwpd->dwpd, plain.dwpd);
  EXPECT_EQ(dwpd->warranty_years, plain.warranty_years);
  EXPECT_EQ(dwpd->planned_years, plain.planned_years);
  EXPECT_EQ(dwpd->share, plain.share);
  EXPECT_EQ(dwpd->max_write_rate, plain.max_write_rate);
}

}  // namespace
}  // namespace kvtier

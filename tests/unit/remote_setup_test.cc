// The [remote] section as kvtierd reads it (daemon/setup/remote_setup.h): node
// lists split and trimmed, every option carried into the tier's options,
// the admission with its rate, and no tier at all when remote.nodes is
// empty (the default). No network: opening a real tier is the cluster
// tests' business (tests/integration/remote_*_test.cc).
#include "daemon/setup/remote_setup.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sys/stat.h>

#include "tests/testing/map_tier.h"
#include "tests/testing/test_daemon.h"

namespace kvtier {
namespace {

DaemonConfig Parse(const std::string& toml) {
  auto config = ParseConfig(toml, "remote.toml");
  EXPECT_TRUE(config.ok()) << config.status().ToString();
  return config.ok() ? *config : DaemonConfig{};
}

TEST(RemoteSetup, TheDefaultIsNoRemoteTier) {
  const DaemonConfig config = Parse("");
  EXPECT_TRUE(config.remote_nodes.empty());
  SystemClock clock;
  auto tier = OpenRemoteTier(config, clock);
  ASSERT_TRUE(tier.ok()) << tier.status().ToString();
  EXPECT_EQ(*tier, nullptr);
}

TEST(RemoteSetup, EveryOptionReachesTheTier) {
  const DaemonConfig config = Parse(
      "[remote]\nnodes = \" 10.0.0.1:7000, 10.0.0.2:7001,,[::1]:7002 \"\ncapacity_bytes = \"2GiB\"\n"
      "timeout_ms = 1500\nprobe_timeout_ms = 7\nretry_ms = 300\nthreads = 3\nstaging_bytes = \"64MiB\"\n"
      "connections_per_node = 5\nttl_s = 3600\n");
  auto made = RemoteOptionsFromConfig(config);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  const RemoteTierOptions& o = *made;
  EXPECT_EQ(o.cluster.seeds, (std::vector<std::string>{"10.0.0.1:7000", "10.0.0.2:7001", "[::1]:7002"}));
  EXPECT_EQ(o.capacity_bytes, 2ull << 30);
  EXPECT_EQ(o.timeout.count(), 1500);
  EXPECT_EQ(o.probe_timeout.count(), 7);
  EXPECT_EQ(o.retry_interval.count(), 300);
  EXPECT_EQ(o.threads, 3u);
  EXPECT_EQ(o.staging_bytes, 64ull << 20);
  EXPECT_EQ(o.cluster.idle_connections_per_node, 5u);
  EXPECT_EQ(o.ttl_seconds, 3600u);
  EXPECT_TRUE(o.cluster.password.empty()) << "no password file: no AUTH";
}

TEST(RemoteSetup, ClusterNetworksAreSplitCheckedAndEmptyByDefault) {
  auto defaults = RemoteOptionsFromConfig(Parse("[remote]\nnodes = \"10.0.0.1:7000\"\n"));
  ASSERT_TRUE(defaults.ok()) << defaults.status().ToString();
  EXPECT_TRUE(defaults->cluster.networks.empty()) << "empty: the seeds' own networks";
  auto set = RemoteOptionsFromConfig(Parse("[remote]\ncluster_networks = \" 10.0.0.0/16, fd00::/64,\"\n"));
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_EQ(set->cluster.networks, (std::vector<std::string>{"10.0.0.0/16", "fd00::/64"}));
  auto bad = RemoteOptionsFromConfig(Parse("[remote]\ncluster_networks = \"10.0.0.0/16,10.0.0.0/40\"\n"));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("remote.cluster_networks"), std::string::npos) << bad.status().ToString();
  EXPECT_NE(bad.status().message().find("10.0.0.0/40"), std::string::npos) << bad.status().ToString();
}

TEST(RemoteSetup, ThePasswordComesFromItsFileWithoutTheTrailingNewline) {
  const std::string dir = testing::MakeTempDir();
  std::ofstream(dir + "/pw") << "s3cret pass\n";
  auto made = RemoteOptionsFromConfig(Parse("[remote]\nuser = \"kv\"\npassword_file = \"" + dir + "/pw\"\n"));
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  EXPECT_EQ(made->cluster.username, "kv");
  EXPECT_EQ(made->cluster.password, "s3cret pass");
  // Missing and empty files are refused, naming the option and the path.
  auto missing = RemoteOptionsFromConfig(Parse("[remote]\npassword_file = \"" + dir + "/none\"\n"));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("remote.password_file"), std::string::npos);
  EXPECT_NE(missing.status().message().find(dir + "/none"), std::string::npos);
  std::ofstream(dir + "/empty") << "\n";
  auto empty = RemoteOptionsFromConfig(Parse("[remote]\npassword_file = \"" + dir + "/empty\"\n"));
  EXPECT_EQ(empty.status().code(), StatusCode::kInvalidArgument);
  // A FIFO (or a device) at the path is refused at once, never read: it
  // would block kvtierd's start until someone wrote to it.
  ASSERT_EQ(::mkfifo((dir + "/fifo").c_str(), 0600), 0);
  auto fifo = RemoteOptionsFromConfig(Parse("[remote]\npassword_file = \"" + dir + "/fifo\"\n"));
  EXPECT_EQ(fifo.status().code(), StatusCode::kInvalidArgument) << fifo.status().ToString();
  EXPECT_NE(fifo.status().message().find("not a regular file"), std::string::npos) << fifo.status().ToString();
  auto device = RemoteOptionsFromConfig(Parse("[remote]\npassword_file = \"/dev/zero\"\n"));
  EXPECT_EQ(device.status().code(), StatusCode::kInvalidArgument) << device.status().ToString();
  testing::RemoveTree(dir);
}

TEST(RemoteSetup, AdmissionIsRateWithItsCapByDefault) {
  const DaemonConfig config = Parse("[remote]\nwrite_rate = \"100MiB\"\n");
  EXPECT_EQ(config.remote_admission, AdmissionPolicyId::kRate);
  testing::MapTier tier(1 << 20, "remote");
  auto lower = RemoteAdmissionFromConfig(config, tier);
  ASSERT_TRUE(lower.ok());
  EXPECT_EQ(lower->tier, &tier);
  EXPECT_EQ(lower->admission, AdmissionPolicyId::kRate);
  EXPECT_EQ(lower->rate_bytes_per_second, 100ull << 20);
}

TEST(RemoteSetup, BadValuesAreRefusedNamingTheKey) {
  for (const char* toml : {"[remote]\nadmission = \"dwpd\"\n", "[remote]\nthreads = 0\n", "[remote]\ntimeout_ms = 1\n",
                           "[remote]\nnodes = 7\n", "[remote]\nwrite_rate = \"1KiB\"\n"}) {
    auto config = ParseConfig(toml, "remote.toml");
    ASSERT_FALSE(config.ok()) << toml;
    EXPECT_NE(config.status().message().find("remote."), std::string::npos) << config.status().message();
  }
  // A node list that is not host:port is refused when the tier opens.
  const std::string dir = testing::MakeTempDir();
  SystemClock clock;
  auto tier =
      OpenRemoteTier(Parse("[remote]\nnodes = \"redis-without-port\"\nkey_file = \"" + dir + "/remote.key\"\n"), clock);
  ASSERT_FALSE(tier.ok());
  EXPECT_EQ(tier.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(tier.status().message().find("redis-without-port"), std::string::npos) << tier.status().message();
  testing::RemoveTree(dir);
}

TEST(RemoteSetup, TheClusterSecretComesFromRemoteKeyFile) {
  EXPECT_EQ(Parse("").remote_key_file, "/var/lib/kvtier/remote.key") << "beside the other state by default";
  const std::string dir = testing::MakeTempDir();
  RemoteTierOptions options;
  ASSERT_TRUE(LoadClusterSecret(Parse("[remote]\nkey_file = \"" + dir + "/k\"\n"), options).ok());
  EXPECT_EQ(options.cluster_secret.size(), 32u);
  // A bad file stops the tier, naming the option.
  std::ofstream(dir + "/short") << "too short";
  ::chmod((dir + "/short").c_str(), 0600);
  Status bad = LoadClusterSecret(Parse("[remote]\nkey_file = \"" + dir + "/short\"\n"), options);
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("remote.key_file"), std::string::npos) << bad.message();
  testing::RemoveTree(dir);
}

}  // namespace
}  // namespace kvtier

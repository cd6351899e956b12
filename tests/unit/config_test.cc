// Tests of the kvtierd option table: defaults, the embedded default TOML,
// every kind of bad input (InvalidArgument naming the key and line), size
// parsing, file loading and --help.
#include "daemon/config/config.h"
#include "daemon/engine/engine.h"
#include "policy/policy_registry.h"
#include "policy/reclaim_policy.h"

#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <string_view>

#include "tests/testing/test_daemon.h"
#include "tests/testing/config_checks.h"

namespace kvtier {
namespace {

constexpr int64_t kKiB = 1024;
constexpr int64_t kMiB = 1024 * kKiB;
constexpr int64_t kGiB = 1024 * kMiB;
constexpr int64_t kTiB = 1024 * kGiB;

// The default of `spec` as the typed value it should produce.
int64_t IntDefault(const OptionSpec& spec) {
  std::string_view v = spec.default_value;
  if (v.size() >= 2 && v.front() == '"') v = v.substr(1, v.size() - 2);
  if (spec.type == OptionType::kBool) {
    EXPECT_TRUE(v == "true" || v == "false") << spec.name;
    return v == "true" ? 1 : 0;
  }
  if (spec.type == OptionType::kBytes) {
    auto parsed = ParseBytes(v);
    EXPECT_TRUE(parsed.ok()) << spec.name << ": " << parsed.status().ToString();
    return parsed.ok() ? *parsed : -1;
  }
  return std::stoll(std::string(v));
}

std::string StringDefault(const OptionSpec& spec) {
  std::string_view v = spec.default_value;
  EXPECT_GE(v.size(), 2u);
  EXPECT_EQ(v.front(), '"') << spec.name;
  EXPECT_EQ(v.back(), '"') << spec.name;
  return std::string(v.substr(1, v.size() - 2));
}

void ExpectSameConfig(const DaemonConfig& a, const DaemonConfig& b) {
  for (const OptionSpec& spec : ConfigOptions()) {
    EXPECT_TRUE(spec.field.same(a, b)) << spec.name << ": " << spec.field.toml(spec, a) << " vs "
                                       << spec.field.toml(spec, b);
  }
}

// The TOML ConfigToml should write for `spec`'s default, worked out from its
// default text alone (not through the row's parser).
std::string ExpectedDefaultToml(const OptionSpec& spec) {
  switch (spec.type) {
    case OptionType::kBool:
      return std::string(spec.default_value);
    case OptionType::kInt:
    case OptionType::kBytes:
      return std::to_string(IntDefault(spec));
    case OptionType::kReal:
      return std::string(spec.default_value);  // the defaults are written as %.17g would
    case OptionType::kString:
    case OptionType::kChoice:
      return TomlQuoted(StringDefault(spec));
  }
  return "?";
}

using ::kvtier::testing::ExpectInvalidConfig;

TEST(ConfigTest, TableIsWellFormed) {
  ASSERT_FALSE(ConfigOptions().empty());
  for (const OptionSpec& spec : ConfigOptions()) {
    SCOPED_TRACE(std::string(spec.name));
    EXPECT_NE(spec.name.find('.'), std::string_view::npos);
    EXPECT_FALSE(spec.doc.empty());
    EXPECT_NE(spec.field.parse, nullptr) << "every row has its parser";
    EXPECT_NE(spec.field.toml, nullptr);
    EXPECT_NE(spec.field.same, nullptr);
    EXPECT_NE(spec.field.copy, nullptr);
    if (spec.type == OptionType::kReal) {
      EXPECT_LE(spec.real_min, spec.real_max);
      const double d = std::stod(std::string(spec.default_value));
      EXPECT_GE(d, spec.real_min);
      EXPECT_LE(d, spec.real_max);
    } else if (spec.type == OptionType::kInt || spec.type == OptionType::kBytes || spec.type == OptionType::kBool) {
      EXPECT_LE(spec.min, spec.max);
      const int64_t d = IntDefault(spec);
      if (spec.zero_is_auto && d == 0) continue;  // auto: resolved at start (daemon/setup/auto_size.h)
      EXPECT_GE(d, spec.min);
      EXPECT_LE(d, spec.max);
    }
    if (spec.type == OptionType::kChoice) {
      EXPECT_FALSE(spec.choices.empty());
    }
  }
}

TEST(ConfigTest, EmptyDocumentGivesTheTableDefaults) {
  auto config = ParseConfig("", "empty.toml");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  for (const OptionSpec& spec : ConfigOptions()) {
    SCOPED_TRACE(std::string(spec.name));
    EXPECT_EQ(spec.field.toml(spec, *config), ExpectedDefaultToml(spec));
  }
  // Spot checks against the documented values.
  EXPECT_EQ(config->socket_path, "/run/kvtier/kvtierd.sock");
  EXPECT_EQ(config->io_threads, 2);
  EXPECT_EQ(config->max_frame_bytes, 1 * kMiB);
  EXPECT_EQ(config->drain_timeout_ms, 5000);
  EXPECT_EQ(config->host_capacity_bytes, 0) << "auto: sized to the machine at start";
  EXPECT_EQ(config->host_lock_memory, LockMemory::kBestEffort);
  EXPECT_EQ(config->engine_shards, 8);
  EXPECT_EQ(config->engine_eviction, EvictionPolicyId::kQueueAware);
  EXPECT_EQ(config->engine_lookahead_ms, 2000);
  EXPECT_EQ(config->engine_demotion_buffer_bytes, 256 * kMiB);
  EXPECT_EQ(static_cast<uint64_t>(config->engine_demotion_buffer_bytes), EngineOptions{}.demotion_buffer_bytes);
  EXPECT_EQ(config->log_level, LogLevel::kInfo);
}

TEST(ConfigTest, DefaultTomlRoundTrips) {
  const std::string toml = DefaultConfigToml();
  for (const OptionSpec& spec : ConfigOptions()) {
    const std::string_view key = spec.name.substr(spec.name.find('.') + 1);
    EXPECT_NE(toml.find(std::string(key) + " = " + std::string(spec.default_value)), std::string::npos) << spec.name;
  }
  auto from_text = ParseConfig(toml, "defaults.toml");
  ASSERT_TRUE(from_text.ok()) << from_text.status().ToString();
  auto empty = ParseConfig("", "empty.toml");
  ASSERT_TRUE(empty.ok());
  ExpectSameConfig(*from_text, *empty);
}

// What `kvtier config get` shows reads back as the same configuration,
// strings with quotes and backslashes included.
TEST(ConfigTest, TheRunningConfigAsTomlReadsBackTheSame) {
  auto config = ParseConfig(R"(
[server]
socket_path = "/tmp/a \"quoted\" \\ path.sock"
max_frame_bytes = "4MiB"
[host]
lock_memory = "off"
[nvme]
path = "/tmp/n.dat"
dwpd = 0.5
[engine]
eviction = "arc"
)",
                            "test.toml");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  const std::string toml = ConfigToml(*config);
  auto again = ParseConfig(toml, "running.toml");
  ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << toml;
  ExpectSameConfig(*config, *again);
  EXPECT_EQ(again->socket_path, "/tmp/a \"quoted\" \\ path.sock");
  EXPECT_NE(toml.find("max_frame_bytes = 4194304\n"), std::string::npos) << toml;
  EXPECT_NE(toml.find("dwpd = 0.5\n"), std::string::npos) << toml;
  for (const OptionSpec& spec : ConfigOptions()) {
    const std::string_view key = spec.name.substr(spec.name.find('.') + 1);
    EXPECT_NE(toml.find("\n" + std::string(key) + " = "), std::string::npos) << spec.name << " missing";
  }
}

TEST(ConfigTest, ValuesOverrideDefaults) {
  auto config = ParseConfig(R"(
[server]
socket_path = "/tmp/x.sock"
io_threads = 8
max_frame_bytes = "4MiB"
[host]
capacity_bytes = 2147483648
lock_memory = "off"
[engine]
shards = 256
eviction = "fifo"
[log]
level = "debug"
)",
                            "test.toml");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->socket_path, "/tmp/x.sock");
  EXPECT_EQ(config->io_threads, 8);
  EXPECT_EQ(config->max_frame_bytes, 4 * kMiB);
  EXPECT_EQ(config->drain_timeout_ms, 5000);  // untouched
  EXPECT_EQ(config->host_capacity_bytes, 2 * kGiB);
  EXPECT_EQ(config->host_lock_memory, LockMemory::kOff);
  EXPECT_EQ(config->engine_shards, 256);
  EXPECT_EQ(config->engine_eviction, EvictionPolicyId::kFifo);
  EXPECT_EQ(config->log_level, LogLevel::kDebug);
}

TEST(ConfigTest, BoundsAreInclusive) {
  auto config = ParseConfig(
      "[server]\nio_threads = 1\nmax_frame_bytes = \"64MiB\"\n"
      "drain_timeout_ms = 0\n[engine]\nshards = 1\n",
      "test.toml");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->io_threads, 1);
  EXPECT_EQ(config->max_frame_bytes, 64 * kMiB);
  EXPECT_EQ(config->drain_timeout_ms, 0);
  EXPECT_EQ(config->engine_shards, 1);
}

TEST(ConfigTest, UnknownSectionOrKeyIsRejected) {
  ExpectInvalidConfig("[server]\nio_threads = 2\n[nope]\nfoo = 1\n", {"test.toml:4", "nope.foo"});
  ExpectInvalidConfig("[server]\n\nio_thread = 2\n", {"test.toml:3", "server.io_thread"});
  ExpectInvalidConfig("io_threads = 2\n", {"test.toml:1", "io_threads"});
}

TEST(ConfigTest, WrongTypeIsRejected) {
  ExpectInvalidConfig("[server]\nio_threads = \"2\"\n", {"test.toml:2", "server.io_threads", "integer"});
  ExpectInvalidConfig("[engine]\nshards = 1.5\n", {"test.toml:2", "engine.shards"});
  ExpectInvalidConfig("[server]\n\n\nsocket_path = 5\n", {"test.toml:4", "server.socket_path", "string"});
  ExpectInvalidConfig("[engine]\neviction = true\n", {"test.toml:2", "engine.eviction"});
  ExpectInvalidConfig("[host]\ncapacity_bytes = [1]\n", {"test.toml:2", "host.capacity_bytes"});
}

TEST(ConfigTest, OutOfRangeIntIsRejected) {
  ExpectInvalidConfig("[server]\nio_threads = 0\n", {"test.toml:2", "server.io_threads", "[1, 256]"});
  ExpectInvalidConfig("[server]\nio_threads = 257\n", {"test.toml:2", "server.io_threads"});
  ExpectInvalidConfig("[engine]\nshards = -1\n", {"test.toml:2", "engine.shards"});
  ExpectInvalidConfig("[server]\ndrain_timeout_ms = 600001\n", {"test.toml:2", "server.drain_timeout_ms"});
  ExpectInvalidConfig("[server]\nmax_frame_bytes = \"1KiB\"\n", {"test.toml:2", "server.max_frame_bytes"});
  ExpectInvalidConfig("[host]\ncapacity_bytes = 1000\n", {"test.toml:2", "host.capacity_bytes"});
}

TEST(ConfigTest, BadChoiceIsRejected) {
  ExpectInvalidConfig("[engine]\neviction = \"clock\"\n",
                      {"test.toml:2", "engine.eviction", "clock", "lru|fifo|lru2|s3fifo|arc|queue_aware"});
  ExpectInvalidConfig("[host]\nlock_memory = \"yes\"\n", {"test.toml:2", "host.lock_memory"});
  ExpectInvalidConfig("[log]\nlevel = \"INFO\"\n", {"test.toml:2", "log.level"});
}

// nvme.eviction takes every reclaim order the NVMe tier knows
// (policy/reclaim_policy.h), and a bad name lists them all.
TEST(ConfigTest, NvmeEvictionTakesEveryReclaimOrder) {
  auto defaults = ParseConfig("", "empty.toml");
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults->nvme_eviction, EvictionPolicyId::kQueueAware);
  for (const OptionSpec& spec : ConfigOptions()) {
    if (std::string_view(spec.name) == "nvme.eviction") {
      EXPECT_EQ(spec.choices, ReclaimOrderChoices());
    }
  }
  for (std::string_view name : {"fifo", "lru", "lru2", "s3fifo", "arc", "queue_aware"}) {
    SCOPED_TRACE(std::string(name));
    auto config = ParseConfig("[nvme]\neviction = \"" + std::string(name) + "\"\n", "test.toml");
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    EXPECT_EQ(EvictionPolicyName(config->nvme_eviction), name);
    auto order = ParseReclaimOrder(EvictionPolicyName(config->nvme_eviction));
    ASSERT_TRUE(order.has_value());
    EXPECT_EQ(ReclaimOrderName(*order), name);
  }
  ExpectInvalidConfig("[nvme]\neviction = \"clock\"\n",
                      {"test.toml:2", "nvme.eviction", "clock", "lru|fifo|lru2|s3fifo|arc|queue_aware"});
  ExpectInvalidConfig("[nvme]\neviction = \"LRU2\"\n", {"test.toml:2", "nvme.eviction", "LRU2"});
}

TEST(ConfigTest, BadSizeUnitIsRejected) {
  ExpectInvalidConfig("[host]\ncapacity_bytes = \"1XB\"\n", {"test.toml:2", "host.capacity_bytes", "unit"});
  ExpectInvalidConfig("[host]\ncapacity_bytes = \"lots\"\n", {"test.toml:2", "host.capacity_bytes"});
}

TEST(ConfigTest, NvmeSectionParsesBooleansAndMayLeavePathsEmpty) {
  auto defaults = ParseConfig("", "empty.toml");
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults->nvme_path, "") << "no NVMe tier by default";
  EXPECT_TRUE(defaults->nvme_direct_io);
  EXPECT_FALSE(defaults->nvme_sync_index);
  EXPECT_EQ(defaults->nvme_region_bytes, 64 * kMiB);
  auto config = ParseConfig(R"(
[nvme]
path = "/var/lib/kvtier/tier.dat"
capacity_bytes = "2TiB"
direct_io = false
sync_index = true
io_engine = "threads"
index_path = ""
)",
                            "test.toml");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->nvme_path, "/var/lib/kvtier/tier.dat");
  EXPECT_EQ(config->nvme_capacity_bytes, 2 * kTiB);
  EXPECT_FALSE(config->nvme_direct_io);
  EXPECT_TRUE(config->nvme_sync_index);
  EXPECT_EQ(config->nvme_io_engine, NvmeIoEngine::kThreads);
  ExpectInvalidConfig("[nvme]\ndirect_io = \"yes\"\n", {"test.toml:2", "nvme.direct_io", "true or false"});
  ExpectInvalidConfig("[nvme]\nio_engine = \"spdk\"\n", {"test.toml:2", "nvme.io_engine"});
  ExpectInvalidConfig("[nvme]\nregion_bytes = \"512KiB\"\n", {"test.toml:2", "nvme.region_bytes"});
}

TEST(ConfigTest, AdmissionAndDwpdOptions) {
  auto defaults = ParseConfig("", "empty.toml");
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults->nvme_admission, AdmissionPolicyId::kDwpd);
  EXPECT_EQ(defaults->nvme_dwpd_drive_bytes, 0) << "0: the file system's size";
  EXPECT_EQ(defaults->nvme_dwpd, 1.0);
  EXPECT_EQ(defaults->nvme_dwpd_warranty_years, 5.0);
  EXPECT_EQ(defaults->nvme_dwpd_planned_years, 5.0);
  EXPECT_EQ(defaults->nvme_dwpd_share, 1.0);
  EXPECT_EQ(defaults->nvme_dwpd_max_write_rate, 0);
  auto config = ParseConfig(R"(
[nvme]
admission = "second_hit"
dwpd_drive_bytes = "3840GB"
dwpd = 0.3
dwpd_warranty_years = 5
dwpd_planned_years = 7.5
dwpd_share = 0.25
dwpd_max_write_rate = "200MB"
)",
                            "test.toml");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->nvme_admission, AdmissionPolicyId::kSecondHit);
  EXPECT_EQ(config->nvme_dwpd_drive_bytes, 3'840'000'000'000);
  EXPECT_DOUBLE_EQ(config->nvme_dwpd, 0.3);
  EXPECT_DOUBLE_EQ(config->nvme_dwpd_warranty_years, 5.0);  // an integer is a number too
  EXPECT_DOUBLE_EQ(config->nvme_dwpd_planned_years, 7.5);
  EXPECT_DOUBLE_EQ(config->nvme_dwpd_share, 0.25);
  EXPECT_EQ(config->nvme_dwpd_max_write_rate, 200'000'000);
  ExpectInvalidConfig("[nvme]\nadmission = \"lru\"\n", {"test.toml:2", "nvme.admission", "all|second_hit|dwpd"});
  ExpectInvalidConfig("[nvme]\ndwpd_share = 1.5\n", {"test.toml:2", "nvme.dwpd_share", "outside", "1]"});
  ExpectInvalidConfig("[nvme]\ndwpd_share = 0\n", {"test.toml:2", "nvme.dwpd_share"});
  ExpectInvalidConfig("[nvme]\ndwpd = \"one\"\n", {"test.toml:2", "nvme.dwpd", "number"});
  ExpectInvalidConfig("[nvme]\ndwpd_planned_years = -5\n", {"test.toml:2", "nvme.dwpd_planned_years"});
}

TEST(ConfigTest, PackagedSampleConfigIsValid) {
  auto sample = LoadConfigFile(std::string(KVTIER_SOURCE_DIR) + "/packaging/kvtierd.toml");
  ASSERT_TRUE(sample.ok()) << sample.status().ToString();
  EXPECT_EQ(sample->host_lock_memory, LockMemory::kRequired);
  EXPECT_EQ(sample->nvme_path, "/var/lib/kvtier/nvme-tier.dat");
}

TEST(ConfigTest, EmptySocketPathIsRejected) {
  ExpectInvalidConfig("[server]\nsocket_path = \"\"\n", {"test.toml:2", "server.socket_path", "empty"});
}

TEST(ConfigTest, MalformedTomlIsRejected) {
  ExpectInvalidConfig("[server\nio_threads = 2\n", {"test.toml:1"});
  ExpectInvalidConfig("[server]\nio_threads = \n", {"test.toml:2"});
  ExpectInvalidConfig("[server]\nio_threads = 2\nio_threads = 3\n", {"test.toml:3"});
}

TEST(ParseBytesTest, Units) {
  struct Case {
    const char* text;
    int64_t bytes;
  };
  const Case cases[] = {
      {"0", 0},
      {"4096", 4096},
      {"17B", 17},
      {"64KiB", 64 * kKiB},
      {"512MiB", 512 * kMiB},
      {"1GiB", kGiB},
      {"2TiB", 2 * kTiB},
      {"3KB", 3000},
      {"2MB", 2'000'000},
      {"2GB", 2'000'000'000},
      {"1TB", 1'000'000'000'000},
      {"1 MiB", kMiB},
      {"9223372036854775807", INT64_MAX},
      {"8589934591GiB", 8589934591 * kGiB},
  };
  for (const Case& c : cases) {
    auto parsed = ParseBytes(c.text);
    ASSERT_TRUE(parsed.ok()) << c.text << ": " << parsed.status().ToString();
    EXPECT_EQ(*parsed, c.bytes) << c.text;
  }
}

TEST(ParseBytesTest, Rejects) {
  for (const char* text : {"", "-1", "-1KiB", "abc", "KiB", "1.5GiB", "12abc", "1kib", "1 K", "9223372036854775808",
                           "8589934592GiB", "16777216TiB", "99999999999999999999", " 5", "+5", "5MiB "}) {
    auto parsed = ParseBytes(text);
    EXPECT_FALSE(parsed.ok()) << "'" << text << "' parsed as " << (parsed.ok() ? *parsed : 0);
    if (!parsed.ok()) {
      EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument) << text;
    }
  }
}

TEST(ConfigTest, LoadConfigFile) {
  auto missing = LoadConfigFile("/nonexistent/kvtier/kvtierd.toml");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kIoError);
  EXPECT_NE(missing.status().message().find("/nonexistent/kvtier/kvtierd.toml"), std::string::npos);

  const std::string dir = testing::MakeTempDir();
  const std::string path = dir + "/kvtierd.toml";
  {
    std::ofstream out(path);
    out << "[engine]\nshards = 4\n";
  }
  auto loaded = LoadConfigFile(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(loaded->engine_shards, 4);
  {
    std::ofstream out(path);
    out << "[engine]\nshards = 0\n";
  }
  auto bad = LoadConfigFile(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find(path + ":2"), std::string::npos) << bad.status().message();
  testing::RemoveTree(dir);
}

// Only a regular file is read: a device, a directory or a FIFO would read
// forever, read as an empty file (the defaults) or block the reader.
TEST(ConfigTest, LoadConfigFileRefusesWhatIsNotARegularFile) {
  const std::string dir = testing::MakeTempDir();
  const std::string fifo = dir + "/fifo.toml";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string link = dir + "/null.toml";
  ASSERT_EQ(::symlink("/dev/null", link.c_str()), 0);
  for (const std::string& path : {std::string("/dev/null"), std::string("/dev/zero"), dir, fifo, link}) {
    auto loaded = LoadConfigFile(path);
    ASSERT_FALSE(loaded.ok()) << path;
    EXPECT_EQ(loaded.status().code(), StatusCode::kInvalidArgument) << path;
    EXPECT_NE(loaded.status().message().find(path + " is not a regular file"), std::string::npos)
        << loaded.status().message();
  }
  // A symbolic link to a regular file is read (a config management tool's
  // usual layout); so is an empty file (the defaults).
  const std::string real = dir + "/real.toml";
  { std::ofstream(real) << "[engine]\nshards = 4\n"; }
  const std::string to_real = dir + "/to-real.toml";
  ASSERT_EQ(::symlink(real.c_str(), to_real.c_str()), 0);
  auto followed = LoadConfigFile(to_real);
  ASSERT_TRUE(followed.ok()) << followed.status().ToString();
  EXPECT_EQ(followed->engine_shards, 4);
  const std::string empty = dir + "/empty.toml";
  { std::ofstream out(empty); }
  EXPECT_TRUE(LoadConfigFile(empty).ok());
  testing::RemoveTree(dir);
}

// A regular file far larger than any configuration (kMaxConfigFileBytes) is
// refused before it is read.
TEST(ConfigTest, LoadConfigFileRefusesAHugeFile) {
  const std::string dir = testing::MakeTempDir();
  const std::string path = dir + "/huge.toml";
  { std::ofstream(path) << "# a comment\n"; }
  ASSERT_EQ(::truncate(path.c_str(), 256 * kMiB), 0);  // sparse: no disk
  auto loaded = LoadConfigFile(path);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(loaded.status().message().find("larger than"), std::string::npos) << loaded.status().message();
  testing::RemoveTree(dir);
}

TEST(ConfigTest, HelpMentionsEveryOption) {
  const std::string help = OptionsHelp();
  for (const OptionSpec& spec : ConfigOptions()) {
    EXPECT_NE(help.find(std::string(spec.name)), std::string::npos) << spec.name;
    EXPECT_NE(help.find(std::string(spec.doc)), std::string::npos) << spec.name;
  }
}

}  // namespace
}  // namespace kvtier

namespace kvtier {
namespace {

TEST(ConfigTest, ATenantsViewHoldsItsOwnTenantAndNoSecretPaths) {
  auto config = ParseConfig(
      "[server]\ntenant_key_file = \"/var/lib/kvtier/key\"\n"
      "[remote]\npassword_file = \"/etc/kvtier/redis-pass\"\n"
      "[[tenant]]\nname = \"alpha\"\nuids = [1101]\nmodels = [\"a/m\"]\n"
      "[[tenant]]\nname = \"beta\"\nuids = [1102]\n",
      "test");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  const std::string beta = TenantConfigToml(*config, "beta");
  EXPECT_NE(beta.find("name = \"beta\""), std::string::npos) << beta;
  EXPECT_EQ(beta.find("alpha"), std::string::npos) << beta;
  EXPECT_EQ(beta.find("1101"), std::string::npos) << beta;
  EXPECT_EQ(beta.find("/var/lib/kvtier/key"), std::string::npos) << beta;
  EXPECT_EQ(beta.find("/etc/kvtier/redis-pass"), std::string::npos) << beta;
  auto reread = ParseConfig(beta, "beta's view");
  ASSERT_TRUE(reread.ok()) << reread.status().ToString();
  ASSERT_EQ(reread->tenants.size(), 1u);
  EXPECT_EQ(reread->tenants[0], config->tenants[1]);
  const std::string all = ConfigToml(*config);
  EXPECT_NE(all.find("name = \"alpha\""), std::string::npos);
  EXPECT_NE(all.find("/var/lib/kvtier/key"), std::string::npos) << "the operator's view is whole";
}

}  // namespace
}  // namespace kvtier

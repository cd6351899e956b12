// Tests of the [[tenant]] tables (daemon/config/tenant_config.h): parsing through
// ApplyTenants and ParseConfig, every kind of bad table (InvalidArgument
// naming the origin), the TenantsToml round trip, and the equal shares
// ResolveTenantShares hands out.
#include "daemon/config/tenant_config.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "daemon/config/config.h"

namespace kvtier {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;
constexpr int64_t kTiB = int64_t{1} << 40;

// Parses `toml` and applies its "tenant" key to `tenants`.
Status Apply(const std::string& toml, std::vector<TenantConfig>& tenants, std::string_view origin = "t.toml") {
  toml::table table = toml::parse(toml, std::string_view("t.toml"));
  const toml::node* node = table.get("tenant");
  EXPECT_NE(node, nullptr) << toml;
  if (node == nullptr) return Internal("no tenant key");
  return ApplyTenants(*node, origin, tenants);
}

void ExpectInvalid(const std::string& toml, std::string_view needle) {
  std::vector<TenantConfig> tenants;
  Status s = Apply(toml, tenants, "bad.toml");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << toml << "\n" << s.ToString();
  EXPECT_NE(s.message().find("bad.toml"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(needle), std::string::npos) << "wanted '" << needle << "' in: " << s.message();
}

TEST(TenantConfigTest, ParsesEveryKey) {
  std::vector<TenantConfig> tenants;
  ASSERT_TRUE(Apply(R"(
[[tenant]]
name = "team-a"
uids = [1001, 1002]
gids = [3000]
host_bytes = "8GiB"
hbm_bytes = "4GiB"
nvme_bytes = "1TiB"
models = ["meta-llama/Llama-3.1-8B", "Qwen/Qwen2-7B"]

[[tenant]]
name = "team_b.2"
gids = [4000, 4001]
host_bytes = 123456789
)",
                    tenants)
                  .ok());
  ASSERT_EQ(tenants.size(), 2u);
  const TenantConfig& a = tenants[0];
  EXPECT_EQ(a.name, "team-a");
  EXPECT_EQ(a.uids, (std::vector<uint32_t>{1001, 1002}));
  EXPECT_EQ(a.gids, (std::vector<uint32_t>{3000}));
  EXPECT_EQ(a.host_bytes, 8 * kGiB);
  EXPECT_EQ(a.hbm_bytes, 4 * kGiB);
  EXPECT_EQ(a.nvme_bytes, kTiB);
  EXPECT_EQ(a.models, (std::vector<std::string>{"meta-llama/Llama-3.1-8B", "Qwen/Qwen2-7B"}));
  const TenantConfig& b = tenants[1];
  EXPECT_EQ(b.name, "team_b.2");
  EXPECT_TRUE(b.uids.empty());
  EXPECT_EQ(b.gids, (std::vector<uint32_t>{4000, 4001}));
  EXPECT_EQ(b.host_bytes, 123456789);
  EXPECT_EQ(b.hbm_bytes, 0);   // absent: an equal share later
  EXPECT_EQ(b.nvme_bytes, 0);  // absent: no quota
  EXPECT_TRUE(b.models.empty());
}

TEST(TenantConfigTest, ParseConfigRoutesTenantTables) {
  auto config = ParseConfig(R"(
[host]
capacity_bytes = "1GiB"

[[tenant]]
name = "a"
uids = [1001]

[[tenant]]
name = "b"
gids = [2000]
nvme_bytes = "2GiB"
)",
                            "daemon.toml");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  ASSERT_EQ(config->tenants.size(), 2u);
  EXPECT_EQ(config->tenants[0].name, "a");
  EXPECT_EQ(config->tenants[0].uids, (std::vector<uint32_t>{1001}));
  EXPECT_EQ(config->tenants[1].name, "b");
  EXPECT_EQ(config->tenants[1].nvme_bytes, 2 * kGiB);
  EXPECT_EQ(config->host_capacity_bytes, kGiB);

  auto none = ParseConfig("[host]\ncapacity_bytes = \"1GiB\"\n", "daemon.toml");
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_TRUE(none->tenants.empty());
}

TEST(TenantConfigTest, ParseConfigReportsTenantErrorsWithOriginAndLine) {
  auto config = ParseConfig(R"(
[[tenant]]
name = "a"
uids = [1001]

[[tenant]]
name = "b"
uids = [1002]
colour = "blue"
)",
                            "daemon.toml");
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(config.status().message().find("daemon.toml:"), std::string::npos) << config.status().message();
  EXPECT_NE(config.status().message().find("colour"), std::string::npos) << config.status().message();
}

TEST(TenantConfigTest, AppendsToExistingTenantsAndChecksAcrossThem) {
  std::vector<TenantConfig> tenants;
  ASSERT_TRUE(Apply("[[tenant]]\nname = \"a\"\nuids = [1]\n", tenants).ok());
  ASSERT_TRUE(Apply("[[tenant]]\nname = \"b\"\nuids = [2]\n", tenants).ok());
  ASSERT_EQ(tenants.size(), 2u);
  EXPECT_EQ(tenants[1].name, "b");
  // A later table that reuses a uid or a name already held is refused.
  EXPECT_EQ(Apply("[[tenant]]\nname = \"c\"\nuids = [1]\n", tenants).code(), StatusCode::kInvalidArgument);
  std::vector<TenantConfig> again = {tenants[0]};
  EXPECT_EQ(Apply("[[tenant]]\nname = \"a\"\nuids = [7]\n", again).code(), StatusCode::kInvalidArgument);
}

TEST(TenantConfigTest, RejectsMalformedTables) {
  ExpectInvalid("tenant = 5\n", "[[tenant]]");
  ExpectInvalid("tenant = [1, 2]\n", "[[tenant]]");
  ExpectInvalid("[tenant]\nname = \"a\"\nuids = [1]\n", "[[tenant]]");
  ExpectInvalid("[[tenant]]\nname = \"a\"\nuids = [1]\ncolour = \"blue\"\n", "colour");
  ExpectInvalid("[[tenant]]\nname = 5\nuids = [1]\n", "tenant.name");
  ExpectInvalid("[[tenant]]\nuids = [1]\n", "tenant.name");  // no name
  ExpectInvalid("[[tenant]]\nname = \"\"\nuids = [1]\n", "tenant.name");
  ExpectInvalid("[[tenant]]\nname = \"team a\"\nuids = [1]\n", "team a");
  ExpectInvalid("[[tenant]]\nname = \"a/b\"\nuids = [1]\n", "a/b");
  ExpectInvalid("[[tenant]]\nname = \"" + std::string(65, 'x') + "\"\nuids = [1]\n", "tenant.name");
  ExpectInvalid("[[tenant]]\nname = \"a\"\n", "no uids and no gids");
  ExpectInvalid("[[tenant]]\nname = \"a\"\nuids = []\ngids = []\n", "no uids and no gids");
  ExpectInvalid("[[tenant]]\nname = \"a\"\nuids = 1001\n", "tenant.uids");
  ExpectInvalid("[[tenant]]\nname = \"a\"\nuids = [\"1001\"]\n", "tenant.uids");
  ExpectInvalid("[[tenant]]\nname = \"a\"\ngids = [-1]\n", "tenant.gids");
  ExpectInvalid("[[tenant]]\nname = \"a\"\nuids = [4294967295]\n", "4294967295");  // (uid_t)-1
  ExpectInvalid("[[tenant]]\nname = \"a\"\nuids = [4294967296]\n", "tenant.uids");
  ExpectInvalid("[[tenant]]\nname = \"a\"\nuids = [1]\nhost_bytes = -1\n", "tenant.host_bytes");
  ExpectInvalid("[[tenant]]\nname = \"a\"\nuids = [1]\nhbm_bytes = \"-1GiB\"\n", "tenant.hbm_bytes");
  ExpectInvalid("[[tenant]]\nname = \"a\"\nuids = [1]\nnvme_bytes = \"lots\"\n", "tenant.nvme_bytes");
  ExpectInvalid("[[tenant]]\nname = \"a\"\nuids = [1]\nnvme_bytes = 1.5\n", "tenant.nvme_bytes");
  ExpectInvalid("[[tenant]]\nname = \"a\"\nuids = [1]\nmodels = \"m\"\n", "tenant.models");
  ExpectInvalid("[[tenant]]\nname = \"a\"\nuids = [1]\nmodels = [\"\"]\n", "tenant.models");
  ExpectInvalid("[[tenant]]\nname = \"a\"\nuids = [1]\nmodels = [3]\n", "tenant.models");
}

TEST(TenantConfigTest, NamesTheLineOfTheBadTable) {
  std::vector<TenantConfig> tenants;
  Status s = Apply("[[tenant]]\nname = \"a\"\nuids = [1]\n\n[[tenant]]\nname = \"b\"\nuids = [2]\nhost_bytes = -5\n",
                   tenants, "lines.toml");
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("lines.toml:5"), std::string::npos) << s.message();
}

TEST(TenantConfigTest, RejectsDuplicates) {
  // The error names the line of the second table.
  std::vector<TenantConfig> twice;
  Status s = Apply("[[tenant]]\nname = \"a\"\nuids = [1]\n\n[[tenant]]\nname = \"a\"\nuids = [2]\n", twice, "dup.toml");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("dup.toml:5"), std::string::npos) << s.message();
  ExpectInvalid("[[tenant]]\nname = \"a\"\nuids = [1]\n[[tenant]]\nname = \"a\"\nuids = [2]\n", "declared twice");
  ExpectInvalid("[[tenant]]\nname = \"a\"\nuids = [1]\n[[tenant]]\nname = \"b\"\nuids = [1]\n", "uid 1");
  ExpectInvalid("[[tenant]]\nname = \"a\"\ngids = [9]\n[[tenant]]\nname = \"b\"\ngids = [9]\n", "gid 9");
  // A uid of one tenant may be a gid of another (different id spaces), and
  // one tenant may repeat its own id.
  std::vector<TenantConfig> tenants;
  EXPECT_TRUE(Apply("[[tenant]]\nname = \"a\"\nuids = [5, 5]\n[[tenant]]\nname = \"b\"\ngids = [5]\n", tenants).ok());
  EXPECT_EQ(tenants.size(), 2u);
}

TEST(TenantConfigTest, AtMostMaxTenants) {
  std::string toml;
  for (size_t i = 0; i < kMaxTenants; ++i) {
    toml += "[[tenant]]\nname = \"t" + std::to_string(i) + "\"\nuids = [" + std::to_string(1000 + i) + "]\n";
  }
  std::vector<TenantConfig> tenants;
  ASSERT_TRUE(Apply(toml, tenants).ok());
  EXPECT_EQ(tenants.size(), kMaxTenants);
  toml += "[[tenant]]\nname = \"one-more\"\nuids = [1]\n";
  ExpectInvalid(toml, std::to_string(kMaxTenants) + " tenants");
}

TEST(TenantConfigTest, TenantsTomlRoundTrips) {
  std::vector<TenantConfig> tenants(3);
  tenants[0].name = "team-a";
  tenants[0].uids = {1001, 1002};
  tenants[0].gids = {3000};
  tenants[0].host_bytes = 8 * kGiB;
  tenants[0].hbm_bytes = 4 * kGiB + 7;
  tenants[0].nvme_bytes = kTiB;
  tenants[0].models = {"meta-llama/Llama-3.1-8B", "with \"quotes\" and \\backslash"};
  tenants[1].name = "B_2.x";
  tenants[1].gids = {0, 4294967294u};
  tenants[2].name = "ctl";
  tenants[2].uids = {7};
  tenants[2].models = {"tab\there", "new\nline", "bell\x07", "del\x7f"};

  const std::string toml = TenantsToml(tenants);
  std::vector<TenantConfig> back;
  Status s;
  try {
    s = Apply(toml, back);
  } catch (const toml::parse_error& e) {
    FAIL() << "TenantsToml wrote what TOML cannot parse: " << e.description() << "\n" << toml;
  }
  ASSERT_TRUE(s.ok()) << s.ToString() << "\n" << toml;
  EXPECT_EQ(back, tenants) << toml;
  EXPECT_NE(toml.find("host_bytes = 8589934592\n"), std::string::npos) << toml;  // plain integers
  EXPECT_TRUE(TenantsToml({}).empty());
}

TEST(TenantConfigTest, ConfigTomlRoundTripsTenants) {
  auto config = ParseConfig(
      "[[tenant]]\nname = \"a\"\nuids = [1]\nhost_bytes = \"1GiB\"\n"
      "[[tenant]]\nname = \"b\"\ngids = [2]\nmodels = [\"m\"]\n",
      "a.toml");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  auto back = ParseConfig(ConfigToml(*config), "written.toml");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->tenants, config->tenants);
}

std::vector<TenantConfig> Named(std::vector<int64_t> host_bytes) {
  std::vector<TenantConfig> tenants;
  for (size_t i = 0; i < host_bytes.size(); ++i) {
    TenantConfig t;
    t.name = "t" + std::to_string(i);
    t.uids = {static_cast<uint32_t>(i + 1)};
    t.host_bytes = host_bytes[i];
    tenants.push_back(t);
  }
  return tenants;
}

TEST(TenantConfigTest, ResolveSharesSplitsWhatTheSizedLeave) {
  std::vector<TenantConfig> tenants = Named({256 * kMiB, 0, 0});
  tenants[0].hbm_bytes = kGiB;
  ASSERT_TRUE(ResolveTenantShares(kGiB, 4 * kGiB, tenants).ok());
  EXPECT_EQ(tenants[0].host_bytes, 256 * kMiB);
  EXPECT_EQ(tenants[1].host_bytes, 384 * kMiB);
  EXPECT_EQ(tenants[2].host_bytes, 384 * kMiB);
  EXPECT_EQ(tenants[0].hbm_bytes, kGiB);
  EXPECT_EQ(tenants[1].hbm_bytes, 3 * kGiB / 2);
  EXPECT_EQ(tenants[2].hbm_bytes, 3 * kGiB / 2);
}

TEST(TenantConfigTest, ResolveSharesLeavesHbmAloneWithoutHbm) {
  std::vector<TenantConfig> tenants = Named({0, 0});
  ASSERT_TRUE(ResolveTenantShares(kGiB, 0, tenants).ok());
  EXPECT_EQ(tenants[0].host_bytes, kGiB / 2);
  EXPECT_EQ(tenants[1].host_bytes, kGiB / 2);
  EXPECT_EQ(tenants[0].hbm_bytes, 0);
  EXPECT_EQ(tenants[1].hbm_bytes, 0);
}

TEST(TenantConfigTest, ResolveSharesWithAllSizedKeepsThem) {
  std::vector<TenantConfig> tenants = Named({100 * kMiB, 200 * kMiB});
  ASSERT_TRUE(ResolveTenantShares(kGiB, 0, tenants).ok());
  EXPECT_EQ(tenants[0].host_bytes, 100 * kMiB);
  EXPECT_EQ(tenants[1].host_bytes, 200 * kMiB);
  std::vector<TenantConfig> none;
  EXPECT_TRUE(ResolveTenantShares(0, 0, none).ok());
}

TEST(TenantConfigTest, ResolveSharesRefusesOvercommitAndTinyShares) {
  std::vector<TenantConfig> over = Named({kGiB, kGiB});
  Status s = ResolveTenantShares(kGiB, 0, over);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("host"), std::string::npos) << s.message();

  // What is left, split, falls below the minimum arena.
  std::vector<TenantConfig> tiny = Named({kGiB - 16 * kMiB, 0, 0});
  EXPECT_EQ(ResolveTenantShares(kGiB, 0, tiny).code(), StatusCode::kInvalidArgument);

  // A sized tenant below the minimum.
  std::vector<TenantConfig> small = Named({kMinTenantHostBytes - 1, 0});
  s = ResolveTenantShares(kGiB, 0, small);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("t0"), std::string::npos) << s.message();

  // Exactly the minimum is fine.
  std::vector<TenantConfig> exact = Named({0, 0});
  EXPECT_TRUE(ResolveTenantShares(2 * kMinTenantHostBytes, 0, exact).ok());
  EXPECT_EQ(exact[1].host_bytes, kMinTenantHostBytes);

  // HBM overcommitted.
  std::vector<TenantConfig> hbm = Named({0, 0});
  hbm[0].hbm_bytes = 3 * kGiB;
  s = ResolveTenantShares(kGiB, 2 * kGiB, hbm);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("hbm"), std::string::npos) << s.message();
}

TEST(TenantConfigTest, ResolveSharesRefusesSizesThatOverflowWhenAdded) {
  // Each fits in int64_t; their sum does not. Must be refused, not wrap.
  const int64_t huge = std::numeric_limits<int64_t>::max() / 2 + 1;
  std::vector<TenantConfig> tenants = Named({huge, huge});
  EXPECT_EQ(ResolveTenantShares(kGiB, 0, tenants).code(), StatusCode::kInvalidArgument);
  std::vector<TenantConfig> with_unsized = Named({huge, huge, 0});
  EXPECT_EQ(ResolveTenantShares(kGiB, 0, with_unsized).code(), StatusCode::kInvalidArgument);
  std::vector<TenantConfig> hbm = Named({0, 0});
  hbm[0].hbm_bytes = huge;
  hbm[1].hbm_bytes = huge;
  EXPECT_EQ(ResolveTenantShares(kGiB, kGiB, hbm).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvtier

// MemberRegistry over a real Redis Cluster: nodes announce their peer
// addresses and find each other's; an entry of another cluster (another
// secret) or a forged one is ignored and left alone; a lapsed one drops
// out and, long lapsed, is deleted; Leave removes a node at once.
#include "tiers/remote/member_registry.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "tests/testing/redis_cluster.h"

namespace kvtier::testing {
namespace {

using namespace std::chrono_literals;

const SystemClock kClock{};
const std::string kSecret(32, 'c');
constexpr char kHash[] = "kvtier:peer-members";

class MemberRegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = RedisCluster::Unavailable(); !why.empty()) GTEST_SKIP() << why;
    RedisCluster::Options o;
    o.replicas_per_master = 0;
    auto cluster = RedisCluster::Start(o);
    ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
    cluster_ = std::move(*cluster);
  }

  std::unique_ptr<MemberRegistry> Registry(const std::string& id, const std::string& address,
                                           const std::string& secret = kSecret) {
    ClusterOptions c;
    c.seeds = cluster_->Seeds();
    auto client = ClusterClient::Create(c, kClock);
    EXPECT_TRUE(client.ok()) << client.status().ToString();
    if (!client.ok()) return nullptr;
    MemberRegistryOptions o;
    o.self_id = id;
    o.self_address = address;
    o.ttl = 10s;
    o.now_ms = [this] { return now_ms_.load(); };
    auto registry = MemberRegistry::Create(std::move(*client), secret, std::move(o));
    EXPECT_TRUE(registry.ok()) << registry.status().ToString();
    return registry.ok() ? std::move(*registry) : nullptr;
  }
  std::vector<std::string> Addresses(MemberRegistry& r) {
    auto members = r.Refresh();
    EXPECT_TRUE(members.ok()) << members.status().ToString();
    return members.ok() ? members->addresses : std::vector<std::string>{};
  }
  size_t Fields() {
    auto n = cluster_->ClusterCli({"HLEN", kHash});
    EXPECT_TRUE(n.ok()) << n.status().ToString();
    return n.ok() ? std::stoul(*n) : 0;
  }

  std::unique_ptr<RedisCluster> cluster_;
  std::atomic<int64_t> now_ms_{1'000'000'000'000};
};

TEST_F(MemberRegistryTest, NodesFindEachOtherButNotThemselvesAndALeaverGoesAtOnce) {
  auto a = Registry("a", "10.0.0.1:7400");
  auto b = Registry("b", "10.0.0.2:7400");
  auto c = Registry("c", "10.0.0.3:7400");
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(Addresses(*a), std::vector<std::string>{});
  EXPECT_EQ(Addresses(*b), std::vector<std::string>{"10.0.0.1:7400"});
  EXPECT_EQ(Addresses(*c), (std::vector<std::string>{"10.0.0.1:7400", "10.0.0.2:7400"}));
  EXPECT_EQ(Addresses(*a), (std::vector<std::string>{"10.0.0.2:7400", "10.0.0.3:7400"}));
  ASSERT_TRUE(b->Leave().ok());
  EXPECT_EQ(Addresses(*a), std::vector<std::string>{"10.0.0.3:7400"});
  EXPECT_EQ(Fields(), 2u);
}

TEST_F(MemberRegistryTest, AnotherClustersOrAForgedEntryIsIgnoredAndLeftAlone) {
  auto mine = Registry("mine", "10.0.0.1:7400");
  auto theirs = Registry("theirs", "10.9.9.9:7400", std::string(32, 'x'));
  ASSERT_TRUE(mine && theirs);
  ASSERT_TRUE(theirs->Refresh().ok());
  // A forged entry (AnEntryThatVerifiesUnderAnotherFieldIsRefused has one copied under another field).
  ASSERT_TRUE(mine->Refresh().ok());
  auto value = cluster_->ClusterCli({"HSET", kHash, "junk", "not an entry"});
  ASSERT_TRUE(value.ok()) << value.status().ToString();
  auto members = mine->Refresh();
  ASSERT_TRUE(members.ok()) << members.status().ToString();
  EXPECT_TRUE(members->addresses.empty()) << members->addresses.front();
  EXPECT_EQ(members->refused, 2u);
  EXPECT_EQ(Fields(), 3u) << "entries that do not verify are never deleted";
}

TEST_F(MemberRegistryTest, AnEntryThatVerifiesUnderAnotherFieldIsRefused) {
  auto a = Registry("a", "10.0.0.1:7400");
  ASSERT_TRUE(a);
  const std::string value = a->Encode("a", "10.0.0.1:7400", now_ms_.load() + 10'000);
  EXPECT_EQ(*a->Decode("a", value, now_ms_.load()), "10.0.0.1:7400");
  EXPECT_EQ(a->Decode("b", value, now_ms_.load()).status().code(), StatusCode::kCorruption);
  std::string tampered = value;
  tampered[tampered.size() - 40] ^= 1;  // inside the address
  EXPECT_EQ(a->Decode("a", tampered, now_ms_.load()).status().code(), StatusCode::kCorruption);
  EXPECT_EQ(a->Decode("a", value, now_ms_.load() + 10'000).status().code(), StatusCode::kNotFound);
  // An entry that would outlive any real one (its writer chose a far lapse time) is refused.
  const std::string forever = a->Encode("a", "10.0.0.1:7400", now_ms_.load() + 3 * 10'000);
  EXPECT_EQ(a->Decode("a", forever, now_ms_.load()).status().code(), StatusCode::kCorruption);
}

// A Redis that refuses writes (full, noeviction) still lets a node read
// the others; the failure is said.
TEST_F(MemberRegistryTest, ANodeThatCannotAnnounceStillReadsTheOthers) {
  auto a = Registry("a", "10.0.0.1:7400");
  auto b = Registry("b", "10.0.0.2:7400");
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->Refresh().ok());
  for (int port : cluster_->Masters()) {
    ASSERT_TRUE(cluster_->Cli(port, {"CONFIG", "SET", "maxmemory-policy", "noeviction"}).ok());
    ASSERT_TRUE(cluster_->Cli(port, {"CONFIG", "SET", "maxmemory", "1"}).ok());
  }
  auto members = b->Refresh();
  ASSERT_TRUE(members.ok()) << members.status().ToString();
  EXPECT_FALSE(members->announce_failure.ok());
  EXPECT_NE(members->announce_failure.message().find("OOM"), std::string::npos) << members->announce_failure.ToString();
  EXPECT_EQ(members->addresses, std::vector<std::string>{"10.0.0.1:7400"});
}

TEST_F(MemberRegistryTest, ANodeThatStopsAnnouncingDropsOutAndLongLapsedIsDeleted) {
  auto a = Registry("a", "10.0.0.1:7400");
  auto b = Registry("b", "10.0.0.2:7400");
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(b->Refresh().ok());
  EXPECT_EQ(Addresses(*a), std::vector<std::string>{"10.0.0.2:7400"});
  now_ms_ += 11'000;  // b's entry lapsed; a refreshes its own
  auto members = a->Refresh();
  ASSERT_TRUE(members.ok());
  EXPECT_TRUE(members->addresses.empty());
  EXPECT_EQ(members->lapsed, 1u);
  EXPECT_EQ(Fields(), 2u) << "lapsed, not yet long: kept";
  now_ms_ += 10'000;
  EXPECT_TRUE(Addresses(*a).empty());
  EXPECT_EQ(Fields(), 1u) << "lapsed longer than its lifetime: deleted";
  // b comes back.
  ASSERT_TRUE(b->Refresh().ok());
  EXPECT_EQ(Addresses(*a), std::vector<std::string>{"10.0.0.2:7400"});
}

}  // namespace
}  // namespace kvtier::testing

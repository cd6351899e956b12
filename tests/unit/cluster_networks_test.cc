// ClusterNetworks (tiers/remote/cluster_networks.h): which addresses a
// network list holds, IPv4 and IPv6, prefixes on and off byte boundaries,
// IPv4-mapped IPv6 addresses, the /24 and /64 around a seed, names left to
// the connect-time check.
#include "tiers/remote/cluster_networks.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kvtier {
namespace {

ClusterNetworks Networks(std::vector<std::string> texts) {
  auto parsed = ClusterNetworks::Parse(texts);
  EXPECT_TRUE(parsed.ok()) << parsed.status().ToString();
  return parsed.ok() ? *parsed : ClusterNetworks{};
}

bool Holds(const ClusterNetworks& n, const std::string& host) {
  std::optional<bool> inside = n.ContainsNumeric(host);
  EXPECT_TRUE(inside.has_value()) << host;
  return inside.value_or(false);
}

TEST(ClusterNetworks, PrefixesOnAndOffByteBoundaries) {
  const ClusterNetworks n = Networks({"10.1.0.0/16", "192.168.7.8/29", "fd00:1::/64", "2001:db8::5"});
  EXPECT_TRUE(Holds(n, "10.1.255.3"));
  EXPECT_FALSE(Holds(n, "10.2.0.1"));
  EXPECT_TRUE(Holds(n, "192.168.7.15"));
  EXPECT_FALSE(Holds(n, "192.168.7.16"));
  EXPECT_TRUE(Holds(n, "fd00:1::abcd:1"));
  EXPECT_FALSE(Holds(n, "fd00:2::1"));
  EXPECT_TRUE(Holds(n, "2001:db8::5"));
  EXPECT_FALSE(Holds(n, "2001:db8::6"));
  EXPECT_TRUE(Holds(n, "::ffff:10.1.2.3")) << "an IPv4-mapped address is its IPv4 address";
  EXPECT_FALSE(Holds(n, "127.0.0.1"));
  EXPECT_FALSE(n.ContainsNumeric("redis-0.example").has_value()) << "a name is checked where it resolves";
}

TEST(ClusterNetworks, EmptyHoldsNothingAndSlashZeroEverything) {
  EXPECT_FALSE(Holds(Networks({}), "10.0.0.1"));
  const ClusterNetworks all = Networks({"0.0.0.0/0", "::/0"});
  EXPECT_TRUE(Holds(all, "203.0.113.9"));
  EXPECT_TRUE(Holds(all, "2001:db8::1"));
}

TEST(ClusterNetworks, AroundASeedIsItsSlash24OrSlash64) {
  ClusterNetworks n;
  sockaddr_in v4{};
  v4.sin_family = AF_INET;
  ASSERT_EQ(::inet_pton(AF_INET, "10.0.5.7", &v4.sin_addr), 1);
  n.AddAround(reinterpret_cast<const sockaddr*>(&v4));
  sockaddr_in6 v6{};
  v6.sin6_family = AF_INET6;
  ASSERT_EQ(::inet_pton(AF_INET6, "fd00:0:0:7::9", &v6.sin6_addr), 1);
  n.AddAround(reinterpret_cast<const sockaddr*>(&v6));
  EXPECT_TRUE(Holds(n, "10.0.5.200"));
  EXPECT_FALSE(Holds(n, "10.0.6.1"));
  EXPECT_TRUE(Holds(n, "fd00:0:0:7:ffff::1"));
  EXPECT_FALSE(Holds(n, "fd00:0:0:8::1"));
  EXPECT_EQ(n.ToString(), "10.0.5.0/24, fd00:0:0:7::/64");
}

TEST(ClusterNetworks, TextThatIsNoNetworkIsRefusedQuoted) {
  for (const std::string bad :
       {"10.0.0.0/33", "::/129", "10.0.0.0/", "/8", "10.0.0/8", "host", "10.0.0.0/8 ", "10.0.0.0/+8", ""}) {
    auto parsed = ClusterNetworks::Parse(std::vector<std::string>{bad});
    ASSERT_FALSE(parsed.ok()) << "'" << bad << "'";
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find("'" + bad + "'"), std::string::npos) << parsed.status().ToString();
  }
}

}  // namespace
}  // namespace kvtier

// Tests of caller resolution (daemon/tenants/tenants.h): TenantTable::Resolve's
// order (uid, primary gid, the one tenant by supplementary groups,
// operators, strangers) and ReadPeerCredentials on a real socket pair.
#include "daemon/tenants/tenants.h"

#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace kvtier {
namespace {

constexpr uid_t kDaemonUid = 990;

TenantConfig Tenant(std::string name, std::vector<uint32_t> uids, std::vector<uint32_t> gids) {
  TenantConfig t;
  t.name = std::move(name);
  t.uids = std::move(uids);
  t.gids = std::move(gids);
  return t;
}

PeerCredentials Peer(uid_t uid, gid_t gid, std::vector<gid_t> groups = {}) {
  return PeerCredentials{4242, uid, gid, std::move(groups)};
}

// a: uid 1001, gid 3000; b: uid 1002, gids 4000 and 5000; c: gid 6000.
TenantTable Table() {
  return TenantTable({Tenant("a", {1001}, {3000}), Tenant("b", {1002}, {4000, 5000}), Tenant("c", {}, {6000})},
                     kDaemonUid);
}

void ExpectCaller(const Result<Caller>& caller, size_t tenant, bool is_operator) {
  ASSERT_TRUE(caller.ok()) << caller.status().ToString();
  EXPECT_EQ(caller->tenant, tenant);
  EXPECT_EQ(caller->operator_, is_operator);
}

TEST(TenantsTest, WithoutTenantsEveryoneIsTenantZero) {
  const TenantTable table({}, kDaemonUid);
  EXPECT_TRUE(table.empty());
  ExpectCaller(table.Resolve(Peer(1234, 1234)), 0, false);
  ExpectCaller(table.Resolve(Peer(0, 0)), 0, true);
  ExpectCaller(table.Resolve(Peer(kDaemonUid, 1)), 0, true);
}

TEST(TenantsTest, UidMatchWins) {
  const TenantTable table = Table();
  EXPECT_FALSE(table.empty());
  EXPECT_EQ(table.tenants().size(), 3u);
  ExpectCaller(table.Resolve(Peer(1001, 77)), 0, false);
  ExpectCaller(table.Resolve(Peer(1002, 77)), 1, false);
  // The uid outranks a primary gid and supplementary groups of other tenants.
  ExpectCaller(table.Resolve(Peer(1002, 3000, {6000})), 1, false);
}

TEST(TenantsTest, PrimaryGidBeforeSupplementaryGroups) {
  const TenantTable table = Table();
  ExpectCaller(table.Resolve(Peer(2000, 3000)), 0, false);
  ExpectCaller(table.Resolve(Peer(2000, 5000)), 1, false);
  ExpectCaller(table.Resolve(Peer(2000, 6000)), 2, false);
  // Primary gid of c, supplementary groups of a and b: the primary decides,
  // no ambiguity.
  ExpectCaller(table.Resolve(Peer(2000, 6000, {3000, 4000})), 2, false);
}

TEST(TenantsTest, OneTenantBySupplementaryGroups) {
  const TenantTable table = Table();
  ExpectCaller(table.Resolve(Peer(2000, 77, {10, 4000, 11})), 1, false);
  // Two groups of the same tenant are not ambiguous.
  ExpectCaller(table.Resolve(Peer(2000, 77, {4000, 5000})), 1, false);
  ExpectCaller(table.Resolve(Peer(2000, 77, {6000})), 2, false);
}

TEST(TenantsTest, SupplementaryGroupsOfTwoTenantsAreRefused) {
  const TenantTable table = Table();
  auto caller = table.Resolve(Peer(2000, 77, {3000, 6000}));
  ASSERT_FALSE(caller.ok());
  EXPECT_EQ(caller.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(caller.status().message().find("2000"), std::string::npos) << caller.status().message();
  EXPECT_NE(caller.status().message().find("(a, c)"), std::string::npos) << caller.status().message();
  // Even for an operator: the ambiguity is a configuration error to fix.
  EXPECT_EQ(table.Resolve(Peer(0, 77, {3000, 6000})).status().code(), StatusCode::kPermissionDenied);
}

TEST(TenantsTest, OperatorWithoutTenantRunsAdminOnly) {
  const TenantTable table = Table();
  ExpectCaller(table.Resolve(Peer(0, 0)), Caller::kNoTenant, true);
  ExpectCaller(table.Resolve(Peer(kDaemonUid, 991, {12})), Caller::kNoTenant, true);
}

TEST(TenantsTest, OperatorListedInATenantIsThatTenantAndOperator) {
  const TenantTable table({Tenant("ops", {0}, {}), Tenant("svc", {kDaemonUid}, {})}, kDaemonUid);
  ExpectCaller(table.Resolve(Peer(0, 0)), 0, true);
  ExpectCaller(table.Resolve(Peer(kDaemonUid, 0)), 1, true);
  const TenantTable by_group({Tenant("grp", {}, {3000})}, kDaemonUid);
  ExpectCaller(by_group.Resolve(Peer(0, 3000)), 0, true);
}

TEST(TenantsTest, StrangerIsRefusedByUidAndGid) {
  const TenantTable table = Table();
  auto caller = table.Resolve(Peer(31337, 31338, {1, 2, 3}));
  ASSERT_FALSE(caller.ok());
  EXPECT_EQ(caller.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(caller.status().message().find("uid 31337"), std::string::npos) << caller.status().message();
  EXPECT_NE(caller.status().message().find("31338"), std::string::npos) << caller.status().message();
}

TEST(TenantsTest, ReadPeerCredentialsOfASocketPair) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  auto peer = ReadPeerCredentials(fds[0]);
  auto other = ReadPeerCredentials(fds[1]);
  ::close(fds[0]);
  ::close(fds[1]);
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  EXPECT_EQ(peer->pid, ::getpid());
  EXPECT_EQ(peer->uid, ::geteuid());
  EXPECT_EQ(peer->gid, ::getegid());
  EXPECT_EQ(other->uid, ::geteuid());

  // Supplementary groups, where the kernel reports them, are this process's.
  std::vector<gid_t> mine(static_cast<size_t>(std::max(::getgroups(0, nullptr), 0)));
  if (!mine.empty()) mine.resize(static_cast<size_t>(::getgroups(static_cast<int>(mine.size()), mine.data())));
  if (!peer->groups.empty()) {
    std::vector<gid_t> got = peer->groups;
    std::sort(got.begin(), got.end());
    std::sort(mine.begin(), mine.end());
    EXPECT_EQ(got, mine);
  }

  // What the table makes of it: this process's uid as a tenant's.
  const TenantTable table({Tenant("me", {static_cast<uint32_t>(::geteuid())}, {})}, kDaemonUid);
  ExpectCaller(table.Resolve(*peer), 0, ::geteuid() == 0 || ::geteuid() == kDaemonUid);
}

TEST(TenantsTest, ReadPeerCredentialsOfANonSocketIsIoError) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  auto peer = ReadPeerCredentials(fds[0]);
  ::close(fds[0]);
  ::close(fds[1]);
  ASSERT_FALSE(peer.ok());
  EXPECT_EQ(peer.status().code(), StatusCode::kIoError);
  EXPECT_EQ(ReadPeerCredentials(-1).status().code(), StatusCode::kIoError);
}

}  // namespace
}  // namespace kvtier

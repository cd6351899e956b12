// Tenants in process: the daemon's own wiring (ParseConfig with [[tenant]]
// tables, OpenTierStack, DaemonEngines, Server with a TenantTable) behind a
// real socket. The test process's uid decides who it is, so each case
// builds the table around it: listed in a tenant, it is that tenant;
// listed nowhere, it is the operator (the daemon's own uid). Clients under
// other uids are in tests/python/test_tenants.py (setpriv).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <tuple>
#include <unistd.h>

#include "daemon/tenants/tenant_scope.h"
#include "proto/wire.h"
#include "tests/testing/raw_connection.h"
#include "tests/testing/tenant_stack.h"
#include "tests/testing/test_daemon.h"

namespace kvtier::testing {
namespace {

constexpr uint64_t kMiB = 1 << 20;
constexpr size_t kBlockBytes = 64 << 10;  // TestNamespace's whole block

// A kvtierd with tenants "alpha" (listing `alpha_uid`) and "beta"
// (`beta_uid`), an NVMe tier in a file, on a private socket, in `dir`
// (kept) or a fresh directory (removed).
class TenantDaemon {
 public:
  explicit TenantDaemon(uint32_t alpha_uid, const std::string& extra_alpha = "", const std::string& dir = "",
                        uint32_t beta_uid = 54321)
      : dir_(dir.empty() ? MakeTempDir() : dir),
        owns_dir_(dir.empty()),
        built_(dir_, "[[tenant]]\nname = \"alpha\"\nuids = [" + std::to_string(alpha_uid) +
                         "]\n"
                         "host_bytes = \"24MiB\"\n" +
                         extra_alpha + "[[tenant]]\nname = \"beta\"\nuids = [" + std::to_string(beta_uid) + "]\n") {
    EXPECT_TRUE(built_.opened().ok()) << built_.opened().ToString();
    if (!built_.opened().ok()) return;
    ServerOptions options{built_.config.socket_path, 2, 1u << 20, 5000, 0, {}};
    options.visit_shared_counters = [this](CounterVisitor& v) { built_.engines->VisitSharedCounters(v); };
    auto server =
        Server::Start(options, built_.engines->Served(built_.config), TenantTable(built_.config.tenants, ::geteuid()));
    EXPECT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(*server);
  }
  ~TenantDaemon() {
    server_.reset();  // before built_ closes the engines and tiers
    if (owns_dir_) RemoveTree(dir_);
  }

  Result<std::unique_ptr<Client>> Connect(std::vector<NamespaceDescriptor> namespaces) const {
    ClientOptions options;
    options.socket_path = built_.config.socket_path;
    options.namespaces = std::move(namespaces);
    options.reconnect = false;
    return Client::Connect(options);
  }
  const DaemonEngines& engines() const { return *built_.engines; }
  const std::string& socket_path() const { return built_.config.socket_path; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  bool owns_dir_;
  TenantStack built_;
  std::unique_ptr<Server> server_;
};

int64_t Counter(const std::vector<Counter>& counters, std::string_view name) {
  for (const auto& c : counters) {
    if (c.name == name) return c.value;
  }
  return -1;
}

TEST(Tenants, ATenantGetsItsOwnArenaAndScopedNamespaces) {
  TenantDaemon daemon(::geteuid());
  auto client = daemon.Connect({TestNamespace()});
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  EXPECT_EQ((*client)->arena().size(), 24 * kMiB) << "alpha's arena is its host_bytes, not the whole host tier";
  const NamespaceFingerprint plain = FingerprintNamespace(TestNamespace());
  const NamespaceFingerprint scoped = (*client)->namespaces().at(0);
  EXPECT_NE(scoped, plain);
  EXPECT_EQ(static_cast<uint32_t>(scoped.hi >> 32), TenantScope::TagOf("alpha"));
  EXPECT_EQ(scoped.lo, plain.lo);

  const auto keys = TestKeys(TestNamespace(), 4, 7);
  for (const auto& k : keys) ASSERT_TRUE((*client)->Put(0, k, Block(k, kBlockBytes, 3)).ok());
  std::vector<std::byte> out(kBlockBytes);
  for (const auto& k : keys) {
    auto got = (*client)->Get(0, k, out);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_TRUE(CheckBlockBytes(k, 3, out));
  }
  // The blocks are in alpha's engine; beta's holds nothing.
  const auto& tenants = daemon.engines().tenants();
  ASSERT_EQ(tenants.size(), 2u);
  EXPECT_EQ(tenants[0].config.name, "alpha");
  EXPECT_GT(tenants[0].host->used_bytes(), 0u);
  EXPECT_EQ(tenants[1].host->used_bytes(), 0u);
  EXPECT_NE(tenants[0].host->memfd(), tenants[1].host->memfd());
  // A ready estimate asks the caller's tenant's engine only.
  auto ready = (*client)->EstimateReady(0, keys);
  ASSERT_TRUE(ready.ok()) << ready.status().ToString();
  EXPECT_EQ(ready->tiers, std::vector<Tier>(keys.size(), Tier::kHost));
  auto in_beta = tenants[1].engine->EstimateReady(scoped, keys);
  ASSERT_TRUE(in_beta.ok());
  EXPECT_EQ(in_beta->prefix_blocks, 0u) << "beta's engine holds none of alpha's blocks";
}

TEST(Tenants, ATenantMayRegisterOnlyItsModels) {
  TenantDaemon daemon(::geteuid(), "models = [\"other/model\"]\n");
  auto refused = daemon.Connect({TestNamespace()});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kPermissionDenied) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("may not cache model"), std::string::npos);
  auto allowed = daemon.Connect({ModelNamespace("other/model", "r1")});
  EXPECT_TRUE(allowed.ok()) << allowed.status().ToString();
}

// `kvtier ls --blocks` on a tenant's connection: its own engine's blocks,
// named with its tenant and scoped namespace.
TEST(Tenants, ATenantListsItsOwnBlocks) {
  TenantDaemon daemon(::geteuid());
  auto client = daemon.Connect({TestNamespace()});
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  const auto keys = TestKeys(TestNamespace(), 5, 11);
  for (const auto& k : keys) ASSERT_TRUE((*client)->Put(0, k, Block(k, kBlockBytes, 3)).ok());
  auto listed = (*client)->ListBlocks(2);
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  ASSERT_EQ(listed->size(), keys.size());
  std::vector<BlockKey> got;
  for (const HeldBlockInfo& b : *listed) {
    EXPECT_EQ(b.tenant, "alpha");
    EXPECT_EQ(b.tier, Tier::kHost);
    EXPECT_EQ(b.ns, (*client)->namespaces().at(0)) << "the tenant's scoped fingerprint";
    got.push_back(b.key);
  }
  std::vector<BlockKey> want = keys;
  std::sort(want.begin(), want.end());
  EXPECT_EQ(got, want);
}

// The operator lists every tenant's blocks, alpha's then beta's, each
// named with its tenant; a page that fills inside one tenant's goes on
// there, and one that ends with it goes on with the next tenant's.
TEST(Tenants, TheOperatorListsEveryTenantsBlocksInPagesAcrossTenants) {
  TenantDaemon daemon(/*alpha_uid=*/54320);
  const auto& tenants = daemon.engines().tenants();
  ASSERT_EQ(tenants.size(), 2u);
  std::vector<std::tuple<std::string, NamespaceFingerprint, BlockKey>> put;
  for (uint64_t t = 0; t < 2; ++t) {
    const NamespaceFingerprint ns = tenants[t].scope->ScopeNamespace(FingerprintNamespace(TestNamespace()));
    for (uint64_t i = 0; i < 3; ++i) {
      ASSERT_TRUE(PutFilledBlock(*tenants[t].engine, *tenants[t].host, 900 + t, ns, BlockKey{t, i}, kBlockBytes).ok());
      put.emplace_back(tenants[t].config.name, ns, BlockKey{t, i});
    }
  }
  auto op = daemon.Connect({});
  ASSERT_TRUE(op.ok()) << op.status().ToString();
  for (uint32_t page : {0u, 1u, 2u, 3u, 4u}) {
    auto listed = (*op)->ListBlocks(page);
    ASSERT_TRUE(listed.ok()) << listed.status().ToString();
    std::vector<std::tuple<std::string, NamespaceFingerprint, BlockKey>> got;
    for (const HeldBlockInfo& b : *listed) {
      EXPECT_EQ(b.tier, Tier::kHost);
      got.emplace_back(b.tenant, b.ns, b.key);
    }
    EXPECT_EQ(got, put) << "pages of " << page;
  }
}

// Listed in no tenant, the test process (the daemon's own uid) is the
// operator: admin requests over every tenant, nothing else.
TEST(Tenants, TheOperatorRunsAdminRequestsOnly) {
  TenantDaemon daemon(/*alpha_uid=*/54320);
  auto with_namespace = daemon.Connect({TestNamespace()});
  ASSERT_FALSE(with_namespace.ok());
  EXPECT_EQ(with_namespace.status().code(), StatusCode::kPermissionDenied);

  auto client = daemon.Connect({});
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  EXPECT_EQ((*client)->arena().size(), 0u) << "an operator maps no tenant's arena";

  // Data requests on the wire, after a Hello with no namespace: refused
  // (no engine behind an operator's connection), and the daemon serves on.
  RawConnection raw;
  ASSERT_TRUE(raw.Connect(daemon.socket_path()).ok());
  v1::Request hello;
  hello.set_id(1);
  hello.mutable_hello()->set_protocol_version(wire::kProtocolVersion);
  ASSERT_TRUE(raw.SendFrame(hello).ok());
  auto hello_answer = raw.ReadResponse();
  ASSERT_TRUE(hello_answer.ok()) << hello_answer.status().ToString();
  EXPECT_EQ(hello_answer->status().code(), 0) << hello_answer->DebugString();
  EXPECT_EQ(raw.received_fd_count(), 0) << "no arena travels to an operator";
  for (int kind = 0; kind < 4; ++kind) {
    v1::Request request;
    request.set_id(2 + kind);
    if (kind == 0) request.mutable_pin()->add_keys(1), request.mutable_pin()->add_keys(2);
    if (kind == 1) request.mutable_lookup()->add_keys(1), request.mutable_lookup()->add_keys(2);
    if (kind == 2)
      request.mutable_reserve()->add_keys(1), request.mutable_reserve()->add_keys(2),
          request.mutable_reserve()->add_sizes(4096);
    if (kind == 3) request.mutable_ready_estimate()->add_keys(1), request.mutable_ready_estimate()->add_keys(2);
    ASSERT_TRUE(raw.SendFrame(request).ok());
    auto answer = raw.ReadResponse();
    ASSERT_TRUE(answer.ok()) << answer.status().ToString();
    EXPECT_EQ(answer->id(), request.id());
    EXPECT_EQ(wire::FromProto(answer->status()).code(), StatusCode::kPermissionDenied) << answer->DebugString();
  }

  auto stats = (*client)->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_GE(Counter(*stats, "tier.capacity_bytes{tier=\"host\",tenant=\"alpha\"}"), 0);
  EXPECT_EQ(Counter(*stats, "tier.capacity_bytes{tier=\"host\",tenant=\"beta\"}"), int64_t{40} << 20);
  EXPECT_EQ(Counter(*stats, "nvme.quota_bytes{tenant=\"beta\"}"), 0);
  EXPECT_GE(Counter(*stats, "nvme.unowned_evictions"), 0) << "the shared tier's own counters, once";
  EXPECT_GE(Counter(*stats, "server.connections_refused"), 0);

  auto health = (*client)->Health();
  ASSERT_TRUE(health.ok()) << health.status().ToString();
  EXPECT_TRUE(health->healthy);
  auto listed = (*client)->ListNamespaces();
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  EXPECT_TRUE(listed->empty());
}

// A tenant's blocks evicted to the shared NVMe tier come back to it
// byte-exact; after a restart on the same files (so the same tenant key)
// they are still its own, and another tenant asking the same keys there
// misses.
TEST(Tenants, SharedNvmeBlocksStayTheirTenantsAcrossARestart) {
  const std::string dir = MakeTempDir();
  const auto keys = TestKeys(TestNamespace(), 600, 11);  // 37.5 MiB through a 24 MiB arena
  const uint32_t me = ::geteuid();
  size_t on_nvme = 0;
  {
    TenantDaemon daemon(me, "", dir);
    auto client = daemon.Connect({TestNamespace()});
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    for (const auto& k : keys) ASSERT_TRUE((*client)->Put(0, k, Block(k, kBlockBytes, 5)).ok());
    for (int i = 0; i < 500 && on_nvme < 100; ++i) {
      auto found = (*client)->Lookup(0, keys);
      ASSERT_TRUE(found.ok());
      on_nvme = static_cast<size_t>(std::count(found->tiers.begin(), found->tiers.end(), Tier::kNvme));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_GE(on_nvme, 100u);
    // Alpha's view of the shared tier gives its own keys back.
    size_t listed = 0;
    daemon.engines().tenants()[0].below.at(0)->ForEachBlock([&](const BlockKey& key, const BlockTier::BlockInfo&) {
      listed += std::find(keys.begin(), keys.end(), key) != keys.end();
    });
    EXPECT_GE(listed, 100u);
    size_t beta_sees = 0;
    daemon.engines().tenants()[1].below.at(0)->ForEachBlock(
        [&](const BlockKey&, const BlockTier::BlockInfo&) { ++beta_sees; });
    EXPECT_EQ(beta_sees, 0u) << "beta's view of the shared tier holds nothing of alpha's";
  }
  {
    TenantDaemon daemon(/*alpha_uid=*/54320, "", dir, /*beta_uid=*/me);  // this process is beta now
    auto client = daemon.Connect({TestNamespace()});
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    auto found = (*client)->Lookup(0, keys);
    ASSERT_TRUE(found.ok());
    EXPECT_EQ(found->prefix_blocks, 0u) << "beta must not find alpha's blocks under the same keys";
  }
  {
    TenantDaemon daemon(me, "", dir);
    auto client = daemon.Connect({TestNamespace()});
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    auto found = (*client)->Lookup(0, keys);
    ASSERT_TRUE(found.ok());
    EXPECT_GE(static_cast<size_t>(std::count(found->tiers.begin(), found->tiers.end(), Tier::kNvme)), on_nvme / 2)
        << "alpha's NVMe blocks survive the restarts";
    std::vector<std::byte> out(kBlockBytes);
    size_t exact = 0;
    for (size_t i = 0; i < found->tiers.size(); ++i) {
      if (found->tiers[i] != Tier::kNvme) continue;
      auto got = (*client)->Get(0, keys[i], out);
      if (!got.ok()) continue;
      ASSERT_TRUE(CheckBlockBytes(keys[i], 5, out)) << "may miss, never wrong";
      ++exact;
    }
    EXPECT_GE(exact, on_nvme / 4);
  }
  RemoveTree(dir);
}

}  // namespace
}  // namespace kvtier::testing

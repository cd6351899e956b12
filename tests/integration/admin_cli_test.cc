// The operator's `kvtier` commands against a kvtierd process: stats as a
// table and JSON, ls, drop (by model revision and by fingerprint, the NVMe
// tier included), pin and unpin (by keys and by a token file's prefix
// chain), config get, health, and the exit codes scripts rely on
// (0 done, 1 refused or unhealthy, 2 bad usage, 3 unreachable).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "kvtier/client.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/test_daemon.h"

namespace kvtier::testing {
namespace {

class AdminCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    daemon_ = std::make_unique<DaemonProcess>(KVTIERD_PATH, "", SmallHostOverNvmeToml(dir_));
    ASSERT_TRUE(daemon_->running());
  }
  void TearDown() override {
    daemon_.reset();
    RemoveTree(dir_);
  }
  CommandResult Kvtier(std::vector<std::string> args) {
    std::vector<std::string> argv = {KVTIER_TOOL_PATH};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.push_back("--socket");
    argv.push_back(daemon_->socket_path());
    return RunCommand(argv);
  }
  std::unique_ptr<Client> Connect(const std::vector<NamespaceDescriptor>& namespaces) {
    ClientOptions options;
    options.socket_path = daemon_->socket_path();
    options.namespaces = namespaces;
    options.use_directory = false;
    auto client = Client::Connect(options);
    EXPECT_TRUE(client.ok()) << client.status().ToString();
    return client.ok() ? std::move(*client) : nullptr;
  }
  // `n` blocks of namespace `ns` of `client`, keys {tag, i}.
  void PutBlocks(Client& client, NamespaceId ns, uint64_t tag, int n) {
    std::vector<std::byte> bytes(64 << 10);
    for (int i = 0; i < n; ++i) {
      FillBlockBytes(BlockKey{tag, uint64_t(i)}, 0, bytes);
      ASSERT_TRUE(client.Put(ns, BlockKey{tag, uint64_t(i)}, bytes).ok());
    }
  }

  std::string dir_;
  std::unique_ptr<DaemonProcess> daemon_;
};

TEST_F(AdminCliTest, StatsPrintsATableOrOneJsonObject) {
  CommandResult table = Kvtier({"stats"});
  EXPECT_EQ(table.exit_code, 0) << table.output;
  EXPECT_NE(table.output.find("engine.lookups"), std::string::npos) << table.output;
  EXPECT_NE(table.output.find("tier.capacity_bytes{tier=\"nvme\"}"), std::string::npos) << table.output;
  CommandResult json = Kvtier({"stats", "--json"});
  EXPECT_EQ(json.exit_code, 0) << json.output;
  ASSERT_FALSE(json.output.empty());
  EXPECT_EQ(json.output.front(), '{') << json.output;
  EXPECT_EQ(json.output.substr(json.output.size() - 2), "}\n");
  EXPECT_NE(json.output.find("\"engine.lookups\":0"), std::string::npos) << json.output;
  EXPECT_NE(json.output.find("\"tier.capacity_bytes{tier=\\\"nvme\\\"}\":67108864"), std::string::npos)
      << "labels quoted inside the JSON name: " << json.output;
}

TEST_F(AdminCliTest, LsShowsEachNamespaceWithItsBlocksPerTier) {
  auto client = Connect({ModelNamespace("org/model", "rev-1"), ModelNamespace("org/model", "rev-1", "lora-x")});
  ASSERT_NE(client, nullptr);
  PutBlocks(*client, 0, 0xa, 3);
  PutBlocks(*client, 1, 0xb, 2);
  CommandResult ls = Kvtier({"ls"});
  EXPECT_EQ(ls.exit_code, 0) << ls.output;
  EXPECT_NE(ls.output.find("org/model"), std::string::npos) << ls.output;
  EXPECT_NE(ls.output.find("lora-x"), std::string::npos) << ls.output;
  EXPECT_NE(ls.output.find("3 / 192.0 KiB"), std::string::npos) << ls.output;
  EXPECT_NE(ls.output.find("2 / 128.0 KiB"), std::string::npos) << ls.output;
  EXPECT_NE(ls.output.find("host blocks/bytes"), std::string::npos) << ls.output;
  EXPECT_NE(ls.output.find("nvme blocks/bytes"), std::string::npos) << ls.output;
  CommandResult json = Kvtier({"ls", "--json"});
  EXPECT_EQ(json.exit_code, 0) << json.output;
  const std::string fp = FingerprintNamespace(ModelNamespace("org/model", "rev-1")).ToHex();
  EXPECT_NE(json.output.find("{\"fingerprint\":\"" + fp + "\",\"model_id\":\"org/model\",\"model_revision\":\"rev-1\""),
            std::string::npos)
      << json.output;
  EXPECT_NE(json.output.find("\"host\":{\"blocks\":3,\"bytes\":196608}"), std::string::npos) << json.output;
}

TEST_F(AdminCliTest, DropRemovesAModelRevisionFromEveryTierOrOneNamespaceByFingerprint) {
  const auto r1 = ModelNamespace("org/model", "rev-1"), r1_lora = ModelNamespace("org/model", "rev-1", "lora-x"),
             r2 = ModelNamespace("org/model", "rev-2");
  auto client = Connect({r1, r1_lora, r2});
  ASSERT_NE(client, nullptr);
  PutBlocks(*client, 0, 0xa, 60);  // 125 blocks through 64 host slots: rev-1's first go to NVMe
  PutBlocks(*client, 1, 0xb, 60);
  PutBlocks(*client, 2, 0xc, 5);
  // Wait for the demotions to land: every block of rev-1 in some tier.
  uint64_t r1_on_nvme = 0, r1_total = 0;
  for (int spin = 0; spin < 2000 && r1_total < 60; ++spin) {
    auto listed = client->ListNamespaces();
    ASSERT_TRUE(listed.ok());
    for (const auto& n : *listed) {
      if (n.fingerprint != FingerprintNamespace(r1)) continue;
      r1_on_nvme = n.tiers.back().blocks;
      r1_total = n.tiers.front().blocks + r1_on_nvme;
    }
    if (r1_total < 60) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(r1_total, 60u);
  EXPECT_GT(r1_on_nvme, 0u) << "part of rev-1 was demoted to NVMe";

  CommandResult drop = Kvtier({"drop", "--model", "org/model", "--revision", "rev-1"});
  EXPECT_EQ(drop.exit_code, 0) << drop.output;
  EXPECT_NE(drop.output.find("dropped " + FingerprintNamespace(r1).ToHex() + " (org/model rev-1):"), std::string::npos)
      << drop.output;
  EXPECT_NE(drop.output.find("dropped " + FingerprintNamespace(r1_lora).ToHex()), std::string::npos) << drop.output;
  EXPECT_EQ(drop.output.find(FingerprintNamespace(r2).ToHex()), std::string::npos) << "rev-2 stays";
  for (NamespaceId ns : {0u, 1u}) {
    const uint64_t tag = ns == 0 ? 0xa : 0xb;
    std::vector<BlockKey> keys;
    for (int i = 0; i < 60; ++i) keys.push_back(BlockKey{tag, uint64_t(i)});
    auto found = client->Lookup(ns, keys);
    ASSERT_TRUE(found.ok());
    EXPECT_EQ(found->prefix_blocks, 0u) << "namespace " << ns << " is gone from every tier";
    std::vector<std::byte> out(64 << 10);
    EXPECT_FALSE(client->Get(ns, keys.back(), out).ok());
  }
  // One namespace by a fingerprint prefix.
  const std::string r2_prefix = FingerprintNamespace(r2).ToHex().substr(0, 10);
  CommandResult by_fp = Kvtier({"drop", "--ns", r2_prefix});
  EXPECT_EQ(by_fp.exit_code, 0) << by_fp.output;
  EXPECT_NE(by_fp.output.find("host 5 blocks"), std::string::npos) << by_fp.output;
  BlockKey first{0xc, 0};
  auto gone = client->Lookup(2, {&first, 1});
  ASSERT_TRUE(gone.ok());
  EXPECT_EQ(gone->prefix_blocks, 0u);
  // Scripts' exit codes: nothing named, a bad fingerprint -> 2; a model
  // with no namespace -> 1.
  EXPECT_EQ(Kvtier({"drop"}).exit_code, 2);
  EXPECT_EQ(Kvtier({"drop", "--ns", "zz"}).exit_code, 2);
  EXPECT_EQ(Kvtier({"drop", "--ns", std::string(32, 'g')}).exit_code, 2);
  CommandResult none = Kvtier({"drop", "--model", "org/nothing"});
  EXPECT_EQ(none.exit_code, 1) << none.output;
  EXPECT_NE(none.output.find("kvtier drop: "), std::string::npos) << none.output;
}

TEST_F(AdminCliTest, PinHoldsAPrefixInTheHostTierUntilUnpin) {
  const auto r1 = ModelNamespace("org/model", "rev-1");
  const NamespaceFingerprint fp = FingerprintNamespace(r1);
  auto client = Connect({r1});
  ASSERT_NE(client, nullptr);
  // A prompt of three full blocks and a partial one, as a token file, and
  // its prefix chain put by the engine.
  std::vector<uint32_t> tokens;
  for (uint32_t t = 0; t < 3 * r1.block_tokens + 5; ++t) tokens.push_back(1000 + 7 * t);
  const std::string tokens_file = dir_ + "/prompt.tokens";
  {
    std::ofstream out(tokens_file);
    for (uint32_t t : tokens) out << t << (t % 5 == 0 ? "\n" : " ");
  }
  auto hasher = ChainHasher::Create(r1);
  ASSERT_TRUE(hasher.ok());
  const std::vector<BlockKey> chain = hasher->Keys(tokens);
  ASSERT_EQ(chain.size(), 3u);
  std::vector<std::byte> bytes(r1.BlockBytes());
  for (const BlockKey& key : chain) {
    FillBlockBytes(key, 0, bytes);
    ASSERT_TRUE(client->Put(0, key, bytes).ok());
  }
  PutBlocks(*client, 0, 0xa, 2);
  const BlockKey single{0xa, 0};

  const std::string prefix = fp.ToHex().substr(0, 12);
  CommandResult pin = Kvtier({"pin", "--ns", prefix, "--tokens", tokens_file, "--ttl", "10m"});
  EXPECT_EQ(pin.exit_code, 0) << pin.output;
  for (const BlockKey& key : chain) {
    EXPECT_NE(pin.output.find("held " + key.ToHex() + "\n"), std::string::npos) << pin.output;
  }
  EXPECT_NE(pin.output.find("pinned 3 of 3 blocks of " + fp.ToHex() + " for 10m\n"), std::string::npos) << pin.output;
  CommandResult by_key = Kvtier({"pin", "--ns", fp.ToHex(), "--key", single.ToHex(), "--ttl", "2h"});
  EXPECT_EQ(by_key.exit_code, 0) << by_key.output;
  EXPECT_EQ(StatsCounter(*client, "engine.holds"), 4);
  // Pinning again renews: still four holds, one pin each.
  EXPECT_EQ(Kvtier({"pin", "--ns", prefix, "--tokens", tokens_file, "--ttl", "1d"}).exit_code, 0);
  EXPECT_EQ(StatsCounter(*client, "engine.holds"), 4);
  EXPECT_EQ(StatsCounter(*client, "engine.pinned_blocks"), 4);

  // Twice the host tier's worth of other blocks: the held ones stay.
  PutBlocks(*client, 0, 0xb, 128);
  EXPECT_GT(StatsCounter(*client, "engine.evictions"), 0);
  auto found = client->Lookup(0, chain);
  ASSERT_TRUE(found.ok());
  ASSERT_EQ(found->prefix_blocks, 3u);
  for (Tier t : found->tiers) EXPECT_EQ(t, Tier::kHost);
  auto single_found = client->Lookup(0, {&single, 1});
  ASSERT_TRUE(single_found.ok());
  ASSERT_EQ(single_found->prefix_blocks, 1u);
  EXPECT_EQ(single_found->tiers[0], Tier::kHost);
  for (const BlockKey& key : chain) {
    std::vector<std::byte> got(bytes.size());
    ASSERT_TRUE(client->Get(0, key, got).ok());
    EXPECT_TRUE(CheckBlockBytes(key, 0, got));
  }

  CommandResult unpin = Kvtier({"unpin", "--ns", prefix, "--tokens", tokens_file});
  EXPECT_EQ(unpin.exit_code, 0) << unpin.output;
  EXPECT_NE(unpin.output.find("unpinned 3 of 3 blocks of " + fp.ToHex() + "\n"), std::string::npos) << unpin.output;
  EXPECT_EQ(StatsCounter(*client, "engine.holds"), 1);
  EXPECT_EQ(StatsCounter(*client, "engine.pinned_blocks"), 1) << "only the --key hold pins a block now";
  CommandResult again = Kvtier({"unpin", "--ns", prefix, "--key", chain[0].ToHex()});
  EXPECT_EQ(again.exit_code, 1) << again.output;
  EXPECT_NE(again.output.find("not held " + chain[0].ToHex()), std::string::npos) << again.output;
  EXPECT_EQ(Kvtier({"unpin", "--ns", prefix, "--key", single.ToHex()}).exit_code, 0);
  EXPECT_EQ(StatsCounter(*client, "engine.pinned_blocks"), 0);

  // Refused or failed: a key cached nowhere; a token file for a namespace
  // whose descriptor the daemon does not know.
  CommandResult missing = Kvtier({"pin", "--ns", prefix, "--key", BlockKey{0xdead, 1}.ToHex(), "--ttl", "90s"});
  EXPECT_EQ(missing.exit_code, 1) << missing.output;
  EXPECT_NE(missing.output.find("pinned 0 of 1 blocks"), std::string::npos) << missing.output;
  CommandResult unknown = Kvtier({"pin", "--ns", std::string(32, 'f'), "--tokens", tokens_file, "--ttl", "90s"});
  EXPECT_EQ(unknown.exit_code, 1) << unknown.output;
  EXPECT_NE(unknown.output.find("kvtier pin: namespace " + std::string(32, 'f') + " has no known descriptor"),
            std::string::npos)
      << unknown.output;
  // Bad usage exits 2.
  const std::string key = single.ToHex();
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"pin", "--key", key, "--ttl", "10m"},                  // no namespace
           {"pin", "--ns", prefix, "--ttl", "10m"},                // no blocks
           {"pin", "--ns", prefix, "--key", key},                  // no TTL
           {"pin", "--ns", prefix, "--key", key, "--ttl", "10x"},  // a bad TTL
           {"pin", "--ns", prefix, "--key", key, "--ttl", "0s"},
           {"pin", "--ns", prefix, "--key", key, "--ttl", "31d"},                           // over 30 days
           {"pin", "--ns", prefix, "--key", "zz", "--ttl", "10m"},                          // a bad key
           {"pin", "--ns", prefix, "--key", key, "--tokens", tokens_file, "--ttl", "10m"},  // both
           {"pin", "--ns", "abc", "--key", key, "--ttl", "10m"},                            // a short prefix
           {"pin", "--ns", prefix, "--tokens", dir_ + "/none", "--ttl", "10m"},             // no such file
           {"unpin", "--ns", prefix, "--key", key, "--ttl", "10m"},                         // unpin takes no TTL
           {"unpin", "--ns", prefix},
       }) {
    CommandResult r = Kvtier(args);
    EXPECT_EQ(r.exit_code, 2) << ::testing::PrintToString(args) << ": " << r.output;
  }
  CommandResult unreachable = RunCommand({KVTIER_TOOL_PATH, "pin", "--ns", prefix, "--key", key, "--ttl", "10m",
                                          "--socket", daemon_->socket_path() + ".none"});
  EXPECT_EQ(unreachable.exit_code, 3) << unreachable.output;
  EXPECT_EQ(unreachable.output.rfind("kvtier pin: ", 0), 0u) << unreachable.output;
}

TEST_F(AdminCliTest, ConfigGetPrintsTheRunningConfigurationOrOneOption) {
  CommandResult all = Kvtier({"config", "get"});
  EXPECT_EQ(all.exit_code, 0) << all.output;
  EXPECT_NE(all.output.find("[server]\nsocket_path = \"" + daemon_->socket_path() + "\""), std::string::npos)
      << all.output;
  CommandResult one = Kvtier({"config", "get", "host.capacity_bytes"});
  EXPECT_EQ(one.exit_code, 0) << one.output;
  EXPECT_EQ(one.output, "4194304\n");
  CommandResult admission = Kvtier({"config", "get", "nvme.admission"});
  EXPECT_EQ(admission.output, "\"all\"\n");
  EXPECT_EQ(Kvtier({"config", "get", "host.nope"}).exit_code, 2);
  EXPECT_EQ(Kvtier({"config", "get", "nodot"}).exit_code, 2);
}

TEST_F(AdminCliTest, HealthSaysHealthyWithItsWarningsAndUnreachableIsExitCode3) {
  CommandResult health = Kvtier({"health"});
  EXPECT_EQ(health.exit_code, 0) << health.output;
  EXPECT_EQ(health.output.rfind("healthy: kvtierd ", 0), 0u) << health.output;
  EXPECT_NE(health.output.find("tiers host nvme"), std::string::npos) << health.output;
  EXPECT_NE(health.output.find("warning: the host arena is not locked"), std::string::npos) << health.output;
  CommandResult json = Kvtier({"health", "--json"});
  EXPECT_EQ(json.exit_code, 0);
  EXPECT_EQ(json.output.rfind("{\"healthy\":true,\"problems\":[],\"warnings\":[", 0), 0u) << json.output;
  EXPECT_NE(json.output.find("\"tiers\":[\"host\",\"nvme\"]"), std::string::npos) << json.output;
  for (const char* command : {"stats", "ls", "health"}) {
    CommandResult r = RunCommand({KVTIER_TOOL_PATH, command, "--socket", daemon_->socket_path() + ".none"});
    EXPECT_EQ(r.exit_code, 3) << command << ": " << r.output;
    EXPECT_EQ(r.output.rfind(std::string("kvtier ") + command + ": ", 0), 0u) << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << "one line: " << r.output;
  }
}

}  // namespace
}  // namespace kvtier::testing

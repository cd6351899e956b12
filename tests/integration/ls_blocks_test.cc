// `kvtier ls --blocks` and Client::ListBlocks against a kvtierd process:
// blocks put through a small host tier (some demoted to NVMe) are listed
// block for block with their tier, namespace and key; a listing in small
// pages equals one in a single page; `ls --blocks` prints the same in text
// and JSON; a bad cursor or limit is refused and the daemon serves on.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "kvtier/client.h"
#include "proto/wire.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/raw_connection.h"
#include "tests/testing/test_daemon.h"

namespace kvtier::testing {
namespace {

using Listed = std::tuple<Tier, NamespaceFingerprint, BlockKey>;

std::vector<Listed> Flat(const std::vector<HeldBlockInfo>& blocks) {
  std::vector<Listed> out;
  for (const auto& b : blocks) {
    EXPECT_TRUE(b.tenant.empty());
    out.emplace_back(b.tier, b.ns, b.key);
  }
  return out;
}

class LsBlocksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    daemon_ = std::make_unique<DaemonProcess>(KVTIERD_PATH, "", SmallHostOverNvmeToml(dir_));
    ASSERT_TRUE(daemon_->running());
    ClientOptions options;
    options.socket_path = daemon_->socket_path();
    options.namespaces = {ModelNamespace("org/model", "rev-1"), ModelNamespace("org/other", "rev-1")};
    options.use_directory = false;
    auto client = Client::Connect(options);
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    client_ = std::move(*client);
  }
  void TearDown() override {
    client_.reset();
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
  // Puts `n` blocks of namespace `ns`, keys {tag, i}; remembers them.
  void PutBlocks(NamespaceId ns, uint64_t tag, int n) {
    std::vector<std::byte> bytes(64 << 10);
    for (int i = 0; i < n; ++i) {
      const BlockKey key{tag, uint64_t(i)};
      FillBlockBytes(key, 0, bytes);
      ASSERT_TRUE(client_->Put(ns, key, bytes).ok());
      put_.emplace(client_->namespaces().at(ns), key);
    }
  }
  // The listing once every block put is in some tier and two listings in
  // a row agree (the demotions have landed).
  std::vector<HeldBlockInfo> SettledListing() {
    std::vector<Listed> previous;
    for (int spin = 0; spin < 2000; ++spin) {
      auto listed = client_->ListBlocks();
      EXPECT_TRUE(listed.ok()) << listed.status().ToString();
      if (!listed.ok()) return {};
      std::set<std::pair<NamespaceFingerprint, BlockKey>> present;
      for (const auto& b : *listed) present.emplace(b.ns, b.key);
      const std::vector<Listed> flat = Flat(*listed);
      if (present == put_ && flat == previous) return *listed;
      previous = flat;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ADD_FAILURE() << "the listing never settled on the blocks put";
    return {};
  }

  std::string dir_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<Client> client_;
  std::set<std::pair<NamespaceFingerprint, BlockKey>> put_;
};

TEST_F(LsBlocksTest, ListsEveryBlockOfEveryTierInPagesOfAnySize) {
  PutBlocks(0, 0xa, 90);  // 100 blocks of 64 KiB through 64 host slots: some go to NVMe
  PutBlocks(1, 0xb, 10);
  const std::vector<HeldBlockInfo> listed = SettledListing();
  ASSERT_FALSE(listed.empty());
  const std::vector<Listed> flat = Flat(listed);
  EXPECT_TRUE(std::is_sorted(flat.begin(), flat.end())) << "(tier, namespace, key) order";
  EXPECT_EQ(std::adjacent_find(flat.begin(), flat.end()), flat.end()) << "no block twice";
  size_t host = 0, nvme = 0;
  for (const auto& [tier, ns, key] : flat) {
    EXPECT_TRUE(put_.count({ns, key})) << "only blocks put: " << key.ToHex();
    host += tier == Tier::kHost;
    nvme += tier == Tier::kNvme;
  }
  EXPECT_EQ(host + nvme, flat.size()) << "this daemon has host and NVMe tiers only";
  EXPECT_GT(nvme, 0u) << "blocks were demoted to NVMe";
  EXPECT_GT(host, 0u);
  EXPECT_LE(host, 64u);

  // Small pages: the same blocks in the same order, each page at most its
  // limit, every page but the last saying where to go on.
  auto paged = client_->ListBlocks(7);
  ASSERT_TRUE(paged.ok()) << paged.status().ToString();
  EXPECT_EQ(Flat(*paged), flat);
  auto one = client_->ListBlocks(1);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_EQ(Flat(*one), flat);
  auto first = client_->ListBlocksPage(std::nullopt, 7);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->blocks.size(), 7u);
  ASSERT_TRUE(first->next.has_value());
  EXPECT_EQ(first->next->key, first->blocks.back().key);
  auto whole = client_->ListBlocksPage(std::nullopt, 4096);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole->blocks.size(), flat.size());
  EXPECT_FALSE(whole->next.has_value()) << "all in one page: nothing more";

  // The command: a header and one line per block, or one JSON array.
  CommandResult text = Kvtier({"ls", "--blocks"});
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_EQ(static_cast<size_t>(std::count(text.output.begin(), text.output.end(), '\n')), flat.size() + 1);
  const auto& [tier0, ns0, key0] = flat.front();
  EXPECT_NE(text.output.find(std::string(TierName(tier0)) + "    " + ns0.ToHex() + "  " + key0.ToHex() + "\n"),
            std::string::npos)
      << text.output.substr(0, 400);
  CommandResult json = Kvtier({"ls", "--blocks", "--json"});
  ASSERT_EQ(json.exit_code, 0) << json.output;
  std::string expected = "[";
  for (size_t i = 0; i < flat.size(); ++i) {
    const auto& [tier, ns, key] = flat[i];
    expected += std::string(i == 0 ? "\n" : ",\n") + "{\"tier\":\"" + std::string(TierName(tier)) +
                "\",\"namespace\":\"" + ns.ToHex() + "\",\"key\":\"" + key.ToHex() + "\"}";
  }
  expected += "\n]\n";
  EXPECT_EQ(json.output, expected);
}

TEST_F(LsBlocksTest, AnEmptyDaemonListsNothing) {
  auto listed = client_->ListBlocks();
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  EXPECT_TRUE(listed->empty());
  CommandResult json = Kvtier({"ls", "--blocks", "--json"});
  EXPECT_EQ(json.exit_code, 0) << json.output;
  EXPECT_EQ(json.output, "[]\n");
}

TEST_F(LsBlocksTest, ABadCursorOrLimitIsRefusedAndTheDaemonServesOn) {
  PutBlocks(0, 0xa, 3);
  auto too_many = client_->ListBlocksPage(std::nullopt, 4097);
  ASSERT_FALSE(too_many.ok());
  EXPECT_EQ(too_many.status().code(), StatusCode::kInvalidArgument) << too_many.status().ToString();
  for (const BlockListCursor& bad : {BlockListCursor{0, Tier::kNone, {}, {}}, BlockListCursor{0, Tier(9), {}, {}},
                                     BlockListCursor{1, Tier::kHost, {}, {}}}) {
    auto refused = client_->ListBlocksPage(bad, 10);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument) << refused.status().ToString();
  }
  // A cursor with no key, on the wire.
  RawConnection raw;
  ASSERT_TRUE(raw.Connect(daemon_->socket_path()).ok());
  v1::Request hello;
  hello.set_id(1);
  hello.mutable_hello()->set_protocol_version(wire::kProtocolVersion);
  ASSERT_TRUE(raw.SendFrame(hello).ok());
  ASSERT_TRUE(raw.ReadResponse().ok());
  v1::Request request;
  request.set_id(2);
  request.mutable_list_blocks()->mutable_after()->set_tier(static_cast<uint32_t>(Tier::kHost));
  ASSERT_TRUE(raw.SendFrame(request).ok());
  auto answer = raw.ReadResponse();
  ASSERT_TRUE(answer.ok()) << answer.status().ToString();
  EXPECT_EQ(wire::FromProto(answer->status()).code(), StatusCode::kInvalidArgument) << answer->DebugString();

  auto listed = client_->ListBlocks();
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  EXPECT_EQ(listed->size(), 3u);
  // A cursor past the last block: an empty, final page.
  auto after_last =
      client_->ListBlocksPage(BlockListCursor{0, Tier::kRemote, BlockKey{~0ull, ~0ull}, BlockKey{~0ull, ~0ull}}, 10);
  ASSERT_TRUE(after_last.ok()) << after_last.status().ToString();
  EXPECT_TRUE(after_last->blocks.empty());
  EXPECT_FALSE(after_last->next.has_value());
}

}  // namespace
}  // namespace kvtier::testing

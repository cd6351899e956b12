// Client <-> daemon: the checksums of the put path (issue 12). The copying
// put computes each block's xxh3-64 while it copies and sends it with
// Commit; a Reservation may carry them too; the daemon records them, or
// with host.verify_commits checks them against the bytes.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/checksum.h"
#include "daemon/engine/engine.h"
#include "daemon/server/server.h"
#include "tests/testing/test_daemon.h"
#include "tiers/host/host_directory.h"
#include "tiers/host/host_tier.h"

namespace kvtier::testing {
namespace {

// The checksum a Pin of `key` hands out (0 and a test failure if the pin fails).
uint64_t PinnedChecksum(Client& client, const BlockKey& key) {
  auto views = client.Pin(0, {&key, 1});
  EXPECT_TRUE(views[0].ok()) << views[0].status().ToString();
  if (!views[0].ok()) return 0;
  const uint64_t checksum = views[0]->checksum();
  EXPECT_EQ(checksum, BlockChecksum(views[0]->data())) << "the view's bytes and checksum agree";
  EXPECT_TRUE(views[0]->Release().ok());
  return checksum;
}

// A kvtierd stack in this process whose engine verifies commits
// (host.verify_commits = true); TestDaemon runs the default (off).
class VerifyingDaemon {
 public:
  VerifyingDaemon() {
    dir_ = MakeTempDir();
    const uint64_t arena_bytes = 64ull << 20;
    host_ = OpenTestHostTier(arena_bytes, HostDirectory::DefaultSlots(arena_bytes));
    EngineOptions options{4, EvictionPolicyId::kLru};
    options.verify_commits = true;
    auto engine = Engine::Create(options, *host_, clock_);
    EXPECT_TRUE(engine.ok()) << engine.status().ToString();
    if (engine.ok()) engine_ = std::move(*engine);
    if (host_ == nullptr || engine_ == nullptr) return;
    auto server = Server::Start(ServerOptions{dir_ + "/kvtierd.sock"}, *engine_, *host_);
    EXPECT_TRUE(server.ok()) << server.status().ToString();
    if (server.ok()) server_ = std::move(*server);
  }
  ~VerifyingDaemon() {
    server_.reset();
    engine_.reset();
    host_.reset();
    RemoveTree(dir_);
  }
  std::unique_ptr<Client> Connect() {
    if (server_ == nullptr) return nullptr;
    ClientOptions options;
    options.socket_path = dir_ + "/kvtierd.sock";
    options.namespaces = {TestNamespace()};
    options.verify_checksums = true;
    auto client = Client::Connect(options);
    EXPECT_TRUE(client.ok()) << client.status().ToString();
    return client.ok() ? std::move(*client) : nullptr;
  }

 private:
  std::string dir_;
  SystemClock clock_;
  std::unique_ptr<HostTier> host_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Server> server_;
};

TEST(PutChecksum, PutAndPutBatchRecordTheChecksumOfTheBytes) {
  TestDaemon daemon;
  auto client = daemon.Connect();  // verify_checksums: every Get checks the recorded checksum
  ASSERT_NE(client, nullptr);
  // Below and above the streaming-copy threshold, odd sizes included.
  const std::vector<size_t> sizes = {1, 4096, 100003, (1u << 20) - 8, 1u << 20, (3u << 20) + 77};
  auto keys = TestKeys(TestNamespace(), 2 * sizes.size(), 11);
  std::vector<std::vector<std::byte>> blocks;
  for (size_t i = 0; i < keys.size(); ++i) blocks.push_back(Block(keys[i], sizes[i % sizes.size()]));
  for (size_t i = 0; i < sizes.size(); ++i) ASSERT_TRUE(client->Put(0, keys[i], blocks[i]).ok()) << i;
  std::vector<std::span<const std::byte>> rest;
  for (size_t i = sizes.size(); i < keys.size(); ++i) rest.emplace_back(blocks[i]);
  for (const Status& s : client->PutBatch(0, std::span(keys).subspan(sizes.size()), rest)) {
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    SCOPED_TRACE("block " + std::to_string(i));
    EXPECT_EQ(PinnedChecksum(*client, keys[i]), BlockChecksum(blocks[i]));
    std::vector<std::byte> dst(blocks[i].size());
    auto got = client->Get(0, keys[i], dst);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_TRUE(CheckBlockBytes(keys[i], 0, dst));
  }
  EXPECT_EQ(StatsCounter(*client, "engine.commit_checksums_sent"), int64_t(keys.size()))
      << "every copying put sends its checksum";
}

TEST(PutChecksum, ReservationChecksumsAreRecordedAsSent) {
  TestDaemon daemon;
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  auto keys = TestKeys(TestNamespace(), 2, 12);
  const std::vector<uint64_t> sizes = {5000, 70000};
  auto reservation = client->Reserve(0, keys, sizes);
  ASSERT_TRUE(reservation.ok()) << reservation.status().ToString();
  for (auto& b : reservation->blocks()) {
    ASSERT_TRUE(b.status.ok());
    FillBlockBytes(b.key, 0, b.data);
    b.checksum = BlockChecksum(b.data);
  }
  // The second one is wrong: with verify_commits off (the default) the
  // daemon keeps what it was sent (a client that does not verify sees it),
  // and a reader that verifies sees a corrupt block: its pin and get are
  // Corruption, and it reports the block, which then misses.
  const uint64_t wrong = *reservation->blocks()[1].checksum ^ 1;
  reservation->blocks()[1].checksum = wrong;
  for (const Status& s : reservation->Commit()) ASSERT_TRUE(s.ok()) << s.ToString();
  ClientOptions plain_options = daemon.Options();
  plain_options.verify_checksums = false;
  auto plain = Client::Connect(plain_options);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  auto views = (*plain)->Pin(0, keys);
  ASSERT_TRUE(views[0].ok() && views[1].ok());
  EXPECT_EQ(views[0]->checksum(), BlockChecksum(views[0]->data()));
  EXPECT_EQ(views[1]->checksum(), wrong);
  views.clear();
  auto checked = client->Pin(0, keys);
  EXPECT_TRUE(checked[0].ok());
  EXPECT_EQ(checked[1].status().code(), StatusCode::kCorruption);
  checked.clear();
  ASSERT_TRUE(client->Stats().ok());  // a round trip after the report
  std::vector<std::byte> dst(70000);
  EXPECT_EQ(client->Get(0, keys[1], dst).status().code(), StatusCode::kNotFound) << "reported by the pin";
  EXPECT_TRUE(client->Get(0, keys[0], dst).ok());
}

TEST(PutChecksum, ReservationWithSomeChecksumsMissingIsHashedByTheDaemon) {
  TestDaemon daemon;
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  auto keys = TestKeys(TestNamespace(), 2, 13);
  const std::vector<uint64_t> sizes = {8192, 8192};
  auto reservation = client->Reserve(0, keys, sizes);
  ASSERT_TRUE(reservation.ok());
  for (auto& b : reservation->blocks()) FillBlockBytes(b.key, 0, b.data);
  reservation->blocks()[0].checksum = 12345;  // wrong, but not sent: block 1 has none
  for (const Status& s : reservation->Commit()) ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(PinnedChecksum(*client, keys[0]), BlockChecksum(Block(keys[0], 8192)));
  EXPECT_EQ(PinnedChecksum(*client, keys[1]), BlockChecksum(Block(keys[1], 8192)));
  EXPECT_EQ(StatsCounter(*client, "engine.commit_checksums_sent"), 0) << "none was sent";
}

TEST(PutChecksum, VerifyingDaemonRefusesAWrongChecksumAndDropsTheReservation) {
  VerifyingDaemon daemon;
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  auto keys = TestKeys(TestNamespace(), 2, 14);
  const std::vector<uint64_t> sizes = {65536, 65536};
  auto reservation = client->Reserve(0, keys, sizes);
  ASSERT_TRUE(reservation.ok());
  for (auto& b : reservation->blocks()) {
    FillBlockBytes(b.key, 0, b.data);
    b.checksum = BlockChecksum(b.data);
  }
  *reservation->blocks()[0].checksum += 1;
  auto statuses = reservation->Commit();
  ASSERT_EQ(statuses.size(), 2u);
  EXPECT_EQ(statuses[0].code(), StatusCode::kCorruption) << statuses[0].ToString();
  EXPECT_TRUE(statuses[1].ok()) << statuses[1].ToString();
  auto hit = client->Lookup(0, keys);
  ASSERT_TRUE(hit.ok());
  EXPECT_EQ(hit->prefix_blocks, 0u) << "the refused block is not visible";
  auto second = client->Lookup(0, std::span(keys).subspan(1));
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->prefix_blocks, 1u);
  // The reservation is gone: the key can be put again, and the copying put
  // (whose checksum is right) passes verification.
  auto block = Block(keys[0], 65536);
  ASSERT_TRUE(client->Put(0, keys[0], block).ok());
  EXPECT_EQ(PinnedChecksum(*client, keys[0]), BlockChecksum(block));
}

TEST(PutChecksum, VerifyingDaemonAcceptsCopyingPuts) {
  VerifyingDaemon daemon;
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  auto keys = TestKeys(TestNamespace(), 3, 15);
  std::vector<std::vector<std::byte>> blocks = {Block(keys[0], 3u << 20), Block(keys[1], 777),
                                                Block(keys[2], 1u << 20)};
  std::vector<std::span<const std::byte>> data(blocks.begin(), blocks.end());
  for (const Status& s : client->PutBatch(0, keys, data)) EXPECT_TRUE(s.ok()) << s.ToString();
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(PinnedChecksum(*client, keys[i]), BlockChecksum(blocks[i]));
}

}  // namespace
}  // namespace kvtier::testing

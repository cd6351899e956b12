// Client <-> daemon: checksum verification on every read path
// (ClientOptions::verify_checksums). A committed block whose bytes change in
// the arena afterwards -- written here through another client's pinned
// view, as a hostile or buggy process sharing the arena could -- is
// Corruption for a verifying copying Get (directory and socket paths), a
// verifying Pin (BlockView), a verifying layer read (whole range and a part
// holding the changed layer) and a verifying layer-wise load, which never
// hand out the bytes; the block is reported and, by the time the read
// returns, later reads miss (kvtierd answers the report once it has checked
// the block itself and dropped it). A report of an intact block, or of a
// block of another namespace, drops nothing. Layers
// that did not change verify alone when the block has per-layer checksums
// (its writer verifies, so its put sent them; or the NVMe tier's, for
// promoted blocks and layer reads); a block without them is checked whole.
// A client that does not verify reads the bytes as they are (documented).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "common/checksum.h"
#include "proto/wire.h"
#include "tests/testing/protocol_checks.h"
#include "tests/testing/raw_connection.h"
#include "tests/testing/test_daemon.h"

namespace kvtier::testing {
namespace {

constexpr uint32_t kLayers = 4;         // TestNamespace
constexpr uint64_t kBlock = 64 * 1024;  // its whole block
constexpr uint64_t kLayerBytes = kBlock / kLayers;

std::unique_ptr<Client> ConnectWith(const TestDaemon& daemon, bool verify, bool directory) {
  ClientOptions options = daemon.Options();
  options.verify_checksums = verify;
  options.use_directory = directory;
  auto client = Client::Connect(options);
  EXPECT_TRUE(client.ok()) << client.status().ToString();
  return client.ok() ? std::move(*client) : nullptr;
}

// Flips one byte of committed block `key` at `offset`, through a pin of the
// non-verifying `hostile` client (the arena mapping is writable by every
// client).
void Corrupt(Client& hostile, const BlockKey& key, uint64_t offset) {
  auto views = hostile.Pin(0, {&key, 1});
  ASSERT_TRUE(views[0].ok()) << views[0].status().ToString();
  auto* byte = const_cast<std::byte*>(views[0]->data().data() + offset);
  *byte ^= std::byte{0xff};
  ASSERT_TRUE(views[0]->Release().ok());
}

bool Cached(Client& client, const BlockKey& key) {
  auto found = client.Lookup(0, {&key, 1});
  return found.ok() && found->prefix_blocks == 1;
}

class ReadChecksumTest : public ::testing::Test {
 protected:
  void SetUp() override {
    plain_ = ConnectWith(daemon_, /*verify=*/false, /*directory=*/true);
    checked_ = ConnectWith(daemon_, /*verify=*/true, /*directory=*/true);
    socket_only_ = ConnectWith(daemon_, /*verify=*/true, /*directory=*/false);
    ASSERT_TRUE(plain_ && checked_ && socket_only_);
    // Written by a client that verifies: with per-layer checksums.
    keys_ = TestKeys(TestNamespace(), 10, 41);
    for (const auto& k : keys_) ASSERT_TRUE(checked_->Put(0, k, Block(k, kBlock)).ok());
  }
  // Layer 2 of keys_[i] changes (one byte) after its commit.
  void CorruptLayer2(size_t i) { Corrupt(*plain_, keys_[i], 2 * kLayerBytes + 17); }
  // The client's deferred releases have reached the daemon: they ride in
  // front of its next request (a Stats here).
  void FlushReleases(Client& client) { ASSERT_TRUE(client.Stats().ok()); }

  TestDaemon daemon_;
  std::unique_ptr<Client> plain_, checked_, socket_only_;
  std::vector<BlockKey> keys_;
};

TEST_F(ReadChecksumTest, IntactBlocksVerifyOnEveryPath) {
  std::vector<std::byte> dst(kBlock);
  ASSERT_TRUE(checked_->Get(0, keys_[0], dst).ok());
  EXPECT_TRUE(CheckBlockBytes(keys_[0], 0, dst));
  ASSERT_TRUE(socket_only_->Get(0, keys_[0], dst).ok());
  EXPECT_TRUE(CheckBlockBytes(keys_[0], 0, dst));
  auto views = checked_->Pin(0, {&keys_[1], 1});
  ASSERT_TRUE(views[0].ok()) << views[0].status().ToString();
  EXPECT_TRUE(CheckBlockBytes(keys_[1], 0, views[0]->data()));
  views.clear();
  std::vector<std::byte> part(2 * kLayerBytes);
  std::span<std::byte> one[] = {part};
  auto got = checked_->GetLayers(0, {&keys_[2], 1}, 1, 3, one);
  ASSERT_TRUE(got[0].ok()) << got[0].status().ToString();
  const auto whole = Block(keys_[2], kBlock);
  EXPECT_EQ(std::memcmp(part.data(), whole.data() + kLayerBytes, part.size()), 0);
  auto load = checked_->BeginLoad(0, std::span(keys_).first(3));
  ASSERT_TRUE(load.ok()) << load.status().ToString();
  ASSERT_TRUE(load->WaitAll().ok());
  EXPECT_EQ(load->usable_prefix(), 3u);
  EXPECT_FALSE(load->LayerSpan(2, 3).empty());
}

TEST_F(ReadChecksumTest, NonVerifyingReadsHandOutTheChangedBytes) {
  CorruptLayer2(0);
  std::vector<std::byte> dst(kBlock);
  auto got = plain_->Get(0, keys_[0], dst);
  ASSERT_TRUE(got.ok()) << "verify_checksums off: no check, as documented";
  EXPECT_FALSE(CheckBlockBytes(keys_[0], 0, dst));
  auto views = plain_->Pin(0, {&keys_[0], 1});
  ASSERT_TRUE(views[0].ok());
  EXPECT_NE(BlockChecksum(views[0]->data()), views[0]->checksum()) << "the view shows the changed bytes";
  views.clear();
  EXPECT_TRUE(Cached(*plain_, keys_[0])) << "nobody reported it";
}

TEST_F(ReadChecksumTest, VerifyingGetFromTheDirectoryIsCorruptionAndLaterReadsMiss) {
  CorruptLayer2(0);
  std::vector<std::byte> dst(kBlock);
  EXPECT_EQ(checked_->Get(0, keys_[0], dst).status().code(), StatusCode::kCorruption);
  EXPECT_FALSE(Cached(*plain_, keys_[0]));
  EXPECT_EQ(plain_->Get(0, keys_[0], dst).status().code(), StatusCode::kNotFound);
}

TEST_F(ReadChecksumTest, VerifyingGetThroughTheSocketIsCorruptionAndLaterReadsMiss) {
  CorruptLayer2(1);
  std::vector<std::byte> dst(kBlock);
  EXPECT_EQ(socket_only_->Get(0, keys_[1], dst).status().code(), StatusCode::kCorruption);
  EXPECT_FALSE(Cached(*plain_, keys_[1]));
  FlushReleases(*socket_only_);
  EXPECT_EQ(EngineCounter(daemon_, "engine.leases"), 0) << "the Get's pin was released";
}

TEST_F(ReadChecksumTest, VerifyingPinIsCorruptionReleasesItsLeaseAndLaterReadsMiss) {
  CorruptLayer2(2);
  auto views = checked_->Pin(0, std::span(keys_).first(4));
  ASSERT_EQ(views.size(), 4u);
  EXPECT_TRUE(views[0].ok() && views[1].ok() && views[3].ok());
  ASSERT_FALSE(views[2].ok());
  EXPECT_EQ(views[2].status().code(), StatusCode::kCorruption) << views[2].status().ToString();
  EXPECT_FALSE(Cached(*plain_, keys_[2]));
  views.clear();
  FlushReleases(*checked_);
  EXPECT_EQ(EngineCounter(daemon_, "engine.leases"), 0) << "the bad block's lease went too";
  EXPECT_TRUE(Cached(*plain_, keys_[3]));
}

TEST_F(ReadChecksumTest, VerifyingLayerReadsOfTheChangedLayerAreCorruption) {
  for (size_t i : {3, 4, 5}) CorruptLayer2(i);
  std::vector<std::byte> whole(kBlock), part(kLayerBytes), clean(2 * kLayerBytes);
  // The whole range (from the directory: the block's checksum).
  std::span<std::byte> a[] = {whole};
  EXPECT_EQ(checked_->GetLayers(0, {&keys_[3], 1}, 0, kLayers, a)[0].status().code(), StatusCode::kCorruption);
  // A part holding layer 2 (through the daemon: per-layer checksums).
  std::span<std::byte> b[] = {part};
  EXPECT_EQ(checked_->GetLayers(0, {&keys_[4], 1}, 2, 3, b)[0].status().code(), StatusCode::kCorruption);
  // The socket path's whole range (the grant's layer checksums).
  EXPECT_EQ(socket_only_->GetLayers(0, {&keys_[5], 1}, 0, kLayers, a)[0].status().code(), StatusCode::kCorruption);
  for (size_t i : {3, 4, 5}) EXPECT_FALSE(Cached(*plain_, keys_[i])) << i;
  FlushReleases(*checked_);
  FlushReleases(*socket_only_);
  EXPECT_EQ(EngineCounter(daemon_, "engine.leases"), 0);
}

TEST_F(ReadChecksumTest, LayersThatDidNotChangeStillVerifyAlone) {
  CorruptLayer2(6);
  std::vector<std::byte> part(2 * kLayerBytes);
  std::span<std::byte> one[] = {part};
  auto got = checked_->GetLayers(0, {&keys_[6], 1}, 0, 2, one);
  ASSERT_TRUE(got[0].ok()) << got[0].status().ToString();
  EXPECT_EQ(std::memcmp(part.data(), Block(keys_[6], kBlock).data(), part.size()), 0);
  EXPECT_TRUE(Cached(*plain_, keys_[6]));
}

TEST_F(ReadChecksumTest, ABlockWithoutLayerChecksumsIsCheckedWhole) {
  // Written by a client that does not verify: no layer checksums (its put
  // cost nothing more); a verified layer read checks the range within the
  // whole block, so a change anywhere in it fails the read.
  const auto keys = TestKeys(TestNamespace(), 3, 42);
  for (const auto& k : keys) ASSERT_TRUE(plain_->Put(0, k, Block(k, kBlock)).ok());
  std::vector<std::byte> part(2 * kLayerBytes);
  std::span<std::byte> one[] = {part};
  auto got = checked_->GetLayers(0, {&keys[0], 1}, 1, 3, one);
  ASSERT_TRUE(got[0].ok()) << got[0].status().ToString();
  EXPECT_EQ(std::memcmp(part.data(), Block(keys[0], kBlock).data() + kLayerBytes, part.size()), 0);
  for (const auto& k : keys) Corrupt(*plain_, k, 3 * kLayerBytes + 1);  // layer 3
  got = checked_->GetLayers(0, {&keys[0], 1}, 0, 2, one);
  EXPECT_EQ(got[0].status().code(), StatusCode::kCorruption) << "layers 0-1 are intact, the block is not";
  auto load = checked_->BeginLoad(0, std::span(keys).subspan(1, 2));
  ASSERT_TRUE(load.ok()) << load.status().ToString();
  ASSERT_TRUE(load->WaitLayer(0).ok());
  EXPECT_EQ(load->status(0).code(), StatusCode::kCorruption) << "checked whole at the first wait";
  EXPECT_TRUE(load->LayerSpan(0, 0).empty());
  ASSERT_TRUE(load->End().ok());
  for (const auto& k : keys) EXPECT_FALSE(Cached(*plain_, k));
}

TEST_F(ReadChecksumTest, VerifyingLayerLoadFailsTheChangedBlockAlone) {
  CorruptLayer2(8);
  const auto prefix = std::span(keys_).subspan(7, 3);  // 7, 8 (changed), 9
  for (bool copy : {false, true}) {
    SCOPED_TRACE(copy ? "copy" : "zero-copy");
    std::vector<std::vector<std::byte>> buffers(prefix.size(), std::vector<std::byte>(kBlock));
    LoadOptions options;
    if (copy) {
      for (auto& b : buffers) options.dst.emplace_back(b);
    }
    auto load = (copy ? socket_only_ : checked_)->BeginLoad(0, prefix, std::move(options));
    if (copy) {
      // The first load reported the block: it is gone now.
      ASSERT_TRUE(load.ok()) << load.status().ToString();
      ASSERT_TRUE(load->WaitAll().ok());
      EXPECT_EQ(load->status(1).code(), StatusCode::kNotFound);
      EXPECT_EQ(load->usable_prefix(), 1u);
      EXPECT_TRUE(CheckBlockBytes(keys_[7], 0, buffers[0]));
      EXPECT_TRUE(CheckBlockBytes(keys_[9], 0, buffers[2]));
      continue;
    }
    ASSERT_TRUE(load.ok()) << load.status().ToString();
    ASSERT_TRUE(load->WaitLayer(1).ok());
    EXPECT_TRUE(load->status(1).ok()) << "layers 0 and 1 of the block are intact";
    EXPECT_FALSE(load->LayerSpan(1, 1).empty());
    EXPECT_TRUE(load->LayerSpan(1, 2).empty()) << "layer 2 is not verified yet";
    ASSERT_TRUE(load->WaitAll().ok());
    EXPECT_EQ(load->status(1).code(), StatusCode::kCorruption) << load->status(1).ToString();
    EXPECT_TRUE(load->LayerSpan(1, 2).empty());
    EXPECT_TRUE(load->LayerSpan(1, 0).empty()) << "no layer of a failed block is handed out";
    EXPECT_EQ(load->usable_prefix(), 1u);
    EXPECT_TRUE(load->status(2).ok());
    EXPECT_FALSE(load->LayerSpan(2, 3).empty());
    ASSERT_TRUE(load->End().ok());
    EXPECT_FALSE(Cached(*plain_, keys_[8]));
  }
}

// A report is checked, not trusted: kvtierd hashes the block again and an
// intact one stays (a client cannot evict sound blocks by calling them
// corrupt); a key of another namespace is not the block reported.
TEST_F(ReadChecksumTest, AReportOfAnIntactBlockIsRefutedAndTheBlockStays) {
  RawConnection raw = HelloRaw(daemon_);
  auto answer = RoundTrip(raw, WithId(2, wire::MakeCorruptReport(0, {&keys_[0], 1})));
  ASSERT_TRUE(answer.ok()) << answer.status().ToString();
  EXPECT_TRUE(HasCode(answer->status(), StatusCode::kOk));
  EXPECT_EQ(answer->erase().erased(), 0u);
  EXPECT_EQ(EngineCounter(daemon_, "engine.corrupt_reports"), 1);
  EXPECT_EQ(EngineCounter(daemon_, "engine.corrupt_reports_refuted"), 1);
  EXPECT_EQ(EngineCounter(daemon_, "engine.corrupt_drops"), 0);
  std::vector<std::byte> dst(kBlock);
  ASSERT_TRUE(plain_->Get(0, keys_[0], dst).ok());
  EXPECT_TRUE(CheckBlockBytes(keys_[0], 0, dst));

  // A tampered block reported under another namespace of the same client
  // is not touched; reported under its own, it is dropped.
  CorruptLayer2(1);
  RawConnection both;
  ASSERT_TRUE(both.Connect(daemon_.socket_path()).ok());
  ASSERT_TRUE(both.Hello({TestNamespace(), TestNamespace("rev-2")}).ok());
  auto elsewhere = RoundTrip(both, WithId(2, wire::MakeCorruptReport(1, {&keys_[1], 1})));
  ASSERT_TRUE(elsewhere.ok());
  EXPECT_EQ(elsewhere->erase().erased(), 0u);
  EXPECT_TRUE(Cached(*plain_, keys_[1])) << "not the block of namespace rev-2 under that key";
  auto unregistered = RoundTrip(both, WithId(3, wire::MakeCorruptReport(2, {&keys_[1], 1})));
  ASSERT_TRUE(unregistered.ok());
  EXPECT_TRUE(HasCode(unregistered->status(), StatusCode::kInvalidArgument));
  EXPECT_TRUE(Cached(*plain_, keys_[1]));
  auto dropped = RoundTrip(both, WithId(4, wire::MakeCorruptReport(0, {&keys_[1], 1})));
  ASSERT_TRUE(dropped.ok());
  EXPECT_EQ(dropped->erase().erased(), 1u);
  EXPECT_FALSE(Cached(*plain_, keys_[1]));
  EXPECT_EQ(EngineCounter(daemon_, "engine.corrupt_drops"), 1);
}

// With an NVMe tier: a promoted block keeps the per-layer checksums the
// NVMe record verified, and a layer read of a block only on NVMe carries
// the record's own.
TEST(ReadChecksumNvmeTest, PromotedBlocksAndLayerReadsFromNvmeVerify) {
  TestDaemonOptions options;
  options.arena_bytes = 4 << 20;  // 64 blocks
  options.nvme_in_memory = true;
  options.nvme_bytes = 16 << 20;
  options.nvme_region_bytes = 1 << 20;
  TestDaemon daemon(options);
  auto client = ConnectWith(daemon, /*verify=*/true, /*directory=*/true);
  auto plain = ConnectWith(daemon, /*verify=*/false, /*directory=*/true);
  ASSERT_TRUE(client && plain);
  const auto keys = TestKeys(TestNamespace(), 150, 43);
  for (const auto& k : keys) ASSERT_TRUE(client->Put(0, k, Block(k, kBlock)).ok());
  daemon.engine().WaitForIdle();
  ASSERT_EQ(LookupTier(daemon.engine(), FingerprintNamespace(TestNamespace()), keys[0]), Tier::kNvme);
  ASSERT_EQ(LookupTier(daemon.engine(), FingerprintNamespace(TestNamespace()), keys[1]), Tier::kNvme);

  // A layer read of an NVMe-only block: transient, with the record's sums.
  std::vector<std::byte> part(kLayerBytes);
  std::span<std::byte> one[] = {part};
  auto got = client->GetLayers(0, {&keys[0], 1}, 3, 4, one);
  ASSERT_TRUE(got[0].ok()) << got[0].status().ToString();
  EXPECT_EQ(std::memcmp(part.data(), Block(keys[0], kBlock).data() + 3 * kLayerBytes, kLayerBytes), 0);

  // A whole Get promotes keys[1]; its host entry has the layer checksums.
  std::vector<std::byte> dst(kBlock);
  ASSERT_TRUE(client->Get(0, keys[1], dst).ok());
  ASSERT_EQ(LookupTier(daemon.engine(), FingerprintNamespace(TestNamespace()), keys[1]), Tier::kHost);
  got = client->GetLayers(0, {&keys[1], 1}, 1, 2, one);
  ASSERT_TRUE(got[0].ok()) << got[0].status().ToString();
  EXPECT_EQ(std::memcmp(part.data(), Block(keys[1], kBlock).data() + kLayerBytes, kLayerBytes), 0);
  // ... which catch a change of that layer after the promotion.
  Corrupt(*plain, keys[1], kLayerBytes + 3);
  got = client->GetLayers(0, {&keys[1], 1}, 1, 2, one);
  EXPECT_EQ(got[0].status().code(), StatusCode::kCorruption);

  // A verifying load streamed from NVMe (the board's checksum table).
  auto load = client->BeginLoad(0, std::span(keys).subspan(2, 4));
  ASSERT_TRUE(load.ok()) << load.status().ToString();
  ASSERT_TRUE(load->WaitAll().ok());
  EXPECT_EQ(load->usable_prefix(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    for (uint32_t l = 0; l < kLayers; ++l) {
      auto span = load->LayerSpan(i, l);
      ASSERT_EQ(span.size(), kLayerBytes) << i << "/" << l;
      EXPECT_EQ(std::memcmp(span.data(), Block(keys[2 + i], kBlock).data() + l * kLayerBytes, kLayerBytes), 0);
    }
  }
}

}  // namespace
}  // namespace kvtier::testing

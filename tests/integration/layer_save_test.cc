// Layer-wise save (Client::BeginSave, LayerSave): layers written while
// later ones compute, the whole prefix committed at once, nothing visible
// before, nothing left behind by a save abandoned midway.
#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <thread>
#include <vector>

#include "proto/wire.h"
#include "tests/testing/raw_connection.h"
#include "tests/testing/test_daemon.h"

namespace kvtier::testing {
namespace {

constexpr uint32_t kLayers = 4;              // TestNamespace
constexpr uint64_t kLayerBytes = 16 * 1024;  // 16 tokens x 1 KiB per token and layer

std::vector<std::byte> LayerBytes(size_t block, uint32_t layer) {
  std::vector<std::byte> bytes(kLayerBytes);
  for (size_t j = 0; j < bytes.size(); ++j) bytes[j] = std::byte((block * 31 + layer * 7 + j * 13) & 0xff);
  return bytes;
}

size_t Visible(Client& client, const std::vector<BlockKey>& keys) {
  auto found = client.Lookup(0, keys);
  EXPECT_TRUE(found.ok()) << found.status().ToString();
  return found.ok() ? found->prefix_blocks : 0;
}

TEST(LayerSaveTest, LayersWrittenOneByOneCommitAsOneLayerMajorPrefix) {
  TestDaemon daemon;
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  const auto keys = TestKeys(TestNamespace(), 3, 5);
  auto save = client->BeginSave(0, keys);
  ASSERT_TRUE(save.ok()) << save.status().ToString();
  ASSERT_EQ(save->size(), 3u);
  ASSERT_EQ(save->layer_count(), kLayers);
  ASSERT_EQ(save->layer_bytes(), kLayerBytes);
  for (size_t i = 0; i < keys.size(); ++i) ASSERT_TRUE(save->status(i).ok()) << i;
  // Even layers by copy, odd ones in place; none visible meanwhile.
  for (uint32_t l = 0; l < kLayers; ++l) {
    if (l % 2 == 0) {
      std::vector<std::vector<std::byte>> layer;
      for (size_t i = 0; i < keys.size(); ++i) layer.push_back(LayerBytes(i, l));
      std::vector<std::span<const std::byte>> src(layer.begin(), layer.end());
      ASSERT_TRUE(save->SaveLayer(l, src).ok());
    } else {
      for (size_t i = 0; i < keys.size(); ++i) {
        std::span<std::byte> dst = save->LayerSpan(i, l);
        ASSERT_EQ(dst.size(), kLayerBytes);
        const auto bytes = LayerBytes(i, l);
        std::copy(bytes.begin(), bytes.end(), dst.begin());
      }
      ASSERT_TRUE(save->LayerWritten(l).ok());
    }
    EXPECT_EQ(save->layers_saved(), l + 1);
    EXPECT_EQ(Visible(*client, keys), 0u) << "after layer " << l;
  }
  auto committed = save->FinishSave();
  ASSERT_TRUE(committed.ok()) << committed.status().ToString();
  for (const Status& s : *committed) EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(Visible(*client, keys), 3u);
  // Whole blocks read back layer-major, and a layer range by itself.
  for (size_t i = 0; i < keys.size(); ++i) {
    std::vector<std::byte> whole(kLayers * kLayerBytes);
    auto got = client->Get(0, keys[i], whole);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_EQ(*got, whole.size());
    for (uint32_t l = 0; l < kLayers; ++l) {
      const auto expected = LayerBytes(i, l);
      EXPECT_TRUE(std::equal(expected.begin(), expected.end(), whole.begin() + l * kLayerBytes))
          << "block " << i << " layer " << l;
    }
  }
  std::vector<std::byte> layer2(kLayerBytes);
  std::span<std::byte> dst[] = {layer2};
  auto two = client->GetLayers(0, std::span(keys).subspan(1, 1), 2, 3, dst);
  ASSERT_TRUE(two[0].ok()) << two[0].status().ToString();
  const auto expected = LayerBytes(1, 2);
  EXPECT_TRUE(std::equal(expected.begin(), expected.end(), layer2.begin()));
  // Once finished, the save takes nothing more.
  EXPECT_EQ(save->LayerWritten(0).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(save->LayerSpan(0, 0).empty());
  EXPECT_EQ(save->FinishSave().status().code(), StatusCode::kFailedPrecondition);
}

TEST(LayerSaveTest, FinishingWithALayerMissingCommitsNothingAndKeepsTheSaveOpen) {
  TestDaemon daemon;
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  const auto keys = TestKeys(TestNamespace(), 2, 6);
  auto save = client->BeginSave(0, keys);
  ASSERT_TRUE(save.ok());
  for (uint32_t l = 0; l < kLayers; ++l) {
    if (l != 2) {
      ASSERT_TRUE(save->LayerWritten(l).ok());
    }
  }
  auto early = save->FinishSave();
  EXPECT_EQ(early.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(early.status().message().find("layer 2"), std::string::npos) << early.status().message();
  EXPECT_EQ(Visible(*client, keys), 0u);
  ASSERT_TRUE(save->LayerWritten(2).ok());
  auto done = save->FinishSave();
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(Visible(*client, keys), 2u);
}

TEST(LayerSaveTest, BadLayersAndSizesAreRefused) {
  TestDaemon daemon;
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  const auto keys = TestKeys(TestNamespace(), 2, 7);
  auto save = client->BeginSave(0, keys);
  ASSERT_TRUE(save.ok());
  EXPECT_EQ(save->LayerWritten(kLayers).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(save->LayerSpan(0, kLayers).empty());
  EXPECT_TRUE(save->LayerSpan(2, 0).empty());
  std::vector<std::byte> small(kLayerBytes - 1), right(kLayerBytes);
  std::vector<std::span<const std::byte>> wrong_size = {right, small};
  EXPECT_EQ(save->SaveLayer(0, wrong_size).code(), StatusCode::kInvalidArgument);
  std::vector<std::span<const std::byte>> too_few = {right};
  EXPECT_EQ(save->SaveLayer(0, too_few).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(save->layers_saved(), 0u) << "a refused layer does not count";
  EXPECT_EQ(client->BeginSave(3, keys).status().code(), StatusCode::kInvalidArgument) << "namespace 3";
  ASSERT_TRUE(save->Abort().ok());
  EXPECT_EQ(save->SaveLayer(0, std::vector<std::span<const std::byte>>{right, right}).code(),
            StatusCode::kFailedPrecondition);
}

// Abandoned midway, by the engine (the save destroyed) or by its crash
// (the connection ends): nothing is visible and the blocks can be saved
// again, by another client too.
TEST(LayerSaveTest, ASaveAbandonedMidwayLeavesNothingBehind) {
  TestDaemon daemon;
  auto client = daemon.Connect();
  auto other = daemon.Connect();
  ASSERT_NE(client, nullptr);
  ASSERT_NE(other, nullptr);
  const auto keys = TestKeys(TestNamespace(), 3, 8);
  {
    auto save = client->BeginSave(0, keys);
    ASSERT_TRUE(save.ok());
    ASSERT_TRUE(save->LayerWritten(0).ok());
    ASSERT_TRUE(save->LayerWritten(1).ok());
    // Meanwhile another writer finds the blocks taken, not cached.
    auto meanwhile = other->BeginSave(0, keys);
    ASSERT_TRUE(meanwhile.ok());
    EXPECT_EQ(meanwhile->status(0).code(), StatusCode::kAlreadyExists);
  }  // destroyed before FinishSave
  // Its abort goes without a reply; the next call on the same connection
  // is answered after it.
  EXPECT_EQ(Visible(*client, keys), 0u);
  {
    // An engine that dies mid-save: what BeginSave sends (a Reserve of the
    // whole blocks), then its socket closes with nothing committed.
    RawConnection crashed;
    ASSERT_TRUE(crashed.Connect(daemon.socket_path()).ok());
    ASSERT_TRUE(crashed.Hello({TestNamespace()}).ok());
    std::vector<uint64_t> sizes(keys.size(), kLayers * kLayerBytes);
    v1::Request reserve = wire::MakeReserve(0, keys, sizes);
    reserve.set_id(2);
    ASSERT_TRUE(crashed.SendFrame(reserve).ok());
    auto reserved = crashed.ReadResponse();
    ASSERT_TRUE(reserved.ok()) << reserved.status().ToString();
    ASSERT_EQ(reserved->reserve().slots_size(), 3) << reserved->DebugString();
    for (const auto& slot : reserved->reserve().slots()) {
      EXPECT_EQ(wire::FromProto(slot.status()).code(), StatusCode::kOk) << "the first save's blocks were let go";
    }
    EXPECT_EQ(EngineCounter(daemon, "engine.reserved_blocks"), 3);
  }
  // The daemon sees the socket close on its io thread, a moment later.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (EngineCounter(daemon, "engine.reserved_blocks") != 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(EngineCounter(daemon, "engine.reserved_blocks"), 0) << "the crashed engine's reservations went";
  EXPECT_EQ(Visible(*other, keys), 0u);
  auto again = other->BeginSave(0, keys);
  ASSERT_TRUE(again.ok());
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_TRUE(again->status(i).ok()) << i;
  for (uint32_t l = 0; l < kLayers; ++l) ASSERT_TRUE(again->LayerWritten(l).ok());
  ASSERT_TRUE(again->FinishSave().ok());
  EXPECT_EQ(Visible(*other, keys), 3u);
  EXPECT_EQ(EngineCounter(daemon, "engine.reserved_blocks"), 0);
}

}  // namespace
}  // namespace kvtier::testing

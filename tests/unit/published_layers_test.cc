// PublishedLayers: the layers of reservations their writers published to
// peers, over a fake of the writer's reservations.
#include "daemon/engine/published_layers.h"

#include <gtest/gtest.h>

#include <map>

namespace kvtier {
namespace {

constexpr NamespaceFingerprint kNs{1, 2};
constexpr uint32_t kLayers = 4;

class PublishedLayersTest : public ::testing::Test {
 protected:
  // Reservations: key -> (writer, offset); every block 4 layers of 1 KiB.
  std::map<BlockKey, std::pair<ConnectionId, uint64_t>> reserved_;
  std::vector<BlockKey> heard_;
  PublishedLayers published_{[this](ConnectionId writer, const NamespaceFingerprint& ns,
                                    const BlockKey& key) -> std::optional<PublishedLayers::Reserved> {
                               auto it = reserved_.find(key);
                               if (ns != kNs || it == reserved_.end() || it->second.first != writer) {
                                 return std::nullopt;
                               }
                               return PublishedLayers::Reserved{HostTier::Extent{it->second.second, 4096}, 4096};
                             },
                             [](const NamespaceFingerprint&, uint64_t) { return kLayers; }, /*max_blocks=*/3};
};

TEST_F(PublishedLayersTest, LayersArePublishedInOrderWithTheirChecksums) {
  reserved_[{1, 1}] = {7, 8192};
  published_.SetListener([this](const BlockKey& key) { heard_.push_back(key); });
  const BlockKey key{1, 1};
  EXPECT_FALSE(published_.Find(kNs, key).has_value());
  const uint64_t first[] = {11};
  ASSERT_TRUE(published_.Publish(7, kNs, std::span(&key, 1), 0, 1, first)[0].ok());
  auto partial = published_.Find(kNs, key);
  ASSERT_TRUE(partial.has_value());
  EXPECT_EQ(partial->offset, 8192u);
  EXPECT_EQ(partial->bytes, 4096u);
  EXPECT_EQ(partial->layer_count, kLayers);
  EXPECT_EQ(partial->layer_checksums, std::vector<uint64_t>{11});
  const uint64_t more[] = {22, 33};
  ASSERT_TRUE(published_.Publish(7, kNs, std::span(&key, 1), 1, 3, more)[0].ok());
  EXPECT_EQ(published_.Find(kNs, key)->layer_checksums, (std::vector<uint64_t>{11, 22, 33}));
  EXPECT_EQ(heard_, (std::vector<BlockKey>{key, key}));
  // Out of order, past the block's layers, or the wrong count: refused, nothing changes.
  const uint64_t one[] = {44};
  EXPECT_EQ(published_.Publish(7, kNs, std::span(&key, 1), 1, 2, one)[0].code(), StatusCode::kInvalidArgument);
  const uint64_t two[] = {44, 55};
  EXPECT_EQ(published_.Publish(7, kNs, std::span(&key, 1), 3, 5, two)[0].code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(published_.Publish(7, kNs, std::span(&key, 1), 3, 4, two)[0].code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(published_.Find(kNs, key)->layer_checksums.size(), 3u);
  EXPECT_EQ(heard_.size(), 2u);
}

TEST_F(PublishedLayersTest, OnlyTheWriterOfAReservationPublishesAndAnEntryEndsWithIt) {
  reserved_[{1, 1}] = {7, 0};
  const BlockKey key{1, 1};
  const uint64_t sum[] = {1};
  EXPECT_EQ(published_.Publish(8, kNs, std::span(&key, 1), 0, 1, sum)[0].code(), StatusCode::kInvalidArgument);
  const BlockKey other{9, 9};
  EXPECT_EQ(published_.Publish(7, kNs, std::span(&other, 1), 0, 1, sum)[0].code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(published_.Publish(7, kNs, std::span(&key, 1), 0, 1, sum)[0].ok());
  EXPECT_FALSE(published_.Find(NamespaceFingerprint{5, 5}, key).has_value()) << "another namespace";
  // Committed or aborted: the reservation is gone, and so is the entry.
  reserved_.erase(key);
  EXPECT_FALSE(published_.Find(kNs, key).has_value());
  EXPECT_EQ(published_.size(), 0u);
  // Reserved again elsewhere by another writer: a fresh start from layer 0.
  reserved_[key] = {8, 4096};
  EXPECT_EQ(published_.Publish(8, kNs, std::span(&key, 1), 1, 2, sum)[0].code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(published_.Publish(8, kNs, std::span(&key, 1), 0, 1, sum)[0].ok());
  published_.EndConnection(8);
  EXPECT_EQ(published_.size(), 0u);
}

TEST_F(PublishedLayersTest, AtMostMaxBlocksAreKeptTheOldestGoingFirst) {
  std::vector<BlockKey> keys;
  for (uint64_t i = 0; i < 5; ++i) {
    keys.push_back({3, i});
    reserved_[keys.back()] = {7, i * 4096};
  }
  std::vector<uint64_t> sums(keys.size(), 1);
  auto out = published_.Publish(7, kNs, keys, 0, 1, sums);
  for (const Status& s : out) EXPECT_TRUE(s.ok());
  EXPECT_EQ(published_.size(), 3u);
  EXPECT_FALSE(published_.Find(kNs, keys[0]).has_value());
  EXPECT_TRUE(published_.Find(kNs, keys[4]).has_value());
}

TEST_F(PublishedLayersTest, AHandedOffBlockTakenAfterItsCommitGoesAtOnceAndOnlyOnce) {
  const BlockKey handed{1, 1}, kept{1, 2};
  reserved_[handed] = {7, 0};
  reserved_[kept] = {7, 4096};
  const uint64_t sum[] = {1};
  ASSERT_TRUE(published_.Publish(7, kNs, std::span(&handed, 1), 0, 1, sum, /*free_when_taken=*/true)[0].ok());
  ASSERT_TRUE(published_.Publish(7, kNs, std::span(&kept, 1), 0, 1, sum)[0].ok());
  EXPECT_EQ(published_.handoffs(), 1u);
  reserved_.clear();  // both committed
  const BlockKey both[] = {handed, kept};
  EXPECT_TRUE(published_.Taken(NamespaceFingerprint{5, 5}, both).empty()) << "another namespace";
  EXPECT_EQ(published_.Taken(kNs, both), std::vector<BlockKey>{handed}) << "only the handed-off block goes";
  EXPECT_TRUE(published_.Taken(kNs, both).empty()) << "a block goes once";
  EXPECT_EQ(published_.handoffs(), 0u);
}

TEST_F(PublishedLayersTest, AHandedOffBlockTakenWhileReservedGoesAtItsWritersCommit) {
  const BlockKey key{1, 1};
  reserved_[key] = {7, 0};
  const uint64_t sum[] = {1};
  ASSERT_TRUE(published_.Publish(7, kNs, std::span(&key, 1), 0, 1, sum, /*free_when_taken=*/true)[0].ok());
  EXPECT_TRUE(published_.Taken(kNs, std::span(&key, 1)).empty()) << "still reserved: not yet";
  EXPECT_TRUE(published_.Committed(8, kNs, std::span(&key, 1)).empty()) << "another writer's commit";
  reserved_.erase(key);
  EXPECT_EQ(published_.Committed(7, kNs, std::span(&key, 1)), std::vector<BlockKey>{key});
  EXPECT_TRUE(published_.Committed(7, kNs, std::span(&key, 1)).empty());
  EXPECT_EQ(published_.handoffs(), 0u);

  // Taken while reserved, then the writer's connection closes uncommitted: nothing is left to free.
  const BlockKey next{1, 2};
  reserved_[next] = {7, 4096};
  ASSERT_TRUE(published_.Publish(7, kNs, std::span(&next, 1), 0, 1, sum, /*free_when_taken=*/true)[0].ok());
  EXPECT_TRUE(published_.Taken(kNs, std::span(&next, 1)).empty());
  published_.EndConnection(7);
  EXPECT_EQ(published_.handoffs(), 0u);
  EXPECT_TRUE(published_.Committed(7, kNs, std::span(&next, 1)).empty());
}

TEST_F(PublishedLayersTest, AHandedOffBlockNotTakenOutlivesItsCommitAndItsWritersConnection) {
  const BlockKey key{1, 1};
  reserved_[key] = {7, 0};
  const uint64_t sum[] = {1};
  ASSERT_TRUE(published_.Publish(7, kNs, std::span(&key, 1), 0, 1, sum, /*free_when_taken=*/true)[0].ok());
  reserved_.erase(key);
  EXPECT_TRUE(published_.Committed(7, kNs, std::span(&key, 1)).empty()) << "not taken yet: it stays";
  published_.EndConnection(7);
  EXPECT_EQ(published_.Taken(kNs, std::span(&key, 1)), std::vector<BlockKey>{key}) << "taken later, it goes";
}

TEST_F(PublishedLayersTest, AMarkTakenBetweenTwoLayersOfItsSaveStaysTaken) {
  const BlockKey key{1, 1};
  reserved_[key] = {7, 0};
  const uint64_t first[] = {1};
  ASSERT_TRUE(published_.Publish(7, kNs, std::span(&key, 1), 0, 1, first, /*free_when_taken=*/true)[0].ok());
  EXPECT_TRUE(published_.Taken(kNs, std::span(&key, 1)).empty());
  const uint64_t rest[] = {2, 3, 4};
  ASSERT_TRUE(published_.Publish(7, kNs, std::span(&key, 1), 1, 4, rest, /*free_when_taken=*/true)[0].ok());
  EXPECT_TRUE(published_.taken_while_reserved()) << "the same save's next layers keep its mark as it was";
  reserved_.erase(key);
  EXPECT_EQ(published_.Committed(7, kNs, std::span(&key, 1)), std::vector<BlockKey>{key});
}

TEST_F(PublishedLayersTest, AnAbortOrAnotherSaveOfTheKeyDropsItsMark) {
  const BlockKey key{1, 1};
  const uint64_t sum[] = {1};
  // Taken while reserved, then aborted: nothing to free, ever.
  reserved_[key] = {7, 0};
  ASSERT_TRUE(published_.Publish(7, kNs, std::span(&key, 1), 0, 1, sum, /*free_when_taken=*/true)[0].ok());
  EXPECT_TRUE(published_.Taken(kNs, std::span(&key, 1)).empty());
  published_.Aborted(7, std::span(&key, 1));
  EXPECT_EQ(published_.handoffs(), 0u);
  EXPECT_FALSE(published_.taken_while_reserved());
  // Another writer saves the key without a hand-off: the old mark is not its own.
  reserved_[key] = {7, 8192};  // reserved again
  ASSERT_TRUE(published_.Publish(7, kNs, std::span(&key, 1), 0, 1, sum, /*free_when_taken=*/true)[0].ok());
  EXPECT_EQ(published_.handoffs(), 1u);
  reserved_[key] = {8, 4096};
  ASSERT_TRUE(published_.Publish(8, kNs, std::span(&key, 1), 0, 1, sum)[0].ok());
  EXPECT_EQ(published_.handoffs(), 0u);
  reserved_.erase(key);
  EXPECT_TRUE(published_.Taken(kNs, std::span(&key, 1)).empty()) << "that save is not a hand-off";
}

TEST_F(PublishedLayersTest, AtMostMaxBlocksHandOffMarksAreKept) {
  std::vector<BlockKey> keys;
  for (uint64_t i = 0; i < 5; ++i) {
    keys.push_back({3, i});
    reserved_[keys.back()] = {7, i * 4096};
  }
  std::vector<uint64_t> sums(keys.size(), 1);
  for (const Status& s : published_.Publish(7, kNs, keys, 0, 1, sums, /*free_when_taken=*/true)) EXPECT_TRUE(s.ok());
  EXPECT_EQ(published_.handoffs(), 3u);
  reserved_.clear();
  EXPECT_EQ(published_.Taken(kNs, keys), (std::vector<BlockKey>{keys[2], keys[3], keys[4]}))
      << "the oldest marks went: those blocks stay";
}

}  // namespace
}  // namespace kvtier

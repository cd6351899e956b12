// HbmTier's in-place holds (BlockTier::HoldInPlace / ReleaseInPlace,
// tiers/hbm/hbm_tier.h): a held block's device range stays allocated, with
// its bytes, until the last release, whatever happens to its key. Run on
// the host-memory FakeHbmDevice, whose "device" bytes the test can read at
// the offset a hold answers, so they run without a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <future>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/checksum.h"
#include "tests/gpu/fake_hbm_device.h"
#include "tests/gpu/gpu_test_util.h"
#include "tiers/hbm/hbm_tier.h"

namespace kvtier {
namespace {

constexpr uint64_t kBlockBytes = 64 << 10;  // 4 layers of 16 KiB, a whole number of device alignments
constexpr uint32_t kLayers = 4;
constexpr uint64_t kPoolBytes = 8 * kBlockBytes;
constexpr uint64_t kStagingBytes = 8 * kBlockBytes;
constexpr NamespaceFingerprint kNs{0xc0de, 0x1a91};

BlockKey Key(uint64_t i) { return BlockKey{0x401d, i}; }

// Payloads describe themselves: block `seed` is FillPattern(seed).
std::vector<std::byte> Payload(uint64_t seed) {
  std::vector<std::byte> bytes(kBlockBytes);
  ::kvtier::testing::FillPattern(seed, bytes);
  return bytes;
}

class HbmInPlaceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto fake = std::make_unique<::kvtier::testing::FakeHbmDevice>(kPoolBytes, kStagingBytes, 8);
    fake_ = fake.get();
    auto tier = HbmTier::Create(std::move(fake));
    ASSERT_TRUE(tier.ok()) << tier.status().ToString();
    tier_ = std::move(*tier);
  }

  // Writes block `seed` under Key(key) and waits until it is readable.
  Status WriteAndWait(uint64_t key, uint64_t seed) {
    const std::vector<std::byte> payload = Payload(seed);
    auto done = std::make_shared<std::promise<Status>>();
    std::future<Status> written = done->get_future();
    Status accepted = tier_->Write(kNs, Key(key), kLayers, payload, [done](Status s) { done->set_value(s); });
    if (!accepted.ok()) return accepted;
    return written.get();
  }
  Result<size_t> ReadAndWait(uint64_t key, std::vector<std::byte>& out) {
    out.assign(kBlockBytes, std::byte{0});
    auto done = std::make_shared<std::promise<Result<size_t>>>();
    std::future<Result<size_t>> read = done->get_future();
    Status accepted =
        tier_->Read(Key(key), 0, kLayers, out, [done](Result<size_t> r) { done->set_value(std::move(r)); });
    if (!accepted.ok()) return accepted;
    return read.get();
  }
  // Whether the fake device holds block `seed` at `offset`.
  bool DeviceHolds(uint64_t offset, uint64_t seed) const {
    const std::span<std::byte> memory = fake_->memory();
    if (offset + kBlockBytes > memory.size()) return false;
    return ::kvtier::testing::MatchesPattern(seed, memory.subspan(offset, kBlockBytes));
  }
  std::optional<int64_t> FindCounter(std::string_view name) const {
    CounterCollector c;
    tier_->VisitCounters(c);
    for (const auto& [n, v] : c.counters()) {
      if (n == name) return v;
    }
    return std::nullopt;
  }
  int64_t Counter(std::string_view name) const {
    std::optional<int64_t> value = FindCounter(name);
    if (!value) ADD_FAILURE() << "no counter " << name;
    return value.value_or(-1);
  }
  uint64_t Blocks(uint64_t n) const { return n * tier_->StoredBytes(kBlockBytes); }

  ::kvtier::testing::FakeHbmDevice* fake_ = nullptr;
  std::unique_ptr<HbmTier> tier_;
};

TEST_F(HbmInPlaceTest, AHoldAnswersTheStoredBytesWhereTheyAreAndIsNotARead) {
  ASSERT_TRUE(WriteAndWait(1, 1).ok());
  Result<BlockTier::InPlace> held = tier_->HoldInPlace(Key(1));
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  EXPECT_TRUE(DeviceHolds(held->offset, 1)) << "offset " << held->offset;
  const std::vector<std::byte> payload = Payload(1);
  EXPECT_EQ(held->info.ns, kNs);
  EXPECT_EQ(held->info.payload_bytes, kBlockBytes);
  EXPECT_EQ(held->info.layer_count, kLayers);
  EXPECT_EQ(held->info.payload_checksum, BlockChecksum(payload));
  EXPECT_EQ(Counter("hbm.reads"), 0) << "a hold is not a read";
  EXPECT_EQ(Counter("hbm.in_place_holds"), 1);
  EXPECT_EQ(Counter("hbm.held_blocks"), 1);
  tier_->ReleaseInPlace(Key(1), held->offset);
  EXPECT_EQ(Counter("hbm.held_blocks"), 0);
  EXPECT_EQ(Counter("hbm.in_place_holds"), 1) << "monotonic";
  EXPECT_EQ(Counter("hbm.bad_in_place_releases"), 0);
  EXPECT_TRUE(tier_->Find(Key(1)).has_value()) << "releasing leaves the block stored";
}

TEST_F(HbmInPlaceTest, OnlyAStoredBlockCanBeHeld) {
  EXPECT_EQ(tier_->HoldInPlace(Key(2)).status().code(), StatusCode::kNotFound) << "never written";
  fake_->Hold();  // the write's copy stays in flight
  const std::vector<std::byte> payload = Payload(2);
  auto done = std::make_shared<std::promise<Status>>();
  std::future<Status> written = done->get_future();
  ASSERT_TRUE(tier_->Write(kNs, Key(2), kLayers, payload, [done](Status s) { done->set_value(s); }).ok());
  EXPECT_EQ(tier_->HoldInPlace(Key(2)).status().code(), StatusCode::kNotFound) << "still being written";
  fake_->Release();
  ASSERT_TRUE(written.get().ok());
  Result<BlockTier::InPlace> held = tier_->HoldInPlace(Key(2));
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  tier_->ReleaseInPlace(Key(2), held->offset);
  EXPECT_EQ(Counter("hbm.in_place_holds"), 1) << "refused holds are not counted";
}

TEST_F(HbmInPlaceTest, EraseFreesTheKeyAtOnceAndTheRangeAtTheRelease) {
  ASSERT_TRUE(WriteAndWait(3, 3).ok());
  Result<BlockTier::InPlace> held = tier_->HoldInPlace(Key(3));
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  const uint64_t old_offset = held->offset;

  ASSERT_TRUE(tier_->Erase(Key(3)).ok());
  EXPECT_FALSE(tier_->Find(Key(3)).has_value());
  EXPECT_EQ(tier_->HoldInPlace(Key(3)).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(tier_->used_bytes(), Blocks(1)) << "the held range stays charged";
  EXPECT_EQ(fake_->live_ranges(), 1u) << "and allocated";
  EXPECT_EQ(Counter("hbm.held_blocks"), 1) << "dropped but held";
  EXPECT_EQ(Counter("hbm.blocks"), 0);

  // A block of the same size, under another key, lands elsewhere.
  ASSERT_TRUE(WriteAndWait(4, 4).ok());
  Result<BlockTier::InPlace> other = tier_->HoldInPlace(Key(4));
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  EXPECT_NE(other->offset, old_offset);
  tier_->ReleaseInPlace(Key(4), other->offset);
  EXPECT_TRUE(DeviceHolds(old_offset, 3)) << "the held bytes are unchanged";
  EXPECT_EQ(tier_->used_bytes(), Blocks(2));

  tier_->ReleaseInPlace(Key(3), old_offset);
  EXPECT_EQ(tier_->used_bytes(), Blocks(1));
  EXPECT_EQ(fake_->live_ranges(), 1u);
  EXPECT_EQ(Counter("hbm.held_blocks"), 0);
  EXPECT_EQ(Counter("hbm.bad_in_place_releases"), 0);

  // The range is free again: best fit hands it to the next block its size.
  ASSERT_TRUE(WriteAndWait(5, 5).ok());
  Result<BlockTier::InPlace> reused = tier_->HoldInPlace(Key(5));
  ASSERT_TRUE(reused.ok()) << reused.status().ToString();
  EXPECT_EQ(reused->offset, old_offset);
  EXPECT_TRUE(DeviceHolds(old_offset, 5));
  tier_->ReleaseInPlace(Key(5), reused->offset);
}

TEST_F(HbmInPlaceTest, AHeldRangeIsNeverHandedOutEvenWhenThePoolFills) {
  ASSERT_TRUE(WriteAndWait(6, 6).ok());
  Result<BlockTier::InPlace> held = tier_->HoldInPlace(Key(6));
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  ASSERT_TRUE(tier_->Erase(Key(6)).ok());
  const uint64_t fits = kPoolBytes / kBlockBytes - 1;
  for (uint64_t i = 0; i < fits; ++i) ASSERT_TRUE(WriteAndWait(100 + i, 100 + i).ok()) << i;
  EXPECT_EQ(WriteAndWait(200, 200).code(), StatusCode::kNoSpace) << "the held range is not free";
  EXPECT_TRUE(DeviceHolds(held->offset, 6));
  tier_->ReleaseInPlace(Key(6), held->offset);
  EXPECT_TRUE(WriteAndWait(200, 200).ok());
}

TEST_F(HbmInPlaceTest, HoldsNestAndTheLastReleaseFrees) {
  ASSERT_TRUE(WriteAndWait(7, 7).ok());
  Result<BlockTier::InPlace> first = tier_->HoldInPlace(Key(7));
  Result<BlockTier::InPlace> second = tier_->HoldInPlace(Key(7));
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(first->offset, second->offset);
  EXPECT_EQ(Counter("hbm.in_place_holds"), 2);
  EXPECT_EQ(Counter("hbm.held_blocks"), 1) << "one block, held twice";

  // One release while stored, then erase: the other hold keeps the range.
  tier_->ReleaseInPlace(Key(7), first->offset);
  ASSERT_TRUE(tier_->Erase(Key(7)).ok());
  EXPECT_EQ(tier_->used_bytes(), Blocks(1));
  EXPECT_EQ(fake_->live_ranges(), 1u);
  tier_->ReleaseInPlace(Key(7), second->offset);
  EXPECT_EQ(tier_->used_bytes(), 0u);
  EXPECT_EQ(fake_->live_ranges(), 0u);

  // Both holds outstanding across the erase: two releases needed.
  ASSERT_TRUE(WriteAndWait(8, 8).ok());
  Result<BlockTier::InPlace> a = tier_->HoldInPlace(Key(8));
  Result<BlockTier::InPlace> b = tier_->HoldInPlace(Key(8));
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(tier_->Erase(Key(8)).ok());
  tier_->ReleaseInPlace(Key(8), a->offset);
  EXPECT_EQ(tier_->used_bytes(), Blocks(1)) << "one hold left";
  EXPECT_EQ(Counter("hbm.held_blocks"), 1);
  tier_->ReleaseInPlace(Key(8), b->offset);
  EXPECT_EQ(tier_->used_bytes(), 0u);
  EXPECT_EQ(fake_->live_ranges(), 0u);
  EXPECT_EQ(Counter("hbm.held_blocks"), 0);
  EXPECT_EQ(Counter("hbm.bad_in_place_releases"), 0);
}

TEST_F(HbmInPlaceTest, ReleasingTheOldRangeOfARewrittenKeyLeavesTheNewBlockAlone) {
  ASSERT_TRUE(WriteAndWait(9, 9).ok());
  Result<BlockTier::InPlace> old_hold = tier_->HoldInPlace(Key(9));
  ASSERT_TRUE(old_hold.ok()) << old_hold.status().ToString();
  ASSERT_TRUE(tier_->Erase(Key(9)).ok());
  ASSERT_TRUE(WriteAndWait(9, 90).ok()) << "the key is free at once";
  Result<BlockTier::InPlace> new_hold = tier_->HoldInPlace(Key(9));
  ASSERT_TRUE(new_hold.ok()) << new_hold.status().ToString();
  ASSERT_NE(new_hold->offset, old_hold->offset);
  EXPECT_TRUE(DeviceHolds(old_hold->offset, 9));
  EXPECT_TRUE(DeviceHolds(new_hold->offset, 90));
  EXPECT_EQ(Counter("hbm.held_blocks"), 2);

  tier_->ReleaseInPlace(Key(9), old_hold->offset);
  EXPECT_EQ(tier_->used_bytes(), Blocks(1)) << "the old range is freed";
  EXPECT_EQ(Counter("hbm.held_blocks"), 1) << "the new block is still held";
  tier_->ReleaseInPlace(Key(9), old_hold->offset);
  EXPECT_EQ(Counter("hbm.bad_in_place_releases"), 1) << "the old range was released already";
  EXPECT_EQ(Counter("hbm.held_blocks"), 1);

  // The new block's hold survived both: erasing it keeps its range.
  ASSERT_TRUE(tier_->Erase(Key(9)).ok());
  EXPECT_EQ(tier_->used_bytes(), Blocks(1));
  EXPECT_TRUE(DeviceHolds(new_hold->offset, 90));
  tier_->ReleaseInPlace(Key(9), new_hold->offset);
  EXPECT_EQ(tier_->used_bytes(), 0u);
  EXPECT_EQ(fake_->live_ranges(), 0u);
}

TEST_F(HbmInPlaceTest, ABadReleaseIsCountedAndIgnored) {
  ASSERT_TRUE(WriteAndWait(10, 10).ok());
  Result<BlockTier::InPlace> held = tier_->HoldInPlace(Key(10));
  ASSERT_TRUE(held.ok()) << held.status().ToString();

  tier_->ReleaseInPlace(Key(11), held->offset);                // a key never held, at a held offset
  tier_->ReleaseInPlace(Key(10), held->offset + kBlockBytes);  // the held key at another offset
  tier_->ReleaseInPlace(Key(12), 0);                           // nothing at all
  EXPECT_EQ(Counter("hbm.bad_in_place_releases"), 3);
  EXPECT_EQ(Counter("hbm.held_blocks"), 1) << "the real hold stands";

  ASSERT_TRUE(tier_->Erase(Key(10)).ok());
  tier_->ReleaseInPlace(Key(11), held->offset);  // the dropped range, under the wrong key
  EXPECT_EQ(Counter("hbm.bad_in_place_releases"), 4);
  EXPECT_EQ(tier_->used_bytes(), Blocks(1)) << "a bad release frees nothing";
  tier_->ReleaseInPlace(Key(10), held->offset);
  EXPECT_EQ(tier_->used_bytes(), 0u);
  tier_->ReleaseInPlace(Key(10), held->offset);  // once too often
  EXPECT_EQ(Counter("hbm.bad_in_place_releases"), 5);

  // A stored block that is not held: the release changes nothing.
  ASSERT_TRUE(WriteAndWait(13, 13).ok());
  Result<BlockTier::InPlace> probe = tier_->HoldInPlace(Key(13));
  ASSERT_TRUE(probe.ok());
  tier_->ReleaseInPlace(Key(13), probe->offset);
  tier_->ReleaseInPlace(Key(13), probe->offset);
  EXPECT_EQ(Counter("hbm.bad_in_place_releases"), 6);
  std::vector<std::byte> out;
  Result<size_t> read = ReadAndWait(13, out);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(out, Payload(13));
}

TEST_F(HbmInPlaceTest, ACorruptBlockDroppedWhileHeldKeepsItsRange) {
  ASSERT_TRUE(WriteAndWait(14, 14).ok());
  Result<BlockTier::InPlace> held = tier_->HoldInPlace(Key(14));
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  fake_->memory()[held->offset + 5] ^= std::byte{0x40};
  std::vector<std::byte> out;
  EXPECT_EQ(ReadAndWait(14, out).status().code(), StatusCode::kCorruption);
  EXPECT_FALSE(tier_->Find(Key(14)).has_value()) << "dropped";
  EXPECT_EQ(tier_->used_bytes(), Blocks(1)) << "but its range is held";
  EXPECT_EQ(fake_->live_ranges(), 1u);
  EXPECT_EQ(Counter("hbm.held_blocks"), 1);
  tier_->ReleaseInPlace(Key(14), held->offset);
  EXPECT_EQ(tier_->used_bytes(), 0u);
  EXPECT_EQ(fake_->live_ranges(), 0u);
  EXPECT_EQ(Counter("hbm.bad_in_place_releases"), 0);
}

TEST_F(HbmInPlaceTest, TheTierGoesAwayWithRangesStillHeld) {
  ASSERT_TRUE(WriteAndWait(15, 15).ok());
  ASSERT_TRUE(WriteAndWait(16, 16).ok());
  ASSERT_TRUE(tier_->HoldInPlace(Key(15)).ok());
  ASSERT_TRUE(tier_->HoldInPlace(Key(16)).ok());
  ASSERT_TRUE(tier_->Erase(Key(15)).ok());  // one dropped but held, one stored and held
  EXPECT_EQ(Counter("hbm.held_blocks"), 2);
  fake_ = nullptr;
  tier_.reset();  // frees them with the device
}

TEST_F(HbmInPlaceTest, TheCountersAreVisited) {
  for (const char* name : {"hbm.in_place_holds", "hbm.held_blocks", "hbm.bad_in_place_releases"}) {
    std::optional<int64_t> value = FindCounter(name);
    ASSERT_TRUE(value.has_value()) << name;
    EXPECT_EQ(*value, 0) << name;
  }
}

}  // namespace
}  // namespace kvtier

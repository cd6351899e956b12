// The on-device record header: round trip, every kind of damage detected,
// layer ranges.
#include "tiers/nvme/block_record.h"

#include <gtest/gtest.h>

#include <vector>

namespace kvtier {
namespace {

RecordHeader SampleHeader() {
  RecordHeader h;
  h.ns = BlockKey{0x1111222233334444ULL, 0x5555666677778888ULL};
  h.key = BlockKey{0x0123456789abcdefULL, 0xfedcba9876543210ULL};
  h.layer_count = 32;
  h.layer_bytes = 65536;
  h.payload_bytes = 32 * 65536;
  h.payload_checksum = 0xdeadbeefcafef00dULL;
  h.region_generation = 42;
  return h;
}

TEST(BlockRecord, HeaderRoundTrips) {
  std::vector<std::byte> bytes(kRecordHeaderBytes, std::byte{0xee});
  EncodeRecordHeader(SampleHeader(), bytes);
  auto decoded = DecodeRecordHeader(bytes);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(*decoded, SampleHeader());
  for (size_t i = 96; i < bytes.size(); ++i) ASSERT_EQ(bytes[i], std::byte{0}) << "padding at " << i;
}

TEST(BlockRecord, MagicIsTheAsciiTagOnDisk) {
  std::vector<std::byte> bytes(kRecordHeaderBytes);
  EncodeRecordHeader(SampleHeader(), bytes);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(bytes.data()), 8), "KVTBLK01");
}

TEST(BlockRecord, AnyFlippedHeaderByteIsCorruption) {
  std::vector<std::byte> good(kRecordHeaderBytes);
  EncodeRecordHeader(SampleHeader(), good);
  for (size_t i = 0; i < 96; ++i) {
    auto bad = good;
    bad[i] ^= std::byte{0x01};
    auto decoded = DecodeRecordHeader(bad);
    ASSERT_FALSE(decoded.ok()) << "flip at byte " << i << " went unnoticed";
    EXPECT_EQ(decoded.status().code(), StatusCode::kCorruption);
  }
}

TEST(BlockRecord, ZerosStaleBytesAndShortBuffersAreCorruption) {
  std::vector<std::byte> zeros(kRecordHeaderBytes);
  EXPECT_EQ(DecodeRecordHeader(zeros).status().code(), StatusCode::kCorruption);
  std::vector<std::byte> good(kRecordHeaderBytes);
  EncodeRecordHeader(SampleHeader(), good);
  EXPECT_EQ(DecodeRecordHeader(std::span(good).first(100)).status().code(), StatusCode::kCorruption);
}

TEST(BlockRecord, InconsistentLayerGeometryIsCorruption) {
  std::vector<std::byte> bytes(kRecordHeaderBytes);
  RecordHeader h = SampleHeader();
  h.payload_bytes += 1;  // a valid checksum over an impossible geometry
  EncodeRecordHeader(h, bytes);
  EXPECT_EQ(DecodeRecordHeader(bytes).status().code(), StatusCode::kCorruption);
  h = SampleHeader();
  h.layer_count = 0;
  EncodeRecordHeader(h, bytes);
  EXPECT_EQ(DecodeRecordHeader(bytes).status().code(), StatusCode::kCorruption);
}

TEST(BlockRecord, RecordBytesPadsThePayloadToTheAlignment) {
  EXPECT_EQ(RecordBytes(1, 4096), 4096u + 4096u);
  EXPECT_EQ(RecordBytes(4096, 4096), 4096u + 4096u);
  EXPECT_EQ(RecordBytes(4097, 4096), 4096u + 8192u);
  EXPECT_EQ(RecordBytes(2 << 20, 4096), 4096u + (2u << 20));
}

TEST(BlockRecord, LayerRangeIsAContiguousSubRange) {
  const RecordHeader h = SampleHeader();
  auto all = LayerRange(h, 0, 32);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->offset, 0u);
  EXPECT_EQ(all->length, h.payload_bytes);
  auto middle = LayerRange(h, 5, 9);
  ASSERT_TRUE(middle.ok());
  EXPECT_EQ(middle->offset, 5u * 65536);
  EXPECT_EQ(middle->length, 4u * 65536);
  EXPECT_EQ(LayerRange(h, 3, 3).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(LayerRange(h, 31, 33).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvtier

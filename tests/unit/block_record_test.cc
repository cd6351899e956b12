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
  for (uint32_t i = 0; i < h.layer_count; ++i) h.layer_checksums.push_back(0x1000 + i * 0x9e3779b97f4a7c15ULL);
  return h;
}

TEST(BlockRecord, HeaderRoundTrips) {
  std::vector<std::byte> bytes(kRecordHeaderBytes, std::byte{0xee});
  EncodeRecordHeader(SampleHeader(), bytes);
  auto decoded = DecodeRecordHeader(bytes);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(*decoded, SampleHeader());
  for (size_t i = 96 + 8 * 32; i < bytes.size(); ++i) ASSERT_EQ(bytes[i], std::byte{0}) << "padding at " << i;
}

TEST(BlockRecord, MagicIsTheAsciiTagOnDisk) {
  std::vector<std::byte> bytes(kRecordHeaderBytes);
  EncodeRecordHeader(SampleHeader(), bytes);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(bytes.data()), 8), "KVTBLK01");
}

TEST(BlockRecord, AnyFlippedHeaderByteIsCorruption) {
  std::vector<std::byte> good(kRecordHeaderBytes);
  EncodeRecordHeader(SampleHeader(), good);
  for (size_t i = 0; i < kRecordHeaderBytes; ++i) {  // fields, layer checksums and padding
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

TEST(BlockRecord, LayerChecksumsVerifyARangeAndCatchADamagedLayer) {
  RecordHeader h;
  h.layer_count = 8;
  h.layer_bytes = 1000;
  h.payload_bytes = 8000;
  std::vector<std::byte> payload(8000);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<std::byte>(i * 7 + 3);
  ChecksumPayload(payload, h);
  ASSERT_EQ(h.layer_checksums.size(), 8u);
  std::vector<std::byte> encoded(kRecordHeaderBytes);
  EncodeRecordHeader(h, encoded);
  auto decoded = DecodeRecordHeader(encoded);
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(*decoded, h);

  EXPECT_TRUE(VerifyLayers(h, 0, 8, payload).ok());
  EXPECT_TRUE(VerifyLayers(h, 2, 5, std::span(payload).subspan(2000, 3000)).ok());
  auto damaged = payload;
  damaged[3500] ^= std::byte{1};  // inside layer 3
  EXPECT_EQ(VerifyLayers(h, 0, 8, damaged).code(), StatusCode::kCorruption);
  EXPECT_EQ(VerifyLayers(h, 2, 5, std::span(damaged).subspan(2000, 3000)).code(), StatusCode::kCorruption);
  EXPECT_TRUE(VerifyLayers(h, 4, 8, std::span(damaged).subspan(4000, 4000)).ok()) << "layer 3 is not read";
  EXPECT_EQ(VerifyLayers(h, 1, 2, std::span(payload).subspan(2000, 1000)).code(), StatusCode::kCorruption)
      << "bytes of another layer";
}

TEST(BlockRecord, TooManyLayersForPerLayerChecksumsNeedWholeReads) {
  RecordHeader h;
  h.layer_count = kMaxLayerChecksums + 1;
  h.layer_bytes = 8;
  h.payload_bytes = 8ull * h.layer_count;
  std::vector<std::byte> payload(h.payload_bytes, std::byte{9});
  ChecksumPayload(payload, h);
  EXPECT_TRUE(h.layer_checksums.empty());
  std::vector<std::byte> encoded(kRecordHeaderBytes);
  EncodeRecordHeader(h, encoded);
  ASSERT_TRUE(DecodeRecordHeader(encoded).ok());
  EXPECT_TRUE(VerifyLayers(h, 0, h.layer_count, payload).ok());
  EXPECT_EQ(VerifyLayers(h, 0, 1, std::span(payload).first(8)).code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace kvtier

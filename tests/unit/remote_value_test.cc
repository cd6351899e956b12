// The remote tier's value format (tiers/remote/remote_value.h): a value
// reads back only as what it is; anything else (cut, flipped, another
// key's or namespace's, another format) is an error the tier turns into a
// miss, never bytes.
#include "tiers/remote/remote_value.h"

#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <vector>

#include "common/checksum.h"

namespace kvtier {
namespace {

const NamespaceFingerprint kNs{0x1234, 0x5678};
const BlockKey kKey{0xabc, 0xdef};

std::vector<std::byte> Payload(size_t n) {
  std::vector<std::byte> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<std::byte>((i * 131 + 7) & 0xff);
  return p;
}

std::span<const std::byte> Bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

TEST(RemoteValueTest, RoundTripsPayloadAndLayers) {
  const auto payload = Payload(4 * 1024);
  const std::string value = EncodeRemoteValue(RemoteBlock{kNs, kKey, 4, 0}, payload);
  ASSERT_EQ(value.size(), kRemoteHeaderBytes + payload.size());
  uint32_t layers = 0;
  auto decoded = DecodeRemoteValue(Bytes(value), kNs, kKey, &layers);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  ASSERT_EQ(decoded->size(), payload.size());
  EXPECT_EQ(std::memcmp(decoded->data(), payload.data(), payload.size()), 0);
  EXPECT_EQ(layers, 4u);
}

TEST(RemoteValueTest, TheHeaderAloneMatchesTheWholeValue) {
  const auto payload = Payload(1000);
  std::array<std::byte, kRemoteHeaderBytes> header{};
  EncodeRemoteHeader(RemoteBlock{kNs, kKey, 2, BlockChecksum(payload)}, payload.size(), header);
  const std::string whole = EncodeRemoteValue(RemoteBlock{kNs, kKey, 2, 0}, payload);
  EXPECT_EQ(std::memcmp(header.data(), whole.data(), kRemoteHeaderBytes), 0)
      << "a header sent before a payload that is not copied must be the same bytes";
}

TEST(RemoteValueTest, EveryFlippedByteIsCorruptionOrForeign) {
  const auto payload = Payload(256);
  const std::string value = EncodeRemoteValue(RemoteBlock{kNs, kKey, 1, 0}, payload);
  for (size_t i = 0; i < value.size(); ++i) {
    std::string bad = value;
    bad[i] = static_cast<char>(bad[i] ^ 0x20);
    auto decoded = DecodeRemoteValue(Bytes(bad), kNs, kKey);
    ASSERT_FALSE(decoded.ok()) << "byte " << i << " flipped and the value still decoded";
    EXPECT_EQ(decoded.status().code(), StatusCode::kCorruption) << "byte " << i << ": " << decoded.status().ToString();
  }
}

TEST(RemoteValueTest, TruncatedAndOverlongValuesAreCorruption) {
  const auto payload = Payload(512);
  const std::string value = EncodeRemoteValue(RemoteBlock{kNs, kKey, 1, 0}, payload);
  for (size_t cut : {size_t{0}, size_t{10}, kRemoteHeaderBytes - 1, kRemoteHeaderBytes, value.size() - 1}) {
    auto decoded = DecodeRemoteValue(Bytes(value.substr(0, cut)), kNs, kKey);
    EXPECT_EQ(decoded.status().code(), StatusCode::kCorruption) << "cut at " << cut;
  }
  auto longer = DecodeRemoteValue(Bytes(value + "x"), kNs, kKey);
  EXPECT_EQ(longer.status().code(), StatusCode::kCorruption);
}

TEST(RemoteValueTest, AnotherKeysOrNamespacesValueIsForeign) {
  const std::string value = EncodeRemoteValue(RemoteBlock{kNs, kKey, 1, 0}, Payload(64));
  EXPECT_EQ(DecodeRemoteValue(Bytes(value), kNs, BlockKey{0xabc, 0xdee}).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(DecodeRemoteValue(Bytes(value), NamespaceFingerprint{0x1234, 0x5679}, kKey).status().code(),
            StatusCode::kFailedPrecondition);
}

TEST(RemoteValueTest, ForeignBytesAndUnevenLayersAreCorruption) {
  EXPECT_EQ(DecodeRemoteValue(Bytes(std::string(200, 'x')), kNs, kKey).status().code(), StatusCode::kCorruption);
  const std::string uneven = EncodeRemoteValue(RemoteBlock{kNs, kKey, 3, 0}, Payload(100));
  EXPECT_EQ(DecodeRemoteValue(Bytes(uneven), kNs, kKey).status().code(), StatusCode::kCorruption);
}

TEST(RemoteValueTest, KeyNamesSpreadOverSlotsAndNameTheBlock) {
  const std::string name = RemoteKeyName(kNs, kKey);
  EXPECT_EQ(name, "kvtier:v1:" + kNs.ToHex() + ":" + kKey.ToHex());
  EXPECT_EQ(name.find('{'), std::string::npos) << "no hash tag: every block has its own slot";
}

// DecodeRemoteHeader: what a probe reads (the first kRemoteHeaderBytes of
// a value) before any payload moves.
TEST(RemoteValueTest, DecodeRemoteHeaderReportsLayersBytesAndChecksum) {
  const auto payload = Payload(3 * 1024);
  const std::string value = EncodeRemoteValue(RemoteBlock{kNs, kKey, 3, 0}, payload);
  // The header alone, and the whole value: the payload is not looked at.
  for (size_t size : {kRemoteHeaderBytes, value.size()}) {
    auto header = DecodeRemoteHeader(Bytes(value.substr(0, size)), kNs, kKey);
    ASSERT_TRUE(header.ok()) << header.status().ToString();
    EXPECT_EQ(header->layer_count, 3u);
    EXPECT_EQ(header->payload_bytes, payload.size());
    EXPECT_EQ(header->payload_checksum, BlockChecksum(payload));
  }
  std::string bad_payload = value;
  bad_payload.back() = static_cast<char>(bad_payload.back() ^ 1);
  EXPECT_TRUE(DecodeRemoteHeader(Bytes(bad_payload), kNs, kKey).ok()) << "the payload is the read's to check";
}

TEST(RemoteValueTest, DecodeRemoteHeaderRefusesFlippedForeignAndShortHeaders) {
  const std::string value = EncodeRemoteValue(RemoteBlock{kNs, kKey, 2, 0}, Payload(512));
  const std::string header = value.substr(0, kRemoteHeaderBytes);
  for (size_t i = 0; i < header.size(); ++i) {
    std::string bad = header;
    bad[i] = static_cast<char>(bad[i] ^ 0x01);
    auto decoded = DecodeRemoteHeader(Bytes(bad), kNs, kKey);
    ASSERT_FALSE(decoded.ok()) << "byte " << i << " flipped and the header still decoded";
    EXPECT_EQ(decoded.status().code(), StatusCode::kCorruption) << "byte " << i << ": " << decoded.status().ToString();
  }
  EXPECT_EQ(DecodeRemoteHeader(Bytes(header), kNs, BlockKey{0xabc, 0xdee}).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(DecodeRemoteHeader(Bytes(header), NamespaceFingerprint{0x1235, 0x5678}, kKey).status().code(),
            StatusCode::kFailedPrecondition);
  // Cut views of the whole header: the bytes past the cut are there, and
  // must not be looked at.
  for (size_t cut : {size_t{0}, size_t{8}, size_t{64}, kRemoteHeaderBytes - 1}) {
    EXPECT_EQ(DecodeRemoteHeader(Bytes(header).first(cut), kNs, kKey).status().code(), StatusCode::kCorruption)
        << "cut at " << cut;
  }
}

}  // namespace
}  // namespace kvtier

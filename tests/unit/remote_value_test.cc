// The remote tier's value format (tiers/remote/remote_value.h): a value
// reads back only as what it is; anything else (cut, flipped, another
// key's or namespace's, another format, a forgery with valid checksums,
// another cluster secret) is an error the tier turns into a miss, never
// bytes.
#include "tiers/remote/remote_value.h"

#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <vector>

#include "common/checksum.h"
#include "common/little_endian.h"

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

std::unique_ptr<ValueMac> MacOf(char fill) {
  auto mac = ValueMac::Create(std::string(kClusterSecretBytes, fill));
  EXPECT_TRUE(mac.ok()) << mac.status().ToString();
  return std::move(*mac);
}

const ValueMac& TheMac() {
  static const std::unique_ptr<ValueMac> mac = MacOf('s');
  return *mac;
}

std::string Encode(const RemoteBlock& block, std::span<const std::byte> payload) {
  return EncodeRemoteValue(TheMac(), block, payload);
}

Result<std::span<const std::byte>> Decode(const std::string& value, const NamespaceFingerprint& ns, const BlockKey& key,
                                          uint32_t* layers = nullptr) {
  return DecodeRemoteValue(TheMac(), Bytes(value), ns, key, layers);
}

TEST(RemoteValueTest, RoundTripsPayloadAndLayers) {
  const auto payload = Payload(4 * 1024);
  const std::string value = Encode(RemoteBlock{kNs, kKey, 4, 0}, payload);
  ASSERT_EQ(value.size(), kRemoteHeaderBytes + payload.size());
  uint32_t layers = 0;
  auto decoded = Decode(value, kNs, kKey, &layers);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  ASSERT_EQ(decoded->size(), payload.size());
  EXPECT_EQ(std::memcmp(decoded->data(), payload.data(), payload.size()), 0);
  EXPECT_EQ(layers, 4u);
}

TEST(RemoteValueTest, TheHeaderAloneMatchesTheWholeValue) {
  const auto payload = Payload(1000);
  std::array<std::byte, kRemoteHeaderBytes> header{};
  EncodeRemoteHeader(TheMac(), RemoteBlock{kNs, kKey, 2, BlockChecksum(payload)}, payload, header);
  const std::string whole = Encode(RemoteBlock{kNs, kKey, 2, 0}, payload);
  // The same fields (the tags differ: each carries its own nonce), and the
  // header sent before a payload that is not copied makes a whole value.
  EXPECT_EQ(std::memcmp(header.data(), whole.data(), kRemoteMacOffset), 0)
      << "a header sent before a payload that is not copied must name the same block";
  std::string joined(reinterpret_cast<const char*>(header.data()), header.size());
  joined += whole.substr(kRemoteHeaderBytes);
  EXPECT_TRUE(Decode(joined, kNs, kKey).ok());
}

TEST(RemoteValueTest, EveryFlippedByteIsCorruptionOrUnauthenticated) {
  const auto payload = Payload(256);
  const std::string value = Encode(RemoteBlock{kNs, kKey, 1, 0}, payload);
  for (size_t i = 0; i < value.size(); ++i) {
    std::string bad = value;
    bad[i] = static_cast<char>(bad[i] ^ 0x20);
    auto decoded = Decode(bad, kNs, kKey);
    ASSERT_FALSE(decoded.ok()) << "byte " << i << " flipped and the value still decoded";
    // The header's xxh3 catches a flip in the header; the MAC one in the payload.
    const StatusCode expected = i < kRemoteHeaderBytes ? StatusCode::kCorruption : StatusCode::kPermissionDenied;
    EXPECT_EQ(decoded.status().code(), expected) << "byte " << i << ": " << decoded.status().ToString();
  }
}

TEST(RemoteValueTest, TruncatedAndOverlongValuesAreCorruption) {
  const auto payload = Payload(512);
  const std::string value = Encode(RemoteBlock{kNs, kKey, 1, 0}, payload);
  for (size_t cut : {size_t{0}, size_t{10}, kRemoteHeaderBytes - 1, kRemoteHeaderBytes, value.size() - 1}) {
    auto decoded = Decode(value.substr(0, cut), kNs, kKey);
    EXPECT_EQ(decoded.status().code(), StatusCode::kCorruption) << "cut at " << cut;
  }
  auto longer = Decode(value + "x", kNs, kKey);
  EXPECT_EQ(longer.status().code(), StatusCode::kCorruption);
}

TEST(RemoteValueTest, AnotherKeysOrNamespacesValueIsForeign) {
  const std::string value = Encode(RemoteBlock{kNs, kKey, 1, 0}, Payload(64));
  EXPECT_EQ(Decode(value, kNs, BlockKey{0xabc, 0xdee}).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(Decode(value, NamespaceFingerprint{0x1234, 0x5679}, kKey).status().code(), StatusCode::kFailedPrecondition);
}

TEST(RemoteValueTest, ForeignBytesAndUnevenLayersAreCorruption) {
  EXPECT_EQ(Decode(std::string(200, 'x'), kNs, kKey).status().code(), StatusCode::kCorruption);
  const std::string uneven = Encode(RemoteBlock{kNs, kKey, 3, 0}, Payload(100));
  EXPECT_EQ(Decode(uneven, kNs, kKey).status().code(), StatusCode::kCorruption);
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
  const std::string value = Encode(RemoteBlock{kNs, kKey, 3, 0}, payload);
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
  const std::string value = Encode(RemoteBlock{kNs, kKey, 2, 0}, Payload(512));
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

// What an attacker who can write to the store does: change a value, then
// recompute every checksum the format has (they have no secret): the
// header's xxh3 (ResealHeader), and the payload's too (Reseal).
std::string ResealHeader(std::string value) {
  auto* h = reinterpret_cast<std::byte*>(value.data());
  StoreLe64(h + 96, BlockChecksum(std::span<const std::byte>(h, 96)));
  return value;
}

std::string Reseal(std::string value) {
  StoreLe64(reinterpret_cast<std::byte*>(value.data()) + 56, BlockChecksum(Bytes(value).subspan(kRemoteHeaderBytes)));
  return ResealHeader(std::move(value));
}

TEST(RemoteValueAuthTest, AForgedPayloadWithValidChecksumsDoesNotAuthenticate) {
  const std::string value = Encode(RemoteBlock{kNs, kKey, 2, 0}, Payload(4096));
  for (size_t at : {kRemoteHeaderBytes, kRemoteHeaderBytes + 2047, value.size() - 1}) {
    std::string forged = value;
    forged[at] = static_cast<char>(forged[at] ^ 0x5a);
    forged = Reseal(forged);
    ASSERT_TRUE(DecodeRemoteHeader(Bytes(forged), kNs, kKey).ok()) << "the forgery's checksums are valid";
    EXPECT_EQ(Decode(forged, kNs, kKey).status().code(), StatusCode::kPermissionDenied) << "payload byte " << at;
  }
}

TEST(RemoteValueAuthTest, EveryHeaderFieldIsCoveredByTheMac) {
  const std::string value = Encode(RemoteBlock{kNs, kKey, 2, 0}, Payload(4096));
  // Each byte of [8, 64) (version to payload checksum) changed, the
  // checksums recomputed: never accepted. (The magic is a constant.)
  for (size_t i = 8; i < kRemoteMacOffset; ++i) {
    std::string forged = value;
    forged[i] = static_cast<char>(forged[i] ^ 0x01);
    forged = i < 56 ? Reseal(forged) : ResealHeader(forged);  // [56, 64) is the payload's xxh3 itself
    EXPECT_FALSE(Decode(forged, kNs, kKey).ok()) << "header byte " << i << " changed and still accepted";
  }
}

TEST(RemoteValueAuthTest, AValueMovedToAnotherKeyOrNamespaceFails) {
  const auto payload = Payload(1024);
  const std::string value = Encode(RemoteBlock{kNs, kKey, 1, 0}, payload);
  const BlockKey other_key{0xabc, 0xdee};
  const NamespaceFingerprint other_ns{0x1234, 0x5679};
  // Copied as is under another name: it names its own key.
  EXPECT_FALSE(Decode(value, kNs, other_key).ok());
  EXPECT_FALSE(Decode(value, other_ns, kKey).ok());
  // Its header rewritten to name the other key (checksums recomputed): the MAC fails.
  std::string moved = value;
  auto* h = reinterpret_cast<std::byte*>(moved.data());
  StoreLe64(h + 40, other_key.lo);
  moved = Reseal(moved);
  EXPECT_EQ(Decode(moved, kNs, other_key).status().code(), StatusCode::kPermissionDenied);
  std::string other_namespace = value;
  h = reinterpret_cast<std::byte*>(other_namespace.data());
  StoreLe64(h + 24, other_ns.lo);
  other_namespace = Reseal(other_namespace);
  EXPECT_EQ(Decode(other_namespace, other_ns, kKey).status().code(), StatusCode::kPermissionDenied);
}

TEST(RemoteValueAuthTest, EveryValueGetsAFreshTagAndEachVerifies) {
  // Poly1305 needs a key per message: the tag's nonce makes one per value,
  // so the same bytes written twice carry two different tags.
  const auto payload = Payload(4096);
  const std::string a = Encode(RemoteBlock{kNs, kKey, 1, 0}, payload);
  const std::string b = Encode(RemoteBlock{kNs, kKey, 1, 0}, payload);
  EXPECT_NE(a.substr(kRemoteMacOffset, kValueMacBytes), b.substr(kRemoteMacOffset, kValueMacBytes));
  EXPECT_TRUE(Decode(a, kNs, kKey).ok());
  EXPECT_TRUE(Decode(b, kNs, kKey).ok());
  // One value's tag on the other's bytes still verifies (same bytes), but
  // a tag never verifies other bytes: swap payload bytes under a's tag.
  std::string c = a;
  c[kRemoteHeaderBytes] = static_cast<char>(c[kRemoteHeaderBytes] ^ 1);
  EXPECT_FALSE(Decode(c, kNs, kKey).ok());
}

TEST(RemoteValueAuthTest, AnotherClusterSecretDoesNotAuthenticate) {
  const auto payload = Payload(1024);
  const std::string value = Encode(RemoteBlock{kNs, kKey, 1, 0}, payload);
  auto other = MacOf('t');
  EXPECT_EQ(DecodeRemoteValue(*other, Bytes(value), kNs, kKey).status().code(), StatusCode::kPermissionDenied);
  EXPECT_TRUE(DecodeRemoteValue(*MacOf('s'), Bytes(value), kNs, kKey).ok()) << "the same secret, another instance";
}

TEST(RemoteValueAuthTest, AVersionOneValueIsUnauthenticated) {
  // The format before MACs: a 72-byte header, version 1, xxh3 of [0, 64) at 64.
  const auto payload = Payload(512);
  std::string old(72 + payload.size(), '\0');
  auto* h = reinterpret_cast<std::byte*>(old.data());
  std::memcpy(h, "KVTREM01", 8);
  StoreLe32(h + 8, 1);
  StoreLe32(h + 12, 1);
  StoreLe64(h + 16, kNs.hi);
  StoreLe64(h + 24, kNs.lo);
  StoreLe64(h + 32, kKey.hi);
  StoreLe64(h + 40, kKey.lo);
  StoreLe64(h + 48, payload.size());
  StoreLe64(h + 56, BlockChecksum(payload));
  StoreLe64(h + 64, BlockChecksum(std::span<const std::byte>(h, 64)));
  std::memcpy(h + 72, payload.data(), payload.size());
  EXPECT_EQ(DecodeRemoteHeader(Bytes(old), kNs, kKey).status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(Decode(old, kNs, kKey).status().code(), StatusCode::kPermissionDenied);
}

TEST(RemoteValueAuthTest, TheClusterSecretMustBe32Bytes) {
  for (size_t n : {size_t{0}, size_t{16}, size_t{31}, size_t{33}}) {
    auto mac = ValueMac::Create(std::string(n, 'k'));
    EXPECT_EQ(mac.status().code(), StatusCode::kInvalidArgument) << n << " bytes";
  }
}

}  // namespace
}  // namespace kvtier

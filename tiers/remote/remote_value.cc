#include "tiers/remote/remote_value.h"

#include <cstring>

#include "common/checksum.h"
#include "common/little_endian.h"

namespace kvtier {
namespace {

constexpr char kMagicBytes[8] = {'K', 'V', 'T', 'R', 'E', 'M', '0', '1'};
constexpr uint32_t kUnauthenticatedVersion = 1;
constexpr size_t kHeaderChecksumOffset = kRemoteMacOffset + kValueMacBytes;  // 96

}  // namespace

std::string RemoteKeyName(const NamespaceFingerprint& ns, const BlockKey& key) {
  return "kvtier:v1:" + ns.ToHex() + ":" + key.ToHex();
}

void EncodeRemoteHeader(const ValueMac& mac, const RemoteBlock& block, std::span<const std::byte> payload,
                        std::span<std::byte, kRemoteHeaderBytes> out) {
  std::byte* h = out.data();
  std::memcpy(h, kMagicBytes, 8);
  StoreLe32(h + 8, kRemoteFormatVersion);
  StoreLe32(h + 12, block.layer_count);
  StoreLe64(h + 16, block.ns.hi);
  StoreLe64(h + 24, block.ns.lo);
  StoreLe64(h + 32, block.key.hi);
  StoreLe64(h + 40, block.key.lo);
  StoreLe64(h + 48, payload.size());
  StoreLe64(h + 56, block.payload_checksum);
  const ValueMacTag tag = mac.Compute(std::span<const std::byte>(h, kRemoteMacOffset), payload);
  std::memcpy(h + kRemoteMacOffset, tag.data(), tag.size());
  StoreLe64(h + kHeaderChecksumOffset, BlockChecksum(std::span<const std::byte>(h, kHeaderChecksumOffset)));
}

std::string EncodeRemoteValue(const ValueMac& mac, const RemoteBlock& block, std::span<const std::byte> payload) {
  std::string value(kRemoteHeaderBytes + payload.size(), '\0');
  auto* bytes = reinterpret_cast<std::byte*>(value.data());
  RemoteBlock checked = block;
  checked.payload_checksum = CopyWithChecksum(std::span(bytes + kRemoteHeaderBytes, payload.size()), payload);
  EncodeRemoteHeader(mac, checked, std::span<const std::byte>(bytes + kRemoteHeaderBytes, payload.size()),
                     std::span<std::byte, kRemoteHeaderBytes>(bytes, kRemoteHeaderBytes));
  return value;
}

Result<RemoteHeader> DecodeRemoteHeader(std::span<const std::byte> header, const NamespaceFingerprint& ns,
                                        const BlockKey& key) {
  if (header.size() < 12) {
    return Corruption("remote value of " + std::to_string(header.size()) + " bytes is shorter than its header");
  }
  const std::byte* h = header.data();
  if (std::memcmp(h, kMagicBytes, 8) != 0) return Corruption("remote value is not a kvtier block (magic)");
  const uint32_t version = LoadLe32(h + 8);
  if (version == kUnauthenticatedVersion) {
    return PermissionDenied("remote value has format version 1, which carries no MAC: not trusted");
  }
  if (version != kRemoteFormatVersion) return Corruption("remote value has format version " + std::to_string(version));
  if (header.size() < kRemoteHeaderBytes) {
    return Corruption("remote value of " + std::to_string(header.size()) + " bytes is shorter than its header");
  }
  if (LoadLe64(h + kHeaderChecksumOffset) != BlockChecksum(header.first(kHeaderChecksumOffset))) {
    return Corruption("remote value header fails its checksum");
  }
  const NamespaceFingerprint stored_ns{LoadLe64(h + 16), LoadLe64(h + 24)};
  const BlockKey stored_key{LoadLe64(h + 32), LoadLe64(h + 40)};
  if (stored_ns != ns || stored_key != key) {
    return FailedPrecondition("remote value belongs to " + stored_ns.ToHex() + "/" + stored_key.ToHex());
  }
  RemoteHeader out;
  out.layer_count = LoadLe32(h + 12);
  out.payload_bytes = LoadLe64(h + 48);
  out.payload_checksum = LoadLe64(h + 56);
  if (out.layer_count == 0 || out.payload_bytes % out.layer_count != 0) {
    return Corruption("remote value has " + std::to_string(out.layer_count) + " layers over " +
                      std::to_string(out.payload_bytes) + " bytes");
  }
  return out;
}

Status VerifyRemotePayload(const ValueMac& mac, std::span<const std::byte> header, std::span<const std::byte> payload) {
  const std::span<const std::byte, kValueMacBytes> tag(header.data() + kRemoteMacOffset, kValueMacBytes);
  if (!mac.Verify(header.first(kRemoteMacOffset), payload, tag)) {
    return PermissionDenied("remote value does not authenticate under the cluster secret");
  }
  if (BlockChecksum(payload) != LoadLe64(header.data() + 56)) {
    return Corruption("remote value payload fails its checksum");
  }
  return Status::Ok();
}

Result<std::span<const std::byte>> DecodeRemoteValue(const ValueMac& mac, std::span<const std::byte> value,
                                                     const NamespaceFingerprint& ns, const BlockKey& key,
                                                     uint32_t* layer_count) {
  Result<RemoteHeader> header = DecodeRemoteHeader(value, ns, key);
  if (!header.ok()) return header.status();
  if (header->payload_bytes != value.size() - kRemoteHeaderBytes) {
    return Corruption("remote value holds " + std::to_string(value.size() - kRemoteHeaderBytes) +
                      " payload bytes, its header says " + std::to_string(header->payload_bytes));
  }
  const std::span<const std::byte> payload = value.subspan(kRemoteHeaderBytes);
  if (Status verified = VerifyRemotePayload(mac, value.first(kRemoteHeaderBytes), payload); !verified.ok()) {
    return verified;
  }
  if (layer_count != nullptr) *layer_count = header->layer_count;
  return payload;
}

}  // namespace kvtier

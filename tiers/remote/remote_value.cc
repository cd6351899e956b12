#include "tiers/remote/remote_value.h"

#include <cstring>

#include "common/checksum.h"
#include "common/little_endian.h"

namespace kvtier {
namespace {

constexpr char kMagicBytes[8] = {'K', 'V', 'T', 'R', 'E', 'M', '0', '1'};

}  // namespace

std::string RemoteKeyName(const NamespaceFingerprint& ns, const BlockKey& key) {
  return "kvtier:v1:" + ns.ToHex() + ":" + key.ToHex();
}

void EncodeRemoteHeader(const RemoteBlock& block, uint64_t payload_bytes,
                        std::span<std::byte, kRemoteHeaderBytes> out) {
  std::byte* h = out.data();
  std::memcpy(h, kMagicBytes, 8);
  StoreLe32(h + 8, kRemoteFormatVersion);
  StoreLe32(h + 12, block.layer_count);
  StoreLe64(h + 16, block.ns.hi);
  StoreLe64(h + 24, block.ns.lo);
  StoreLe64(h + 32, block.key.hi);
  StoreLe64(h + 40, block.key.lo);
  StoreLe64(h + 48, payload_bytes);
  StoreLe64(h + 56, block.payload_checksum);
  StoreLe64(h + 64, BlockChecksum(std::span<const std::byte>(h, 64)));
}

std::string EncodeRemoteValue(const RemoteBlock& block, std::span<const std::byte> payload) {
  std::string value(kRemoteHeaderBytes + payload.size(), '\0');
  auto* bytes = reinterpret_cast<std::byte*>(value.data());
  RemoteBlock checked = block;
  checked.payload_checksum = BlockChecksum(payload);
  EncodeRemoteHeader(checked, payload.size(), std::span<std::byte, kRemoteHeaderBytes>(bytes, kRemoteHeaderBytes));
  if (!payload.empty()) std::memcpy(bytes + kRemoteHeaderBytes, payload.data(), payload.size());
  return value;
}

Result<RemoteHeader> DecodeRemoteHeader(std::span<const std::byte> header, const NamespaceFingerprint& ns,
                                        const BlockKey& key) {
  if (header.size() < kRemoteHeaderBytes) {
    return Corruption("remote value of " + std::to_string(header.size()) + " bytes is shorter than its header");
  }
  const std::byte* h = header.data();
  if (std::memcmp(h, kMagicBytes, 8) != 0) return Corruption("remote value is not a kvtier block (magic)");
  if (LoadLe64(h + 64) != BlockChecksum(header.first(64))) return Corruption("remote value header fails its checksum");
  if (LoadLe32(h + 8) != kRemoteFormatVersion) {
    return Corruption("remote value has format version " + std::to_string(LoadLe32(h + 8)));
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

Result<std::span<const std::byte>> DecodeRemoteValue(std::span<const std::byte> value, const NamespaceFingerprint& ns,
                                                     const BlockKey& key, uint32_t* layer_count) {
  Result<RemoteHeader> header = DecodeRemoteHeader(value, ns, key);
  if (!header.ok()) return header.status();
  if (header->payload_bytes != value.size() - kRemoteHeaderBytes) {
    return Corruption("remote value holds " + std::to_string(value.size() - kRemoteHeaderBytes) +
                      " payload bytes, its header says " + std::to_string(header->payload_bytes));
  }
  const std::span<const std::byte> payload = value.subspan(kRemoteHeaderBytes);
  if (BlockChecksum(payload) != header->payload_checksum) return Corruption("remote value payload fails its checksum");
  if (layer_count != nullptr) *layer_count = header->layer_count;
  return payload;
}

}  // namespace kvtier

#include "tiers/nvme/block_record.h"

#include <cstring>
#include <string>

#include "common/checksum.h"
#include "common/little_endian.h"

namespace kvtier {
namespace {

constexpr uint64_t kMagic = 0x31304b4c4254564bULL;  // "KVTBLK01" read as little-endian bytes
constexpr size_t kHeaderChecksumAt = 88;
constexpr size_t kLayerChecksumsAt = 96;

// xxh3-64 of the header with its own checksum field read as zero.
uint64_t HeaderChecksum(std::span<const std::byte> header) {
  std::byte copy[kRecordHeaderBytes];
  std::memcpy(copy, header.data(), kRecordHeaderBytes);
  std::memset(copy + kHeaderChecksumAt, 0, 8);
  return BlockChecksum(copy);
}

}  // namespace

void EncodeRecordHeader(const RecordHeader& h, std::span<std::byte> out) {
  std::memset(out.data(), 0, out.size());
  std::byte* p = out.data();
  StoreLe64(p + 0, kMagic);
  StoreLe32(p + 8, kRecordFormatVersion);
  StoreLe32(p + 12, kRecordHeaderBytes);
  StoreLe64(p + 16, h.ns.hi);
  StoreLe64(p + 24, h.ns.lo);
  StoreLe64(p + 32, h.key.hi);
  StoreLe64(p + 40, h.key.lo);
  StoreLe64(p + 48, h.payload_bytes);
  StoreLe32(p + 56, h.layer_count);
  StoreLe64(p + 64, h.layer_bytes);
  StoreLe64(p + 72, h.payload_checksum);
  StoreLe64(p + 80, h.region_generation);
  for (size_t i = 0; i < h.layer_checksums.size(); ++i) StoreLe64(p + kLayerChecksumsAt + 8 * i, h.layer_checksums[i]);
  StoreLe64(p + kHeaderChecksumAt, HeaderChecksum(out.first(kRecordHeaderBytes)));
}

Result<RecordHeader> DecodeRecordHeader(std::span<const std::byte> in) {
  if (in.size() < kRecordHeaderBytes) {
    return Corruption("record header needs " + std::to_string(kRecordHeaderBytes) + " bytes, got " +
                      std::to_string(in.size()));
  }
  const std::byte* p = in.data();
  if (LoadLe64(p) != kMagic) return Corruption("no record header here (bad magic)");
  if (LoadLe32(p + 8) != kRecordFormatVersion) {
    return Corruption("record format version " + std::to_string(LoadLe32(p + 8)) + " is not " +
                      std::to_string(kRecordFormatVersion));
  }
  if (LoadLe32(p + 12) != kRecordHeaderBytes) return Corruption("record header size field is wrong");
  if (LoadLe64(p + kHeaderChecksumAt) != HeaderChecksum(in.first(kRecordHeaderBytes))) {
    return Corruption("record header checksum mismatch (torn or overwritten)");
  }
  RecordHeader h;
  h.ns = BlockKey{LoadLe64(p + 16), LoadLe64(p + 24)};
  h.key = BlockKey{LoadLe64(p + 32), LoadLe64(p + 40)};
  h.payload_bytes = LoadLe64(p + 48);
  h.layer_count = LoadLe32(p + 56);
  h.layer_bytes = LoadLe64(p + 64);
  h.payload_checksum = LoadLe64(p + 72);
  h.region_generation = LoadLe64(p + 80);
  if (h.layer_count == 0 || h.layer_bytes == 0 || h.payload_bytes / h.layer_count != h.layer_bytes ||
      h.payload_bytes % h.layer_count != 0) {
    return Corruption("record layer geometry (" + std::to_string(h.layer_count) + " x " +
                      std::to_string(h.layer_bytes) + ") does not match its " + std::to_string(h.payload_bytes) +
                      " payload bytes");
  }
  if (h.layer_count <= kMaxLayerChecksums) {
    h.layer_checksums.resize(h.layer_count);
    for (uint32_t i = 0; i < h.layer_count; ++i) h.layer_checksums[i] = LoadLe64(p + kLayerChecksumsAt + 8 * i);
  }
  return h;
}

uint64_t RecordBytes(uint64_t payload_bytes, uint32_t alignment_bytes) {
  const uint64_t padded = (payload_bytes + alignment_bytes - 1) / alignment_bytes * alignment_bytes;
  return kRecordHeaderBytes + padded;
}

Result<ByteRange> LayerRange(const RecordHeader& header, uint32_t first, uint32_t last) {
  if (first >= last || last > header.layer_count) {
    return InvalidArgument("layer range [" + std::to_string(first) + ", " + std::to_string(last) +
                           ") is empty or past the block's " + std::to_string(header.layer_count) + " layers");
  }
  return ByteRange{first * header.layer_bytes, (last - first) * header.layer_bytes};
}

void ChecksumPayload(std::span<const std::byte> payload, RecordHeader& h) {
  h.payload_checksum = BlockChecksum(payload);
  h.layer_checksums.clear();
  if (h.layer_count > kMaxLayerChecksums) return;
  if (h.layer_count == 1) {  // the one layer is the payload: one pass
    h.layer_checksums.push_back(h.payload_checksum);
    return;
  }
  for (uint32_t i = 0; i < h.layer_count; ++i) {
    h.layer_checksums.push_back(BlockChecksum(payload.subspan(i * h.layer_bytes, h.layer_bytes)));
  }
}

Status VerifyLayers(const RecordHeader& h, uint32_t first, uint32_t last, std::span<const std::byte> layers) {
  if (first == 0 && last == h.layer_count) {
    if (BlockChecksum(layers) != h.payload_checksum) return Corruption("block payload checksum mismatch");
    return Status::Ok();
  }
  if (h.layer_checksums.empty()) {
    return FailedPrecondition("a block of " + std::to_string(h.layer_count) +
                              " layers has no per-layer checksums; read it whole");
  }
  for (uint32_t i = first; i < last; ++i) {
    const auto layer = layers.subspan((i - first) * h.layer_bytes, h.layer_bytes);
    if (BlockChecksum(layer) != h.layer_checksums[i]) {
      return Corruption("layer " + std::to_string(i) + " checksum mismatch");
    }
  }
  return Status::Ok();
}

}  // namespace kvtier

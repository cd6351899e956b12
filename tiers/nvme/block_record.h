// The on-device form of one block in the NVMe tier: a 4 KiB header, then the
// payload, padded to the device alignment. The header describes and checks
// itself, so a read can tell a valid record from stale bytes, a torn write
// or a record of another namespace without trusting the index.
//
// Header bytes (little-endian; the rest of the 4 KiB are zero):
//   0  u64 magic "KVTBLK01"        48 u64 payload_bytes
//   8  u32 format version (1)      56 u32 layer_count
//  12  u32 header bytes (4096)     60 u32 reserved (0)
//  16  u64 namespace fp hi         64 u64 layer_bytes
//  24  u64 namespace fp lo         72 u64 xxh3-64 of the payload
//  32  u64 key hi                  80 u64 region generation
//  40  u64 key lo                  88 u64 xxh3-64 of the 4 KiB header with
//                                         this field zeroed
//  96  u64 xxh3-64 of layer i, for each layer, when layer_count <=
//      kMaxLayerChecksums (else none)
// The payload is layer-major: layer i is bytes [i * layer_bytes,
// (i + 1) * layer_bytes), so a layer range is one contiguous sub-range, and
// the per-layer checksums let a read of a layer range verify just those
// layers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/result.h"

namespace kvtier {

inline constexpr uint32_t kRecordHeaderBytes = 4096;
inline constexpr uint32_t kRecordFormatVersion = 1;
inline constexpr uint32_t kMaxLayerChecksums = (kRecordHeaderBytes - 96) / 8;

struct RecordHeader {
  NamespaceFingerprint ns;
  BlockKey key;
  uint64_t payload_bytes = 0;
  uint32_t layer_count = 1;  // >= 1; payload_bytes == layer_count * layer_bytes
  uint64_t layer_bytes = 0;
  uint64_t payload_checksum = 0;   // xxh3-64 of the payload
  uint64_t region_generation = 0;  // of the region the record was written into
  // xxh3-64 of each layer; empty when layer_count > kMaxLayerChecksums.
  std::vector<uint64_t> layer_checksums;

  bool operator==(const RecordHeader&) const = default;
};

// Writes `header` into `out` (exactly kRecordHeaderBytes), checksummed.
// Preconditions: out.size() == kRecordHeaderBytes; layer_checksums has
// layer_count entries, or none when layer_count > kMaxLayerChecksums.
void EncodeRecordHeader(const RecordHeader& header, std::span<std::byte> out);

// Parses and checks a header: Corruption if `in` is shorter than the
// header, or the magic, version, header size, header checksum or layer
// geometry is wrong (stale bytes, a torn write, another format).
Result<RecordHeader> DecodeRecordHeader(std::span<const std::byte> in);

// Device bytes a record with `payload_bytes` occupies: the header plus the
// payload rounded up to `alignment_bytes`.
uint64_t RecordBytes(uint64_t payload_bytes, uint32_t alignment_bytes);

// The byte range of layers [first, last) inside the payload, or
// InvalidArgument if the range is empty or past layer_count.
struct ByteRange {
  uint64_t offset = 0;
  uint64_t length = 0;
};
Result<ByteRange> LayerRange(const RecordHeader& header, uint32_t first, uint32_t last);

// Fills header.payload_checksum and header.layer_checksums from `payload`
// (header.layer_count and layer_bytes must already describe it): always
// from the bytes themselves, so a record describes what it stores.
void ChecksumPayload(std::span<const std::byte> payload, RecordHeader& header);

// Ok if `layers` (the bytes of layers [first, last)) match the header's
// checksums: the per-layer ones, or the payload checksum when the range is
// the whole payload. Corruption on a mismatch; FailedPrecondition if the
// header has no per-layer checksums and the range is not the whole payload.
Status VerifyLayers(const RecordHeader& header, uint32_t first, uint32_t last, std::span<const std::byte> layers);

}  // namespace kvtier

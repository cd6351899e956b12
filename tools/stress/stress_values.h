// The values and keys of `kvtier stress` (stress.h): the bytes of block
// (namespace, key) are a function of the two alone, so every read is
// checked: a miss or byte-exact ("may miss, never wrong").
//
// A block is `layer_count` layers of `layer_bytes`, layer-major: the
// layout GetLayers, layer-wise loads and saves use. Each layer names what
// it is in a 48-byte header, then carries PRNG bytes seeded from
// (namespace, key, layer):
//
//   u64 magic "KVSTRESS" | u64 namespace tag | u64 key.hi | u64 key.lo |
//   u32 layer | u32 layer_count | u64 xxh3-64 of the layer's bytes after the header
//
// (little-endian). A read of layers [first, last) is compared with the
// bytes it must be; when they differ, the headers say how: another key's
// bytes, another namespace's, another layer's, a wrong length, or bytes
// that are nobody's.
//
// The key space: a few namespaces of different geometry, each with chains
// of blocks (ChainHasher keys of PRNG tokens), where chain c shares a
// prefix with chain c / 2, so prefix chains overlap as an engine's do.
//
// Thread-safe: const data, and the checks use thread-local scratch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/result.h"

namespace kvtier::tools {

inline constexpr uint64_t kStressMagic = 0x535345525453564bull;  // "KVSTRESS" in little-endian bytes
inline constexpr size_t kStressHeaderBytes = 48;

// What a block of one namespace looks like.
struct ValueShape {
  uint64_t ns_tag = 0;  // NamespaceTag of the namespace's fingerprint
  uint32_t layer_count = 1;
  uint64_t layer_bytes = 0;  // >= kStressHeaderBytes
  uint64_t block_bytes() const { return layer_bytes * layer_count; }
};

uint64_t NamespaceTag(const NamespaceFingerprint& fingerprint);

// Writes layers [first, last) of block `key` into `out`, which must be
// (last - first) * layer_bytes long. Precondition: first < last <= layer_count.
void FillLayers(const ValueShape& shape, const BlockKey& key, uint32_t first, uint32_t last, std::span<std::byte> out);
inline void FillBlock(const ValueShape& shape, const BlockKey& key, std::span<std::byte> out) {
  FillLayers(shape, key, 0, shape.layer_count, out);
}

// How a read differs from what it must be.
enum class Mismatch : uint8_t {
  kNone = 0,
  kLength,          // not (last - first) * layer_bytes bytes
  kOtherKey,        // a layer of another block (its header names it)
  kOtherNamespace,  // a layer of the same key in another namespace
  kOtherLayer,      // another layer of the right block (a layer range that does not match)
  kBytes,           // right header, wrong bytes; or bytes that are no block's at all
};
std::string_view MismatchName(Mismatch mismatch);

struct ValueCheck {
  Mismatch mismatch = Mismatch::kNone;
  std::string detail;  // empty when exact: which layer, offset, whose header
  bool ok() const { return mismatch == Mismatch::kNone; }
};

// Checks bytes a read returned for layers [first, last) of `key`.
ValueCheck CheckLayers(const ValueShape& shape, const BlockKey& key, uint32_t first, uint32_t last,
                       std::span<const std::byte> got);
inline ValueCheck CheckBlock(const ValueShape& shape, const BlockKey& key, std::span<const std::byte> got) {
  return CheckLayers(shape, key, 0, shape.layer_count, got);
}

// The namespaces a stress run may use (a fixed table of geometries, 64 KiB
// to 256 KiB blocks, 4 to 32 layers); at most kMaxStressNamespaces.
inline constexpr uint32_t kMaxStressNamespaces = 4;

struct StressNamespace {
  NamespaceDescriptor descriptor;
  ValueShape shape;
  std::vector<std::vector<BlockKey>> chains;  // chains[c][b]: block b of chain c, root first
  std::vector<BlockKey> keys;                 // every distinct key of the chains
};

struct KeySpaceOptions {
  uint64_t seed = 1;
  uint32_t namespaces = 3;
  uint32_t chains = 16;       // per namespace
  uint32_t chain_blocks = 8;  // blocks per chain
};

class KeySpace {
 public:
  // InvalidArgument for 0 or more than kMaxStressNamespaces namespaces, no
  // chains or no blocks.
  static Result<KeySpace> Build(const KeySpaceOptions& options);

  const std::vector<StressNamespace>& namespaces() const { return namespaces_; }
  std::vector<NamespaceDescriptor> Descriptors() const;
  size_t distinct_blocks() const;
  uint64_t distinct_bytes() const;

 private:
  std::vector<StressNamespace> namespaces_;
};

}  // namespace kvtier::tools

#include "tools/stress/stress_values.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <unordered_set>

#include "common/checksum.h"

namespace kvtier::tools {
namespace {

uint64_t SplitMix(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t Mix(uint64_t a, uint64_t b) {
  uint64_t state = a ^ (b * 0xff51afd7ed558ccdull);
  return SplitMix(state);
}

void StoreLe64(std::byte* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
void StoreLe32(std::byte* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
uint64_t LoadLe64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}
uint32_t LoadLe32(const std::byte* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

// One layer: header, then PRNG bytes seeded from (namespace, key, layer).
void FillLayer(const ValueShape& shape, const BlockKey& key, uint32_t layer, std::span<std::byte> out) {
  std::byte* payload = out.data() + kStressHeaderBytes;
  const size_t payload_bytes = out.size() - kStressHeaderBytes;
  uint64_t state = Mix(Mix(Mix(shape.ns_tag, key.hi), key.lo), layer);
  size_t i = 0;
  for (; i + 8 <= payload_bytes; i += 8) {
    const uint64_t r = SplitMix(state);
    std::memcpy(payload + i, &r, 8);
  }
  if (i < payload_bytes) {
    const uint64_t r = SplitMix(state);
    std::memcpy(payload + i, &r, payload_bytes - i);
  }
  std::byte* h = out.data();
  StoreLe64(h, kStressMagic);
  StoreLe64(h + 8, shape.ns_tag);
  StoreLe64(h + 16, key.hi);
  StoreLe64(h + 24, key.lo);
  StoreLe32(h + 32, layer);
  StoreLe32(h + 36, shape.layer_count);
  StoreLe64(h + 40, BlockChecksum(std::span<const std::byte>(payload, payload_bytes)));
}

std::string Hex64(uint64_t v) {
  char buf[20];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, v);
  return buf;
}

// `got` (layer `layer` as read) differs from `want`: says how.
ValueCheck Classify(const ValueShape& shape, const BlockKey& key, uint32_t layer, std::span<const std::byte> got,
                    std::span<const std::byte> want) {
  const std::byte* h = got.data();
  const std::string where = "layer " + std::to_string(layer) + ": ";
  if (LoadLe64(h) != kStressMagic) {
    return {Mismatch::kBytes, where + "no stress header (first 8 bytes " + Hex64(LoadLe64(h)) + ")"};
  }
  const BlockKey named{LoadLe64(h + 16), LoadLe64(h + 24)};
  const uint64_t tag = LoadLe64(h + 8);
  const uint32_t named_layer = LoadLe32(h + 32);
  if (named != key) {
    return {Mismatch::kOtherKey, where + "holds layer " + std::to_string(named_layer) + " of key " + named.ToHex() +
                                     " (namespace tag " + Hex64(tag) + ")"};
  }
  if (tag != shape.ns_tag) {
    return {Mismatch::kOtherNamespace, where + "holds the key's layer " + std::to_string(named_layer) +
                                           " of namespace tag " + Hex64(tag) + ", not " + Hex64(shape.ns_tag)};
  }
  if (named_layer != layer) {
    return {Mismatch::kOtherLayer, where + "holds layer " + std::to_string(named_layer) + " of the block"};
  }
  size_t at = 0;
  while (at < got.size() && got[at] == want[at]) ++at;
  const bool self_consistent = LoadLe64(h + 40) == BlockChecksum(got.subspan(kStressHeaderBytes));
  return {Mismatch::kBytes, where + "byte " + std::to_string(at) + " differs (got 0x" +
                                Hex64(static_cast<uint8_t>(got[at])).substr(14) + ", want 0x" +
                                Hex64(static_cast<uint8_t>(want[at])).substr(14) + "); the layer's own checksum " +
                                (self_consistent ? "matches it" : "does not match it")};
}

struct Geometry {
  const char* name;
  uint32_t block_tokens;
  uint32_t layers;
  uint64_t bytes_per_token_per_layer;
};
constexpr Geometry kGeometries[kMaxStressNamespaces] = {
    {"a", 16, 8, 512},   // 8 KiB layers, 64 KiB blocks
    {"b", 16, 4, 2048},  // 32 KiB layers, 128 KiB blocks
    {"c", 32, 16, 512},  // 16 KiB layers, 256 KiB blocks
    {"d", 16, 32, 128},  // 2 KiB layers, 64 KiB blocks
};

NamespaceDescriptor Descriptor(const Geometry& g) {
  NamespaceDescriptor d;
  d.model_id = std::string("kvtier-stress/") + g.name;
  d.model_revision = "v1";
  d.kv_dtype = "bf16";
  d.block_tokens = g.block_tokens;
  d.layer_count = g.layers;
  d.kv_layout = "layer_major_kv";
  d.bytes_per_token_per_layer = g.bytes_per_token_per_layer;
  return d;
}

// Blocks chain c shares with chain c / 2 (0, 1/4, 1/2 or 3/4 of a chain).
uint32_t SharedBlocks(uint32_t chain, uint32_t chain_blocks) {
  if (chain == 0) return 0;
  return chain_blocks * ((chain * 7) % 4) / 4;
}

}  // namespace

uint64_t NamespaceTag(const NamespaceFingerprint& fingerprint) { return fingerprint.hi ^ fingerprint.lo; }

void FillLayers(const ValueShape& shape, const BlockKey& key, uint32_t first, uint32_t last, std::span<std::byte> out) {
  for (uint32_t l = first; l < last; ++l) {
    FillLayer(shape, key, l, out.subspan(uint64_t{l - first} * shape.layer_bytes, shape.layer_bytes));
  }
}

std::string_view MismatchName(Mismatch mismatch) {
  switch (mismatch) {
    case Mismatch::kNone:
      return "exact";
    case Mismatch::kLength:
      return "wrong_length";
    case Mismatch::kOtherKey:
      return "other_key";
    case Mismatch::kOtherNamespace:
      return "other_namespace";
    case Mismatch::kOtherLayer:
      return "other_layer";
    case Mismatch::kBytes:
      return "wrong_bytes";
  }
  return "unknown";
}

ValueCheck CheckLayers(const ValueShape& shape, const BlockKey& key, uint32_t first, uint32_t last,
                       std::span<const std::byte> got) {
  if (first >= last || last > shape.layer_count) {
    return {Mismatch::kLength, "layer range [" + std::to_string(first) + ", " + std::to_string(last) +
                                   ") is not within the block's " + std::to_string(shape.layer_count) + " layers"};
  }
  const uint64_t want_bytes = uint64_t{last - first} * shape.layer_bytes;
  if (got.size() != want_bytes) {
    return {Mismatch::kLength, std::to_string(got.size()) + " bytes for layers [" + std::to_string(first) + ", " +
                                   std::to_string(last) + "), want " + std::to_string(want_bytes)};
  }
  thread_local std::vector<std::byte> want;
  want.resize(shape.layer_bytes);
  for (uint32_t l = first; l < last; ++l) {
    const auto part = got.subspan(uint64_t{l - first} * shape.layer_bytes, shape.layer_bytes);
    FillLayer(shape, key, l, want);
    if (std::memcmp(part.data(), want.data(), want.size()) != 0) return Classify(shape, key, l, part, want);
  }
  return {};
}

Result<KeySpace> KeySpace::Build(const KeySpaceOptions& o) {
  if (o.namespaces == 0 || o.namespaces > kMaxStressNamespaces) {
    return InvalidArgument("namespaces must be 1 to " + std::to_string(kMaxStressNamespaces));
  }
  if (o.chains == 0 || o.chain_blocks == 0) return InvalidArgument("chains and chain blocks must be positive");
  KeySpace space;
  for (uint32_t n = 0; n < o.namespaces; ++n) {
    StressNamespace ns;
    ns.descriptor = Descriptor(kGeometries[n]);
    auto hasher = ChainHasher::Create(ns.descriptor);
    if (!hasher.ok()) return hasher.status();
    ns.shape.ns_tag = NamespaceTag(hasher->fingerprint());
    ns.shape.layer_count = ns.descriptor.layer_count;
    ns.shape.layer_bytes = ns.descriptor.LayerBytes();
    const size_t chain_tokens = size_t{o.chain_blocks} * ns.descriptor.block_tokens;
    std::vector<std::vector<uint32_t>> tokens(o.chains);
    std::unordered_set<BlockKey> seen;
    for (uint32_t c = 0; c < o.chains; ++c) {
      const size_t shared = size_t{SharedBlocks(c, o.chain_blocks)} * ns.descriptor.block_tokens;
      uint64_t state = Mix(Mix(o.seed, n), c);
      tokens[c].resize(chain_tokens);
      for (size_t t = 0; t < chain_tokens; ++t) {
        tokens[c][t] = t < shared ? tokens[c / 2][t] : static_cast<uint32_t>(SplitMix(state) % 128000);
      }
      ns.chains.push_back(hasher->Keys(tokens[c]));
      for (const BlockKey& k : ns.chains.back()) {
        if (seen.insert(k).second) ns.keys.push_back(k);
      }
    }
    space.namespaces_.push_back(std::move(ns));
  }
  return space;
}

std::vector<NamespaceDescriptor> KeySpace::Descriptors() const {
  std::vector<NamespaceDescriptor> out;
  for (const auto& ns : namespaces_) out.push_back(ns.descriptor);
  return out;
}

size_t KeySpace::distinct_blocks() const {
  size_t n = 0;
  for (const auto& ns : namespaces_) n += ns.keys.size();
  return n;
}

uint64_t KeySpace::distinct_bytes() const {
  uint64_t n = 0;
  for (const auto& ns : namespaces_) n += ns.keys.size() * ns.shape.block_bytes();
  return n;
}

}  // namespace kvtier::tools

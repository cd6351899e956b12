// Block keys: prefix-chained XXH3-128 hashes scoped to a namespace.
// The canonical byte layout and test vectors are in docs/KEYS.md; any change
// here that alters a key is a protocol break. Standard library only.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "kvtier/result.h"

namespace kvtier {

// A 128-bit key. `hi`/`lo` are the high and low 64 bits of the XXH3-128 hash;
// the canonical 16-byte form is hi then lo, each big-endian (the order in
// which xxhsum -H2 prints it).
struct BlockKey {
  uint64_t hi = 0;
  uint64_t lo = 0;

  friend bool operator==(const BlockKey&, const BlockKey&) = default;
  friend auto operator<=>(const BlockKey&, const BlockKey&) = default;

  // 32 lower-case hex digits of the canonical form.
  std::string ToHex() const;
  // Parses ToHex() output; InvalidArgument on anything else.
  static Result<BlockKey> FromHex(std::string_view hex);
};

// The fingerprint of a namespace is a 128-bit hash like a block key; it is the
// "k[-1]" that block 0 chains from.
using NamespaceFingerprint = BlockKey;

// Everything that changes the bytes of a KV block. Two engines share cached
// blocks only if all fields are equal.
struct NamespaceDescriptor {
  std::string model_id;            // e.g. "meta-llama/Llama-3.1-8B-Instruct"
  std::string model_revision;      // e.g. a commit hash; required
  std::string adapter_id;          // empty: no adapter
  std::string adapter_revision;    // must be empty when adapter_id is empty
  std::string kv_dtype;            // e.g. "bf16", "fp8_e4m3"
  uint32_t block_tokens = 256;     // tokens per block, > 0
  uint32_t layer_count = 0;        // > 0
  std::string kv_layout;           // e.g. "layer_major_kv"
  uint64_t bytes_per_token_per_layer = 0;  // > 0 (K and V together)
  uint32_t tp_rank = 0;            // < tp_size
  uint32_t tp_size = 1;            // > 0

  // Ok, or InvalidArgument naming the first bad field.
  Status Validate() const;
  // Bytes of one whole block object payload: block_tokens * layer_count *
  // bytes_per_token_per_layer.
  uint64_t BlockBytes() const;
  // Bytes of one layer of one block: block_tokens * bytes_per_token_per_layer.
  uint64_t LayerBytes() const;
};

// The canonical bytes hashed into the fingerprint (docs/KEYS.md).
std::vector<uint8_t> CanonicalNamespaceBytes(const NamespaceDescriptor& ns);

// XXH3-128 of CanonicalNamespaceBytes(ns). Precondition: ns.Validate() ok.
NamespaceFingerprint FingerprintNamespace(const NamespaceDescriptor& ns);

// One chain link: XXH3-128(canonical(prev) || u32 LE position || tokens as
// u32 LE). `prev` is the fingerprint for position 0.
BlockKey ChainKey(const BlockKey& prev, uint32_t position,
                  std::span<const uint32_t> block_tokens);

// Computes the key chain of token sequences for one namespace.
// Thread-compatible: const methods may be called concurrently.
class ChainHasher {
 public:
  // InvalidArgument if the descriptor does not validate.
  static Result<ChainHasher> Create(const NamespaceDescriptor& ns);

  const NamespaceFingerprint& fingerprint() const { return fingerprint_; }
  uint32_t block_tokens() const { return block_tokens_; }

  // Keys of every full block of `tokens`; a partial trailing block gets none.
  std::vector<BlockKey> Keys(std::span<const uint32_t> tokens) const;

  // Extends `chain` (keys of the first chain.size() blocks of `tokens`) with
  // the keys of the remaining full blocks, without rehashing the prefix.
  void Extend(std::span<const uint32_t> tokens, std::vector<BlockKey>& chain) const;

 private:
  ChainHasher(NamespaceFingerprint fp, uint32_t block_tokens)
      : fingerprint_(fp), block_tokens_(block_tokens) {}

  NamespaceFingerprint fingerprint_;
  uint32_t block_tokens_;
};

}  // namespace kvtier

template <>
struct std::hash<kvtier::BlockKey> {
  // Keys are already uniform hashes: mix the halves, no rehash needed.
  size_t operator()(const kvtier::BlockKey& k) const noexcept {
    return static_cast<size_t>(k.lo ^ (k.hi * 0x9e3779b97f4a7c15ULL));
  }
};

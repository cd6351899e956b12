// Block keys: prefix-chained XXH3-128 hashes scoped to a namespace.
// The canonical byte layout and test vectors are in docs/KEYS.md; any change
// here that alters a key is a protocol break. Standard library only.
#pragma once

#include <cstddef>
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
// blocks only if all fields are equal. The canonical bytes (docs/KEYS.md)
// take the fields in this order.
struct NamespaceDescriptor {
  std::string model_id;                    // e.g. "meta-llama/Llama-3.1-8B-Instruct"
  std::string model_revision;              // e.g. a commit hash; required
  std::string adapter_id;                  // empty: no adapter
  std::string adapter_revision;            // must be empty when adapter_id is empty
  std::string kv_dtype;                    // e.g. "bf16", "fp8_e4m3"
  uint32_t block_tokens = 256;             // tokens per block, > 0
  uint32_t layer_count = 0;                // > 0
  std::string kv_layout;                   // e.g. "layer_major_kv"
  uint64_t bytes_per_token_per_layer = 0;  // > 0 (K and V together)
  uint32_t tp_rank = 0;                    // < tp_size
  uint32_t tp_size = 1;                    // > 0
  uint32_t pp_rank = 0;                    // pipeline-parallel rank, < pp_size
  uint32_t pp_size = 1;                    // > 0
  // The engine's KV data-format version: bump it when the bytes of a block
  // change for the same model (e.g. a new kernel layout). > 0.
  uint32_t kv_format_version = 1;
  // What the blocks of this namespace are: "kv" (attention KV), or
  // "recurrent_state" for a recurrent (Mamba-style) layer group's state at a
  // block boundary. 1 to 64 bytes of [a-z0-9_].
  std::string object_kind = "kv";

  // Ok, or InvalidArgument whose message starts with the first bad field:
  // every string must be valid UTF-8 and within its byte limit below
  // (kMaxDescriptorIdBytes ...), and the rules in the comments above hold.
  Status Validate() const;
  // Bytes of one whole block object payload: block_tokens * layer_count *
  // bytes_per_token_per_layer.
  uint64_t BlockBytes() const;
  // Bytes of one layer of one block: block_tokens * bytes_per_token_per_layer.
  uint64_t LayerBytes() const;
};

// Byte limits of NamespaceDescriptor's strings (Validate; kvtierd refuses a
// Hello that passes one, docs/RELIABILITY.md).
inline constexpr size_t kMaxDescriptorIdBytes = 512;        // model_id, adapter_id
inline constexpr size_t kMaxDescriptorRevisionBytes = 256;  // model_revision, adapter_revision
inline constexpr size_t kMaxDescriptorFormatBytes = 64;     // kv_dtype, kv_layout (object_kind: 64 too)

// The canonical bytes hashed into the fingerprint (docs/KEYS.md).
std::vector<uint8_t> CanonicalNamespaceBytes(const NamespaceDescriptor& ns);

// XXH3-128 of CanonicalNamespaceBytes(ns). Precondition: ns.Validate() ok.
NamespaceFingerprint FingerprintNamespace(const NamespaceDescriptor& ns);

// Kinds of the extra keys of a block (docs/KEYS.md, "The chain").
enum class ExtraKeyKind : uint8_t {
  kCacheSalt = 1,     // per-request isolation salt; block 0 only, first entry
  kMultimodal = 2,    // content hash of a multimodal input overlapping the block
  kPromptEmbeds = 3,  // hash of prompt-embedding inputs at the block's positions
};

// One input of a block besides its tokens; `bytes` are opaque to kvtier.
struct ExtraKey {
  ExtraKeyKind kind = ExtraKeyKind::kMultimodal;
  std::string bytes;
};

// Limits checked by ChainExtras::Validate.
inline constexpr size_t kMaxExtraKeyBytes = 4096;    // salt and each payload
inline constexpr size_t kMaxExtraKeysPerBlock = 64;  // not counting the salt

// Per-request inputs of a chain besides its tokens.
struct ChainExtras {
  std::string cache_salt;  // empty: none; enters block 0 only
  // blocks[i]: block i's extra keys, in the order of their position in the
  // block (order matters). Shorter than the chain: none for the rest; longer:
  // the entries past the full blocks are not used.
  std::vector<std::vector<ExtraKey>> blocks;

  // InvalidArgument if cache_salt is over kMaxExtraKeyBytes, or a block has
  // more than kMaxExtraKeysPerBlock keys, a kind other than kMultimodal or
  // kPromptEmbeds, or an empty or over-long payload.
  Status Validate() const;
};

// One chain link: XXH3-128(canonical(prev) || u32 LE position || tokens as
// u32 LE || extras). `prev` is the fingerprint for position 0. Empty
// `extras` add no bytes (the link is then as in v1); otherwise they are
// encoded as u32 LE count, then per key u8 kind || u32 LE length || bytes,
// in the given order. For block 0 `extras` must already begin with the
// kCacheSalt entry, if any. Not validated here (ChainExtras::Validate is).
BlockKey ChainKey(const BlockKey& prev, uint32_t position, std::span<const uint32_t> block_tokens,
                  std::span<const ExtraKey> extras = {});

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
  // The same with a salt and per-block extra keys; with empty `extras` equal
  // to Keys(tokens). InvalidArgument if extras.Validate() fails.
  Result<std::vector<BlockKey>> Keys(std::span<const uint32_t> tokens, const ChainExtras& extras) const;

  // Extends `chain` (keys of the first chain.size() blocks of `tokens`) with
  // the keys of the remaining full blocks, without rehashing the prefix.
  // Aborts if chain.size() exceeds the full blocks of `tokens`.
  void Extend(std::span<const uint32_t> tokens, std::vector<BlockKey>& chain) const;
  // The same with the extras of the whole sequence (the ones Keys would
  // take); the result equals Keys(tokens, extras). InvalidArgument, with
  // `chain` unchanged, if extras.Validate() fails.
  Status Extend(std::span<const uint32_t> tokens, const ChainExtras& extras, std::vector<BlockKey>& chain) const;

 private:
  ChainHasher(NamespaceFingerprint fp, uint32_t block_tokens) : fingerprint_(fp), block_tokens_(block_tokens) {}

  // Extend with `extras` already validated.
  void ExtendUnchecked(std::span<const uint32_t> tokens, const ChainExtras& extras, std::vector<BlockKey>& chain) const;

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

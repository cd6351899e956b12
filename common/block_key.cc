// Block keys: the namespace fingerprint and the prefix-chained block keys.
//
// Every byte that is hashed here is spelled out explicitly (fixed-width
// little-endian integers, length-prefixed strings), so a key depends only on
// its inputs: never on std::hash, pointer values, the locale, the host's
// endianness or the platform's struct layout. docs/KEYS.md is the normative
// description of these bytes and carries the test vectors; a change here that
// alters any key is a protocol break and must bump the magic.

#include "kvtier/block_key.h"

#include <xxhash.h>

#include <cstddef>
#include <limits>
#include <utility>
#include <string_view>

#include "common/check.h"
#include "common/utf8.h"

namespace kvtier {
namespace {

// Magic prefix of the canonical namespace bytes; the version suffix changes
// whenever the layout below changes.
constexpr std::string_view kNamespaceMagic = "kvtier-ns-v2";

// Size of the canonical form of a key (and of a fingerprint).
constexpr size_t kCanonicalKeyBytes = 16;

// Bounds of NamespaceDescriptor::object_kind.
constexpr size_t kMaxObjectKindBytes = 64;

// Appends `v` as 4 bytes, least significant first.
void AppendU32Le(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

// Appends `v` as 8 bytes, least significant first.
void AppendU64Le(std::vector<uint8_t>& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

// Appends `v` as 8 bytes, most significant first.
void AppendU64Be(std::vector<uint8_t>& out, uint64_t v) {
  for (int i = 7; i >= 0; --i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

// Appends `s` as a u32 LE byte length followed by its raw bytes (no
// terminator, no normalisation). Strings of 4 GiB or more are a caller bug.
void AppendString(std::vector<uint8_t>& out, std::string_view s) {
  KVTIER_CHECK(s.size() <= std::numeric_limits<uint32_t>::max(), "hashed string longer than 4 GiB");
  AppendU32Le(out, static_cast<uint32_t>(s.size()));
  out.insert(out.end(), s.begin(), s.end());
}

// XXH3-128 (seed 0) of `bytes`, as a BlockKey: hi = high64, lo = low64, so
// that the canonical form (hi BE, lo BE) equals XXH128_canonicalFromHash.
BlockKey Hash128(const std::vector<uint8_t>& bytes) {
  const XXH128_hash_t h = XXH3_128bits(bytes.data(), bytes.size());
  return BlockKey{h.high64, h.low64};
}

// Appends one extra key: u8 kind, then the payload as a str.
void AppendExtraKey(std::vector<uint8_t>& out, ExtraKeyKind kind, std::string_view bytes) {
  out.push_back(static_cast<uint8_t>(kind));
  AppendString(out, bytes);
}

// Fills `scratch` with the bytes of one chain link (see ChainKey) and hashes
// them: `salt`, when not empty, is the first extra key (kCacheSalt), then
// `extras`. No extras at all add no bytes. `scratch` is reused across links
// to avoid an allocation per block.
BlockKey ChainKeyInto(std::vector<uint8_t>& scratch, const BlockKey& prev, uint32_t position,
                      std::span<const uint32_t> tokens, std::string_view salt, std::span<const ExtraKey> extras) {
  scratch.clear();
  scratch.reserve(kCanonicalKeyBytes + 4 + 4 * tokens.size());
  AppendU64Be(scratch, prev.hi);
  AppendU64Be(scratch, prev.lo);
  AppendU32Le(scratch, position);
  for (uint32_t t : tokens) AppendU32Le(scratch, t);
  const size_t count = (salt.empty() ? 0 : 1) + extras.size();
  if (count > 0) {
    KVTIER_CHECK(count <= std::numeric_limits<uint32_t>::max(), "too many extra keys");
    AppendU32Le(scratch, static_cast<uint32_t>(count));
    if (!salt.empty()) AppendExtraKey(scratch, ExtraKeyKind::kCacheSalt, salt);
    for (const ExtraKey& e : extras) AppendExtraKey(scratch, e.kind, e.bytes);
  }
  return Hash128(scratch);
}

// True if `s` is 1 to kMaxObjectKindBytes bytes of [a-z0-9_].
bool IsValidObjectKind(std::string_view s) {
  if (s.empty() || s.size() > kMaxObjectKindBytes) return false;
  for (char c : s) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  return true;
}

// Value of one hex digit, or -1. Only lower-case digits are accepted: the
// canonical text form is exactly what ToHex() prints.
int HexDigitValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

}  // namespace

// ---------------------------------------------------------------------------
// BlockKey

std::string BlockKey::ToHex() const {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(2 * kCanonicalKeyBytes, '0');
  // Most significant nibble first: hi then lo, each big-endian.
  for (int i = 0; i < 16; ++i) {
    out[i] = kDigits[(hi >> (60 - 4 * i)) & 0xf];
    out[16 + i] = kDigits[(lo >> (60 - 4 * i)) & 0xf];
  }
  return out;
}

Result<BlockKey> BlockKey::FromHex(std::string_view hex) {
  if (hex.size() != 2 * kCanonicalKeyBytes) {
    return InvalidArgument("block key hex must be 32 lower-case hex digits, got " + std::to_string(hex.size()) +
                           " characters");
  }
  BlockKey key;
  for (size_t i = 0; i < hex.size(); ++i) {
    const int v = HexDigitValue(hex[i]);
    if (v < 0) {
      return InvalidArgument("block key hex has a non lower-case hex digit at offset " + std::to_string(i));
    }
    uint64_t& half = i < 16 ? key.hi : key.lo;
    half = (half << 4) | static_cast<uint64_t>(v);
  }
  return key;
}

// ---------------------------------------------------------------------------
// NamespaceDescriptor

namespace {

// InvalidArgument naming `field` when `value` is over `max_bytes` or not
// valid UTF-8: refused, never cut.
Status CheckDescriptorString(std::string_view field, const std::string& value, size_t max_bytes) {
  if (value.size() > max_bytes) {
    return InvalidArgument(std::string(field) + " is " + std::to_string(value.size()) + " bytes, over the limit of " +
                           std::to_string(max_bytes) + " bytes");
  }
  if (!IsValidUtf8(value)) return InvalidArgument(std::string(field) + " is not valid UTF-8");
  return Status::Ok();
}

}  // namespace

Status NamespaceDescriptor::Validate() const {
  // Checked in declaration order so that the message names the first bad
  // field; tp_size (pp_size) is checked before tp_rank (pp_rank) because
  // "tp_rank < tp_size" is meaningless when tp_size is 0.
  const std::pair<std::string_view, std::pair<const std::string*, size_t>> strings[] = {
      {"model_id", {&model_id, kMaxDescriptorIdBytes}},
      {"model_revision", {&model_revision, kMaxDescriptorRevisionBytes}},
      {"adapter_id", {&adapter_id, kMaxDescriptorIdBytes}},
      {"adapter_revision", {&adapter_revision, kMaxDescriptorRevisionBytes}},
      {"kv_dtype", {&kv_dtype, kMaxDescriptorFormatBytes}},
      {"kv_layout", {&kv_layout, kMaxDescriptorFormatBytes}},
  };
  for (const auto& [field, value] : strings) {
    Status s = CheckDescriptorString(field, *value.first, value.second);
    if (!s.ok()) return s;
  }
  if (model_id.empty()) return InvalidArgument("model_id must not be empty");
  if (model_revision.empty()) {
    return InvalidArgument("model_revision must not be empty");
  }
  if (adapter_id.empty() && !adapter_revision.empty()) {
    return InvalidArgument("adapter_revision must be empty when adapter_id is empty");
  }
  if (!adapter_id.empty() && adapter_revision.empty()) {
    return InvalidArgument("adapter_revision must not be empty when adapter_id is set");
  }
  if (kv_dtype.empty()) return InvalidArgument("kv_dtype must not be empty");
  if (block_tokens == 0) return InvalidArgument("block_tokens must be > 0");
  if (layer_count == 0) return InvalidArgument("layer_count must be > 0");
  if (kv_layout.empty()) return InvalidArgument("kv_layout must not be empty");
  if (bytes_per_token_per_layer == 0) {
    return InvalidArgument("bytes_per_token_per_layer must be > 0");
  }
  // BlockBytes() must not wrap around.
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  const uint64_t tokens_times_layers = uint64_t{block_tokens} * layer_count;
  if (bytes_per_token_per_layer > max / tokens_times_layers) {
    return InvalidArgument(
        "bytes_per_token_per_layer too large: block_tokens * layer_count * "
        "bytes_per_token_per_layer overflows 64 bits");
  }
  if (tp_size == 0) return InvalidArgument("tp_size must be > 0");
  if (tp_rank >= tp_size) {
    return InvalidArgument("tp_rank must be < tp_size (tp_rank " + std::to_string(tp_rank) + ", tp_size " +
                           std::to_string(tp_size) + ")");
  }
  if (pp_size == 0) return InvalidArgument("pp_size must be > 0");
  if (pp_rank >= pp_size) {
    return InvalidArgument("pp_rank must be < pp_size (pp_rank " + std::to_string(pp_rank) + ", pp_size " +
                           std::to_string(pp_size) + ")");
  }
  if (kv_format_version == 0) return InvalidArgument("kv_format_version must be > 0");
  if (!IsValidObjectKind(object_kind)) {
    return InvalidArgument("object_kind must be 1 to " + std::to_string(kMaxObjectKindBytes) +
                           " bytes of [a-z0-9_] (e.g. \"kv\", \"recurrent_state\")");
  }
  return Status::Ok();
}

uint64_t NamespaceDescriptor::BlockBytes() const {
  return uint64_t{block_tokens} * layer_count * bytes_per_token_per_layer;
}

uint64_t NamespaceDescriptor::LayerBytes() const { return uint64_t{block_tokens} * bytes_per_token_per_layer; }

// ---------------------------------------------------------------------------
// ChainExtras

Status ChainExtras::Validate() const {
  if (cache_salt.size() > kMaxExtraKeyBytes) {
    return InvalidArgument("cache_salt is " + std::to_string(cache_salt.size()) + " bytes, at most " +
                           std::to_string(kMaxExtraKeyBytes));
  }
  for (size_t i = 0; i < blocks.size(); ++i) {
    const std::string where = "extra keys of block " + std::to_string(i);
    if (blocks[i].size() > kMaxExtraKeysPerBlock) {
      return InvalidArgument(where + ": " + std::to_string(blocks[i].size()) + " keys, at most " +
                             std::to_string(kMaxExtraKeysPerBlock));
    }
    for (size_t j = 0; j < blocks[i].size(); ++j) {
      const ExtraKey& e = blocks[i][j];
      const std::string entry = where + ", entry " + std::to_string(j);
      if (e.kind != ExtraKeyKind::kMultimodal && e.kind != ExtraKeyKind::kPromptEmbeds) {
        return InvalidArgument(entry + ": kind " + std::to_string(static_cast<int>(e.kind)) +
                               " is not multimodal (2) or prompt embeds (3); the cache salt "
                               "goes in cache_salt");
      }
      if (e.bytes.empty()) return InvalidArgument(entry + ": empty payload");
      if (e.bytes.size() > kMaxExtraKeyBytes) {
        return InvalidArgument(entry + ": payload is " + std::to_string(e.bytes.size()) + " bytes, at most " +
                               std::to_string(kMaxExtraKeyBytes));
      }
    }
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------
// Fingerprint and chain

// Layout (docs/KEYS.md, "Canonical namespace bytes"): the 12-byte ASCII magic,
// then every field in declaration order (the v2 fields pp_rank, pp_size,
// kv_format_version, object_kind last). Strings are u32 LE length + bytes;
// integers are fixed-width LE; the adapter is one presence byte (0: none, and
// nothing follows; 1: adapter_id and adapter_revision follow as strings).
std::vector<uint8_t> CanonicalNamespaceBytes(const NamespaceDescriptor& ns) {
  std::vector<uint8_t> out;
  out.reserve(kNamespaceMagic.size() + 96 + ns.model_id.size() + ns.model_revision.size() + ns.adapter_id.size() +
              ns.adapter_revision.size() + ns.kv_dtype.size() + ns.kv_layout.size() + ns.object_kind.size());
  out.insert(out.end(), kNamespaceMagic.begin(), kNamespaceMagic.end());
  AppendString(out, ns.model_id);
  AppendString(out, ns.model_revision);
  if (ns.adapter_id.empty()) {
    out.push_back(0);
  } else {
    out.push_back(1);
    AppendString(out, ns.adapter_id);
    AppendString(out, ns.adapter_revision);
  }
  AppendString(out, ns.kv_dtype);
  AppendU32Le(out, ns.block_tokens);
  AppendU32Le(out, ns.layer_count);
  AppendString(out, ns.kv_layout);
  AppendU64Le(out, ns.bytes_per_token_per_layer);
  AppendU32Le(out, ns.tp_rank);
  AppendU32Le(out, ns.tp_size);
  AppendU32Le(out, ns.pp_rank);
  AppendU32Le(out, ns.pp_size);
  AppendU32Le(out, ns.kv_format_version);
  AppendString(out, ns.object_kind);
  return out;
}

NamespaceFingerprint FingerprintNamespace(const NamespaceDescriptor& ns) {
  return Hash128(CanonicalNamespaceBytes(ns));
}

BlockKey ChainKey(const BlockKey& prev, uint32_t position, std::span<const uint32_t> block_tokens,
                  std::span<const ExtraKey> extras) {
  std::vector<uint8_t> scratch;
  return ChainKeyInto(scratch, prev, position, block_tokens, /*salt=*/{}, extras);
}

Result<ChainHasher> ChainHasher::Create(const NamespaceDescriptor& ns) {
  if (Status s = ns.Validate(); !s.ok()) return s;
  return ChainHasher(FingerprintNamespace(ns), ns.block_tokens);
}

std::vector<BlockKey> ChainHasher::Keys(std::span<const uint32_t> tokens) const {
  std::vector<BlockKey> chain;
  chain.reserve(tokens.size() / block_tokens_);
  ExtendUnchecked(tokens, ChainExtras{}, chain);
  return chain;
}

Result<std::vector<BlockKey>> ChainHasher::Keys(std::span<const uint32_t> tokens, const ChainExtras& extras) const {
  std::vector<BlockKey> chain;
  chain.reserve(tokens.size() / block_tokens_);
  if (Status s = Extend(tokens, extras, chain); !s.ok()) return s;
  return chain;
}

void ChainHasher::Extend(std::span<const uint32_t> tokens, std::vector<BlockKey>& chain) const {
  ExtendUnchecked(tokens, ChainExtras{}, chain);
}

Status ChainHasher::Extend(std::span<const uint32_t> tokens, const ChainExtras& extras,
                           std::vector<BlockKey>& chain) const {
  if (Status s = extras.Validate(); !s.ok()) return s;
  ExtendUnchecked(tokens, extras, chain);
  return Status::Ok();
}

// Precondition (checked, aborts): chain.size() <= number of full blocks in
// `tokens`. The existing keys are trusted, not recomputed; the salt enters
// only when block 0 is computed here.
void ChainHasher::ExtendUnchecked(std::span<const uint32_t> tokens, const ChainExtras& extras,
                                  std::vector<BlockKey>& chain) const {
  const size_t full_blocks = tokens.size() / block_tokens_;
  KVTIER_CHECK(chain.size() <= full_blocks, "Extend: chain is longer than the full blocks of tokens");
  // Positions are hashed as u32; 2^32 blocks is far beyond any context.
  KVTIER_CHECK(full_blocks <= uint64_t{std::numeric_limits<uint32_t>::max()} + 1, "Extend: more than 2^32 blocks");
  std::vector<uint8_t> scratch;
  BlockKey prev = chain.empty() ? fingerprint_ : chain.back();
  for (size_t i = chain.size(); i < full_blocks; ++i) {
    const std::string_view salt = i == 0 ? std::string_view(extras.cache_salt) : std::string_view();
    const std::span<const ExtraKey> own =
        i < extras.blocks.size() ? std::span<const ExtraKey>(extras.blocks[i]) : std::span<const ExtraKey>();
    prev = ChainKeyInto(scratch, prev, static_cast<uint32_t>(i), tokens.subspan(i * block_tokens_, block_tokens_), salt,
                        own);
    chain.push_back(prev);
  }
}

}  // namespace kvtier

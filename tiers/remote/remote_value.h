// The form of one block in the remote tier (a Redis value), and the name
// it is stored under. Values must verify themselves: the store is shared by
// every node, lossy (its eviction policy drops keys at will), outside this
// process and writable by anyone who can reach it with its password, so a
// read may find nothing, a value of another namespace or key (a stale or
// colliding name, another deployment), a truncated or corrupt value, an
// old-format value, or a forgery. Each is a miss to the caller, never bytes
// served.
//
// Value bytes (little-endian), a 104-byte header then the payload:
//    0 u64 magic "KVTREM01"       40 u64 key lo
//    8 u32 format version (2)     48 u64 payload_bytes
//   12 u32 layer_count            56 u64 xxh3-64 of the payload
//   16 u64 namespace fp hi        64 32 bytes nonce + Poly1305 (value_mac.h) of
//   24 u64 namespace fp lo               bytes [0, 64) then the payload
//   32 u64 key hi                 96 u64 xxh3-64 of bytes [0, 96)
//
// The MAC is what a reader trusts: it covers every header field (so the
// namespace and key a value names, its shape and its payload checksum) and
// the whole payload, under the cluster secret. The xxh3s only tell
// accidents apart from forgeries cheaply (a probe reads the header alone
// and can check no MAC). Version 1 (no MAC, a 72-byte header) is refused
// as unauthenticated.
//
// Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "kvtier/block_key.h"
#include "kvtier/result.h"
#include "tiers/remote/value_mac.h"

namespace kvtier {

inline constexpr size_t kRemoteHeaderBytes = 104;
inline constexpr uint32_t kRemoteFormatVersion = 2;
inline constexpr size_t kRemoteMacOffset = 64;  // the MAC covers bytes [0, kRemoteMacOffset) and the payload

struct RemoteBlock {
  NamespaceFingerprint ns;
  BlockKey key;
  uint32_t layer_count = 1;       // >= 1
  uint64_t payload_checksum = 0;  // xxh3-64 (common/checksum.h) of the payload
};

// The Redis key `block` is stored under: "kvtier:v1:<ns hex>:<key hex>".
// No hash tag: blocks spread over every slot. (The name did not change
// with the format: an old value under it is found, refused and replaced.)
std::string RemoteKeyName(const NamespaceFingerprint& ns, const BlockKey& key);

// Writes the header of `block` with `payload` into `out`, its MAC under
// `mac` over the header's fields and `payload` (one pass over the payload;
// the payload is not copied). `block.payload_checksum` must be the
// payload's xxh3 (the caller has it from its copy).
void EncodeRemoteHeader(const ValueMac& mac, const RemoteBlock& block, std::span<const std::byte> payload,
                        std::span<std::byte, kRemoteHeaderBytes> out);

// Header and payload in one buffer (checksumming the payload): the value
// a SET sends when the payload is not sent from where it lies.
std::string EncodeRemoteValue(const ValueMac& mac, const RemoteBlock& block, std::span<const std::byte> payload);

// What a value's header says, once it decoded (DecodeRemoteHeader).
struct RemoteHeader {
  uint32_t layer_count = 1;
  uint64_t payload_bytes = 0;
  uint64_t payload_checksum = 0;
};

// The header at the start of a value of (`ns`, `key`): what a probe reads
// (GETRANGE of the first kRemoteHeaderBytes) before any payload moves, and
// what a read checks before it trusts the length. Not authenticated yet:
// the MAC needs the payload (VerifyRemotePayload). Errors, each a miss:
//   PermissionDenied   a value of format version 1 (it has no MAC);
//   Corruption         not a value of this format (magic, version, header
//                      checksum), layers that do not divide the payload;
//   FailedPrecondition an intact value of another namespace or key (a
//                      foreign or stale value under this name).
Result<RemoteHeader> DecodeRemoteHeader(std::span<const std::byte> header, const NamespaceFingerprint& ns,
                                        const BlockKey& key);

// Whether `payload` is the payload the decoded `header` (its first
// kRemoteHeaderBytes) vouches for: PermissionDenied when the MAC does not
// verify under `mac` (a forgery, a value moved from another key, another
// cluster secret), Corruption when the MAC holds and the xxh3 does not (a
// writer's memory fault). The caller has checked the length.
Status VerifyRemotePayload(const ValueMac& mac, std::span<const std::byte> header, std::span<const std::byte> payload);

// The payload of `value` if it is a whole, intact, authentic value of
// (`ns`, `key`); its layer count in `*layer_count` when not null. Errors as
// DecodeRemoteHeader and VerifyRemotePayload, and Corruption for a length
// that does not match the header.
Result<std::span<const std::byte>> DecodeRemoteValue(const ValueMac& mac, std::span<const std::byte> value,
                                                     const NamespaceFingerprint& ns, const BlockKey& key,
                                                     uint32_t* layer_count = nullptr);

}  // namespace kvtier

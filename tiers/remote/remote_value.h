// The form of one block in the remote tier (a Redis value), and the name
// it is stored under. Values must verify themselves: the store is shared by
// every node, lossy (its eviction policy drops keys at will) and outside
// this process, so a read may find nothing, a value of another namespace or
// key (a stale or colliding name, another deployment), a truncated or
// corrupt value. Each is a miss to the caller, never bytes served.
//
// Value bytes (little-endian), a 72-byte header then the payload:
//    0 u64 magic "KVTREM01"       40 u64 key lo
//    8 u32 format version (1)     48 u64 payload_bytes
//   12 u32 layer_count            56 u64 xxh3-64 of the payload
//   16 u64 namespace fp hi        64 u64 xxh3-64 of bytes [0, 64)
//   24 u64 namespace fp lo
//   32 u64 key hi
//
// Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "kvtier/block_key.h"
#include "kvtier/result.h"

namespace kvtier {

inline constexpr size_t kRemoteHeaderBytes = 72;
inline constexpr uint32_t kRemoteFormatVersion = 1;

struct RemoteBlock {
  NamespaceFingerprint ns;
  BlockKey key;
  uint32_t layer_count = 1;        // >= 1
  uint64_t payload_checksum = 0;   // xxh3-64 (common/checksum.h) of the payload
};

// The Redis key `block` is stored under: "kvtier:v1:<ns hex>:<key hex>".
// No hash tag: blocks spread over every slot.
std::string RemoteKeyName(const NamespaceFingerprint& ns, const BlockKey& key);

// Writes the header of `block` with `payload_bytes` of payload into `out`.
void EncodeRemoteHeader(const RemoteBlock& block, uint64_t payload_bytes,
                        std::span<std::byte, kRemoteHeaderBytes> out);

// Header and payload in one buffer (checksumming the payload): the value
// a SET sends when the payload is not sent from where it lies.
std::string EncodeRemoteValue(const RemoteBlock& block, std::span<const std::byte> payload);

// What a value's header says, once it verified (DecodeRemoteHeader).
struct RemoteHeader {
  uint32_t layer_count = 1;
  uint64_t payload_bytes = 0;
  uint64_t payload_checksum = 0;
};

// The header at the start of a value of (`ns`, `key`): what a probe reads
// (GETRANGE of the first kRemoteHeaderBytes) before any payload moves, and
// what a read checks before it trusts the length. Errors as
// DecodeRemoteValue, except that the payload is not looked at.
Result<RemoteHeader> DecodeRemoteHeader(std::span<const std::byte> header, const NamespaceFingerprint& ns,
                                        const BlockKey& key);

// The payload of `value` if it is a whole, intact value of (`ns`, `key`);
// its layer count in `*layer_count` when not null. Errors, each a miss:
//   Corruption         not a value of this format (magic, version, header
//                      checksum), a length that does not match, a payload
//                      whose checksum does not match;
//   FailedPrecondition an intact value of another namespace or key (a
//                      foreign or stale value under this name).
Result<std::span<const std::byte>> DecodeRemoteValue(std::span<const std::byte> value, const NamespaceFingerprint& ns,
                                                     const BlockKey& key, uint32_t* layer_count = nullptr);

}  // namespace kvtier

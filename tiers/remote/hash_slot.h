// Redis Cluster key placement: the CRC16 (XMODEM: polynomial 0x1021, init
// 0, no reflection) of a key, modulo 16384, over the key's hash tag when it
// has one. The remote tier routes each command to the master that owns its
// slot (MOVED / ASK redirects correct a stale map), so these must agree
// with the server bit for bit: tests compare them with redis-server's own
// CLUSTER KEYSLOT.
//
// Hash tag: if the key holds a '{' followed later by a '}' with at least
// one byte between them, only the bytes between the first '{' and the first
// '}' after it are hashed ("{user}.a" and "{user}.b" share a slot;
// "a{}{b}" hashes the whole key).
//
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string_view>

namespace kvtier {

inline constexpr uint16_t kClusterSlots = 16384;

uint16_t Crc16Xmodem(std::string_view bytes);

// The slot of `key`, in [0, kClusterSlots).
uint16_t HashSlot(std::string_view key);

}  // namespace kvtier

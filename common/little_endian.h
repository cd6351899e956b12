// Fixed-width little-endian fields of the on-media and on-wire formats (the
// NVMe record header, the remote tier's values), written byte by byte so
// the bytes are the same on any host and any alignment.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvtier {

inline void StoreLe64(std::byte* at, uint64_t v) {
  for (int i = 0; i < 8; ++i) at[i] = static_cast<std::byte>(v >> (8 * i));
}
inline void StoreLe32(std::byte* at, uint32_t v) {
  for (int i = 0; i < 4; ++i) at[i] = static_cast<std::byte>(v >> (8 * i));
}
inline uint64_t LoadLe64(const std::byte* at) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(at[i]) << (8 * i);
  return v;
}
inline uint32_t LoadLe32(const std::byte* at) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(at[i]) << (8 * i);
  return v;
}

}  // namespace kvtier

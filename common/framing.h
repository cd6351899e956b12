// Frames on the control socket: a u32 little-endian payload length followed
// by the payload (one serialized protobuf message). Receivers check the
// length against their cap before reading or parsing the payload.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvtier {

inline constexpr size_t kFrameHeaderBytes = 4;
inline constexpr uint32_t kDefaultMaxFrameBytes = 1u << 20;

inline void EncodeFrameHeader(uint32_t payload_bytes, uint8_t out[kFrameHeaderBytes]) {
  out[0] = static_cast<uint8_t>(payload_bytes);
  out[1] = static_cast<uint8_t>(payload_bytes >> 8);
  out[2] = static_cast<uint8_t>(payload_bytes >> 16);
  out[3] = static_cast<uint8_t>(payload_bytes >> 24);
}

inline uint32_t DecodeFrameHeader(const uint8_t in[kFrameHeaderBytes]) {
  return static_cast<uint32_t>(in[0]) | (static_cast<uint32_t>(in[1]) << 8) | (static_cast<uint32_t>(in[2]) << 16) |
         (static_cast<uint32_t>(in[3]) << 24);
}

}  // namespace kvtier

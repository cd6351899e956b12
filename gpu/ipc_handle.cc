#include "gpu/ipc_handle.h"

namespace kvtier::gpu {
namespace {

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string HandleToHex(const std::array<std::byte, kIpcHandleBytes>& bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * kIpcHandleBytes);
  for (std::byte b : bytes) {
    const auto v = static_cast<unsigned>(b);
    hex.push_back(kDigits[v >> 4]);
    hex.push_back(kDigits[v & 0xf]);
  }
  return hex;
}

Result<std::array<std::byte, kIpcHandleBytes>> HandleFromHex(std::string_view hex) {
  if (hex.size() != 2 * kIpcHandleBytes) {
    return InvalidArgument("an IPC handle is " + std::to_string(2 * kIpcHandleBytes) + " hex digits, not " +
                           std::to_string(hex.size()));
  }
  std::array<std::byte, kIpcHandleBytes> bytes{};
  for (size_t i = 0; i < kIpcHandleBytes; ++i) {
    const int hi = HexValue(hex[2 * i]);
    const int lo = HexValue(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return InvalidArgument("IPC handle: not a hex digit at " + std::to_string(2 * i));
    bytes[i] = static_cast<std::byte>(hi << 4 | lo);
  }
  return bytes;
}

}  // namespace kvtier::gpu

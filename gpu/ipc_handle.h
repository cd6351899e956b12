// The bytes of CUDA IPC handles, as they travel to another process (in a
// Hello response, over the control socket). No CUDA header: both handle
// types are 64 opaque bytes (CUDA_IPC_HANDLE_SIZE; checked where they are
// converted, gpu/*.cc).
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <string_view>

#include "kvtier/result.h"

namespace kvtier::gpu {

inline constexpr size_t kIpcHandleBytes = 64;

// cudaIpcMemHandle_t of a DevicePool's allocation.
struct IpcMemHandle {
  std::array<std::byte, kIpcHandleBytes> bytes{};
  friend bool operator==(const IpcMemHandle&, const IpcMemHandle&) = default;
};

// cudaIpcEventHandle_t of an event created with cudaEventInterprocess.
struct IpcEventHandle {
  std::array<std::byte, kIpcHandleBytes> bytes{};
  friend bool operator==(const IpcEventHandle&, const IpcEventHandle&) = default;
};

// 128 lower-case hex digits, and back (InvalidArgument on anything else):
// for a command line or a log line; the wire carries the raw bytes.
std::string HandleToHex(const std::array<std::byte, kIpcHandleBytes>& bytes);
Result<std::array<std::byte, kIpcHandleBytes>> HandleFromHex(std::string_view hex);

}  // namespace kvtier::gpu

// Helpers of the GPU tests: skipping without a device, deterministic
// self-describing bytes, a gate that stalls a CUDA stream.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "gpu/cuda_handles.h"
#include "gpu/device_probe.h"

// Skips the test (with the probe's reason) when no CUDA device is usable.
#define KVTIER_SKIP_WITHOUT_DEVICE()                               \
  do {                                                             \
    ::kvtier::Result<int> devices = ::kvtier::gpu::DeviceCount();  \
    if (!devices.ok()) GTEST_SKIP() << devices.status().message(); \
  } while (0)

namespace kvtier::testing {

// Bytes that depend on (seed, position) only: a read is exact or wrong.
void FillPattern(uint64_t seed, std::span<std::byte> out);
bool MatchesPattern(uint64_t seed, std::span<const std::byte> bytes);

// Stalls a stream: Close() enqueues a host function that spins until
// Open() (or the destructor). Declare it after the objects whose streams
// it stalls, so it opens before they synchronize in their destructors.
class StreamGate {
 public:
  ~StreamGate() { Open(); }
  // Error text, empty on success.
  std::string Close(gpu::StreamHandle stream);
  void Open() { open_.store(true, std::memory_order_release); }

 private:
  static void Spin(void* self);
  std::atomic<bool> open_{false};
};

}  // namespace kvtier::testing

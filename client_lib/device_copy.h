// internal::DeviceLoadCopier: a layer-wise load's copies into GPU memory
// (LoadOptions::device_dst). With CUDA (the client library built with
// KVTIER_HAVE_CUDA) it is a kvtier_gpu LayerCopier: one copy stream and
// one event per layer; the arena is registered with CUDA once per
// connection (ArenaRegistration), so the host-to-device copies out of it
// are DMA. Without CUDA every call is Unimplemented. No CUDA type here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "kvtier/result.h"
#include "kvtier/status.h"

namespace kvtier::internal {

// The arena's cudaHostRegister, held until destroyed (before the arena is
// unmapped). Thread-safe (immutable).
class ArenaRegistration {
 public:
  // Unimplemented without CUDA; the registration's errors otherwise.
  static Result<std::unique_ptr<ArenaRegistration>> Register(std::span<std::byte> arena);
  virtual ~ArenaRegistration() = default;
};

class DeviceLoadCopier {
 public:
  struct Piece {
    void* dst = nullptr;        // device memory
    const void* src = nullptr;  // the registered arena
    uint64_t bytes = 0;
  };
  // A stream and `layers` events on device `ordinal`. Unimplemented
  // without CUDA; Unavailable without a device.
  static Result<std::unique_ptr<DeviceLoadCopier>> Create(uint32_t layers, int ordinal);
  virtual ~DeviceLoadCopier() = default;  // waits for the copies in flight

  // Enqueues `pieces` (host to device) and records `layer`'s event.
  virtual Status EnqueueLayer(uint32_t layer, std::span<const Piece> pieces) = 0;
  // Makes `stream` (a cudaStream_t; null: the legacy default stream) wait
  // on the GPU until `layer`'s copies are done. The host does not wait.
  virtual Status MakeStreamWait(void* stream, uint32_t layer) = 0;
  // Blocks until every copy enqueued is done (before the arena's bytes
  // may be reused: the end of the load).
  virtual Status SynchronizeAll() = 0;
};

}  // namespace kvtier::internal

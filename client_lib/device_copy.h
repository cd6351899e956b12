// internal::DeviceLoadCopier: a layer-wise load's copies into GPU memory
// (LoadOptions::device_dst). With CUDA (the client library built with
// KVTIER_HAVE_CUDA) it is a kvtier_gpu LayerCopier: one copy stream and
// one event per layer; the arena is registered with CUDA once per
// connection (ArenaRegistration), so the host-to-device copies out of it
// are DMA. Blocks the daemon holds in its device pool (the HBM tier) are
// copied device to device from the connection's mapping of the pool
// (DevicePoolMapping, gpu::DeviceMapping). Without CUDA every call is
// Unimplemented. No CUDA type here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

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

// The daemon's device pool as its Hello offered it (v1::DevicePoolOffer).
struct DevicePoolOffer {
  std::string ipc_handle;  // the cudaIpcMemHandle_t's bytes (64)
  uint64_t bytes = 0;      // the pool's capacity
  std::string pci_bus_id;  // its GPU ("0000:3b:00.0")
};

// A client's mapping of the daemon's device pool (gpu::DeviceMapping):
// cudaIpcOpenMemHandle once, cudaIpcCloseMemHandle when destroyed. The
// owner (the Connection) destroys it only after every copy out of it
// finished. Thread-safe (immutable).
class DevicePoolMapping {
 public:
  // This process's ordinal of the pool's GPU (gpu::OrdinalOfPciBusId).
  // Unimplemented without CUDA; InvalidArgument, Unavailable, NotFound.
  static Result<int> OrdinalOf(const DevicePoolOffer& offer);
  // Maps the pool on device `ordinal` (the pool's GPU: OrdinalOf).
  // Unimplemented without CUDA; InvalidArgument (a handle that is not 64
  // bytes, a pool of 0 bytes), else gpu::DeviceMapping::Open's errors
  // (AlreadyExists: this process mapped it already, e.g. a second Client
  // of the same daemon; CUDA allows one open per process).
  static Result<std::unique_ptr<DevicePoolMapping>> Open(const DevicePoolOffer& offer, int ordinal);
  virtual ~DevicePoolMapping() = default;  // closes the mapping
  DevicePoolMapping(const DevicePoolMapping&) = delete;
  DevicePoolMapping& operator=(const DevicePoolMapping&) = delete;

  int ordinal() const { return ordinal_; }
  uint64_t bytes() const { return bytes_; }
  // This process's device address of [offset, offset + length) of the
  // pool; null when the range is not inside the pool (a board offset is
  // never trusted blindly).
  const std::byte* At(uint64_t offset, uint64_t length) const {
    if (offset > bytes_ || length > bytes_ - offset) return nullptr;
    return base_ + offset;
  }

 protected:
  DevicePoolMapping(const std::byte* base, uint64_t bytes, int ordinal)
      : base_(base), bytes_(bytes), ordinal_(ordinal) {}

 private:
  const std::byte* const base_;  // a device address
  const uint64_t bytes_;
  const int ordinal_;
};

class DeviceLoadCopier {
 public:
  // Where a piece's bytes come from.
  enum class Source {
    kArena,       // the registered arena: host to device
    kDevicePool,  // the connection's DevicePoolMapping: device to device
  };
  struct Piece {
    void* dst = nullptr;        // device memory
    const void* src = nullptr;  // in the registered arena, or a device address in the pool's mapping
    uint64_t bytes = 0;
    Source source = Source::kArena;
  };
  // A stream and `layers` events on device `ordinal`. Unimplemented
  // without CUDA; Unavailable without a device.
  static Result<std::unique_ptr<DeviceLoadCopier>> Create(uint32_t layers, int ordinal);
  virtual ~DeviceLoadCopier() = default;  // waits for the copies in flight

  // Enqueues `pieces` (each host to device or device to device, as its
  // `source` says) and records `layer`'s event after all of them. The
  // sources are borrowed until the copies are done (SynchronizeAll).
  virtual Status EnqueueLayer(uint32_t layer, std::span<const Piece> pieces) = 0;
  // Makes `stream` (a cudaStream_t; null: the legacy default stream) wait
  // on the GPU until `layer`'s copies are done. The host does not wait.
  virtual Status MakeStreamWait(void* stream, uint32_t layer) = 0;
  // Blocks until every copy enqueued is done (before the arena's bytes
  // may be reused: the end of the load).
  virtual Status SynchronizeAll() = 0;
};

}  // namespace kvtier::internal

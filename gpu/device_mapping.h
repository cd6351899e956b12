// DeviceMapping: the client's view of the daemon's DevicePool, opened once
// at connect from the pool's IPC handle and closed when the client goes.
// After that only offsets move. No CUDA header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "gpu/ipc_handle.h"
#include "kvtier/result.h"

namespace kvtier::gpu {

// Thread-safe (immutable after Open). Not copyable: the destructor closes
// the mapping (cudaIpcCloseMemHandle), after which pointers from it are
// invalid; the owner makes sure no copy in flight still uses them.
//
// CUDA allows one open of a given handle per process and device: open it
// once and share the mapping. The exporting process must keep the pool
// allocated until every mapping of it is closed.
class DeviceMapping {
 public:
  // Maps the allocation behind `handle` (exported by DevicePool::Export in
  // another process; opening it in the exporting process fails) on device
  // `ordinal`, with cudaIpcMemLazyEnablePeerAccess, and remembers that it
  // is `bytes` long (the pool's capacity, which the handle does not carry).
  // Errors: InvalidArgument (bytes 0, a handle from this process or not a
  // handle at all), AlreadyExists (this process already mapped it),
  // Unavailable (no device, IPC unsupported), IoError.
  static Result<std::unique_ptr<DeviceMapping>> Open(const IpcMemHandle& handle, uint64_t bytes, int ordinal = 0);
  ~DeviceMapping();
  DeviceMapping(const DeviceMapping&) = delete;
  DeviceMapping& operator=(const DeviceMapping&) = delete;

  // This process's device address of the pool's offset 0 (not the same
  // number as in the daemon).
  void* base() const { return base_; }
  uint64_t bytes() const { return bytes_; }
  int ordinal() const { return ordinal_; }

  // The device address of [offset, offset + length) of the pool.
  // InvalidArgument when the range is not inside the pool.
  Result<void*> At(uint64_t offset, uint64_t length) const;

 private:
  DeviceMapping(void* base, uint64_t bytes, int ordinal) : base_(base), bytes_(bytes), ordinal_(ordinal) {}

  void* const base_;
  const uint64_t bytes_;
  const int ordinal_;
};

}  // namespace kvtier::gpu

// HbmDevice: what the HBM tier needs of a GPU, injected so the tier's
// logic is tested with a host-memory double (tests/gpu/fake_hbm_device.h)
// as well as on a real device (CudaHbmDevice, cuda_hbm_device.h). No CUDA
// header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "kvtier/result.h"

namespace kvtier {

// Device memory is addressed by offsets into one pool. Copies go through
// one in-order queue (a CUDA stream): a copy submitted after another
// starts after it ends, so a device range freed once its last copy was
// submitted may be handed to a later copy at once.
//
// Thread-safe: every method may be called from any thread.
class HbmDevice {
 public:
  virtual ~HbmDevice() = default;

  // Device pool bytes.
  virtual uint64_t capacity_bytes() const = 0;
  // A device range of at least `bytes` (rounded up to the pool's
  // alignment; `length_out` receives the rounded length). Errors:
  // InvalidArgument (0 or larger than the pool), NoSpace (no room now).
  virtual Result<uint64_t> AllocateDevice(uint64_t bytes, uint64_t* length_out) = 0;
  // Returns a range AllocateDevice handed out (aborts on a wild offset: a
  // caller bug).
  virtual void FreeDevice(uint64_t offset) = 0;

  // Page-locked host memory of this device for staging copies; the tier
  // carves it. Valid as long as the device.
  virtual std::span<std::byte> staging() = 0;
  // Whether `host` may be a copy's host side without staging (pinned:
  // registered or allocated page-locked).
  virtual bool IsPinnedHost(const void* host) const = 0;

  // Enqueue a copy and return its fence. Errors: Busy (too many copies in
  // flight), InvalidArgument, IoError; on error nothing was enqueued.
  virtual Result<uint32_t> CopyToDevice(uint64_t device_offset, const std::byte* host, uint64_t bytes) = 0;
  virtual Result<uint32_t> CopyToHost(std::byte* host, uint64_t device_offset, uint64_t bytes) = 0;
  // Blocks until the copy behind `fence` is done and frees the fence; each
  // fence is waited for exactly once. The copy's error, if any (IoError).
  virtual Status Wait(uint32_t fence) = 0;
};

}  // namespace kvtier

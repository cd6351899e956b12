// CudaHbmDevice: HbmDevice on a real GPU: a DevicePool (its IPC handle is
// what clients will open), a PinnedBuffer for staging and a CopyStream.
// No CUDA header.
#pragma once

#include <cstdint>
#include <memory>

#include "gpu/copy_stream.h"
#include "gpu/device_pool.h"
#include "gpu/host_registration.h"
#include "tiers/hbm/hbm_device.h"

namespace kvtier {

struct CudaHbmDeviceOptions {
  int ordinal = 0;
  uint64_t pool_bytes = 1ull << 30;      // device memory the tier owns
  uint64_t staging_bytes = 64ull << 20;  // pinned host memory for copies
  uint32_t max_copies_in_flight = 256;   // fences
};

// Thread-safe.
class CudaHbmDevice final : public HbmDevice {
 public:
  // Errors: Unavailable (no device: the message says why), NoSpace (the
  // pool or the staging does not fit), InvalidArgument, IoError.
  static Result<std::unique_ptr<CudaHbmDevice>> Create(const CudaHbmDeviceOptions& options);

  uint64_t capacity_bytes() const override { return pool_->capacity_bytes(); }
  Result<uint64_t> AllocateDevice(uint64_t bytes, uint64_t* length_out) override;
  void FreeDevice(uint64_t offset) override;
  std::span<std::byte> staging() override { return staging_->span(); }
  bool IsPinnedHost(const void* host) const override { return gpu::IsPinnedHost(host); }
  Result<uint32_t> CopyToDevice(uint64_t device_offset, const std::byte* host, uint64_t bytes) override;
  Result<uint32_t> CopyToHost(std::byte* host, uint64_t device_offset, uint64_t bytes) override;
  Status Wait(uint32_t fence) override { return stream_->Wait(fence); }

  // The pool, for exporting its IPC handle to clients.
  gpu::DevicePool& pool() { return *pool_; }

 private:
  CudaHbmDevice(std::unique_ptr<gpu::DevicePool> pool, std::unique_ptr<gpu::PinnedBuffer> staging,
                std::unique_ptr<gpu::CopyStream> stream)
      : pool_(std::move(pool)), staging_(std::move(staging)), stream_(std::move(stream)) {}

  std::unique_ptr<gpu::DevicePool> pool_;
  std::unique_ptr<gpu::PinnedBuffer> staging_;
  std::unique_ptr<gpu::CopyStream> stream_;  // declared last: drained before the memory goes
};

}  // namespace kvtier

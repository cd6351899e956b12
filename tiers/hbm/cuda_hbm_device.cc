#include "tiers/hbm/cuda_hbm_device.h"

#include "common/check.h"

namespace kvtier {

Result<std::unique_ptr<CudaHbmDevice>> CudaHbmDevice::Create(const CudaHbmDeviceOptions& options) {
  auto pool = gpu::DevicePool::Create(options.pool_bytes, options.ordinal);
  if (!pool.ok()) return pool.status();
  auto staging = gpu::PinnedBuffer::Allocate(options.staging_bytes);
  if (!staging.ok()) return staging.status();
  auto stream = gpu::CopyStream::Create(options.max_copies_in_flight, options.ordinal);
  if (!stream.ok()) return stream.status();
  return std::unique_ptr<CudaHbmDevice>(new CudaHbmDevice(std::move(*pool), std::move(*staging), std::move(*stream)));
}

Result<uint64_t> CudaHbmDevice::AllocateDevice(uint64_t bytes, uint64_t* length_out) {
  Result<gpu::DeviceRange> range = pool_->Allocate(bytes);
  if (!range.ok()) return range.status();
  *length_out = range->bytes;
  return range->offset;
}

void CudaHbmDevice::FreeDevice(uint64_t offset) {
  Status s = pool_->Free(offset);
  KVTIER_CHECK(s.ok(), "freeing a device range the pool did not hand out");
}

Result<uint32_t> CudaHbmDevice::CopyToDevice(uint64_t device_offset, const std::byte* host, uint64_t bytes) {
  return stream_->Submit(pool_->At(device_offset), host, bytes, gpu::CopyKind::kHostToDevice);
}

Result<uint32_t> CudaHbmDevice::CopyToHost(std::byte* host, uint64_t device_offset, uint64_t bytes) {
  return stream_->Submit(host, pool_->At(device_offset), bytes, gpu::CopyKind::kDeviceToHost);
}

}  // namespace kvtier

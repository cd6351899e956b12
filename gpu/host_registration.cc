#include "gpu/host_registration.h"

#include <string>

#include "gpu/cuda_status.h"

namespace kvtier::gpu {

Result<std::unique_ptr<HostRegistration>> HostRegistration::Register(std::span<std::byte> host) {
  if (host.empty()) return InvalidArgument("cannot register an empty host range");
  if (Status s = CudaStatus(cudaHostRegister(host.data(), host.size(), cudaHostRegisterPortable),
                            "cudaHostRegister(" + std::to_string(host.size()) + " bytes)");
      !s.ok()) {
    return s;
  }
  return std::unique_ptr<HostRegistration>(new HostRegistration(host));
}

HostRegistration::~HostRegistration() {
  (void)cudaHostUnregister(host_.data());  // nothing to do about a failure here
}

bool IsPinnedHost(const void* p) {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
    (void)cudaGetLastError();  // pageable memory is not an error worth keeping
    return false;
  }
  return attributes.type == cudaMemoryTypeHost;
}

Result<std::unique_ptr<PinnedBuffer>> PinnedBuffer::Allocate(size_t bytes) {
  if (bytes == 0) return InvalidArgument("cannot allocate 0 pinned bytes");
  void* p = nullptr;
  if (Status s = CudaStatus(cudaHostAlloc(&p, bytes, cudaHostAllocPortable),
                            "cudaHostAlloc(" + std::to_string(bytes) + " bytes)");
      !s.ok()) {
    return s;
  }
  return std::unique_ptr<PinnedBuffer>(new PinnedBuffer({static_cast<std::byte*>(p), bytes}));
}

PinnedBuffer::~PinnedBuffer() { (void)cudaFreeHost(bytes_.data()); }

}  // namespace kvtier::gpu

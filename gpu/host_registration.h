// HostRegistration: page-locks an existing host range for the GPU
// (cudaHostRegister) for as long as the object lives, so copies between it
// and device memory are DMA and cudaMemcpyAsync on it is truly
// asynchronous. The client registers its arena mapping once at connect;
// nothing on the hot path registers. No CUDA header.
//
// PinnedBuffer: host memory allocated page-locked (cudaHostAlloc), for
// staging that this process owns.
#pragma once

#include <cstddef>
#include <memory>
#include <span>

#include "kvtier/result.h"

namespace kvtier::gpu {

// Not copyable; the destructor unregisters (cudaHostUnregister). The
// owner keeps the memory mapped until then and makes sure no copy in
// flight still reads or writes it. Thread-safe (immutable).
class HostRegistration {
 public:
  // Registers `host` (any mapping: anonymous, memfd MAP_SHARED; page
  // aligned ranges avoid pinning a neighbour's partial pages) with
  // cudaHostRegisterPortable, so every context in this process sees it
  // pinned. Errors: InvalidArgument (empty span), AlreadyExists (a part of
  // it is registered already), NoSpace (the OS refused to pin that much),
  // Unavailable (no device), IoError.
  static Result<std::unique_ptr<HostRegistration>> Register(std::span<std::byte> host);
  ~HostRegistration();
  HostRegistration(const HostRegistration&) = delete;
  HostRegistration& operator=(const HostRegistration&) = delete;

  std::span<std::byte> span() const { return host_; }

 private:
  explicit HostRegistration(std::span<std::byte> host) : host_(host) {}
  const std::span<std::byte> host_;
};

// Whether `p` points into page-locked host memory that CUDA knows
// (registered or cudaHostAlloc'd), i.e. an async copy to or from it is
// DMA. False for pageable memory, device memory and on any error.
bool IsPinnedHost(const void* p);

// Page-locked host memory owned by this object (cudaHostAlloc, portable);
// the destructor frees it (cudaFreeHost). Thread-safe (immutable).
class PinnedBuffer {
 public:
  // Errors: InvalidArgument (0 bytes), NoSpace, Unavailable (no device).
  static Result<std::unique_ptr<PinnedBuffer>> Allocate(size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  std::span<std::byte> span() const { return bytes_; }

 private:
  explicit PinnedBuffer(std::span<std::byte> bytes) : bytes_(bytes) {}
  const std::span<std::byte> bytes_;
};

}  // namespace kvtier::gpu

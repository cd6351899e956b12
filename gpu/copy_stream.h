// CopyStream: one non-blocking stream for a tier's own copies, with a
// fixed ring of fences (events) so that a completion thread can wait for
// each copy in turn. Everything is created once; Submit allocates nothing.
// No CUDA header.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/mutex.h"
#include "gpu/cuda_handles.h"
#include "kvtier/result.h"

namespace kvtier::gpu {

// Thread-safe. Copies on the stream run in submission order, so fences
// complete in order too; a range freed after its last copy was submitted
// may be reused by any copy submitted later.
class CopyStream {
 public:
  // A stream and `fences` events (cudaEventDisableTiming |
  // cudaEventBlockingSync: Wait sleeps instead of spinning) on device
  // `ordinal`. Errors: InvalidArgument (0 fences), Unavailable, IoError.
  static Result<std::unique_ptr<CopyStream>> Create(uint32_t fences, int ordinal = 0);
  ~CopyStream();  // waits for the copies in flight
  CopyStream(const CopyStream&) = delete;
  CopyStream& operator=(const CopyStream&) = delete;

  // Enqueues cudaMemcpyAsync(dst, src, bytes, kind) and records a fence
  // after it, atomically with respect to other Submits; returns the fence
  // for Wait. Host memory must be pinned for the copy to be asynchronous.
  // Errors: Busy (every fence is in flight: Wait for some first),
  // InvalidArgument, IoError. On error nothing was enqueued.
  Result<uint32_t> Submit(void* dst, const void* src, uint64_t bytes, CopyKind kind) EXCLUDES(mu_);
  // Blocks the calling thread until `fence`'s copy is done, then frees the
  // fence. Each fence Submit returned is waited for exactly once. Returns
  // the copy's error, if any (IoError for a device fault).
  Status Wait(uint32_t fence) EXCLUDES(mu_);

  uint32_t fences_in_flight() const EXCLUDES(mu_);
  int ordinal() const { return ordinal_; }

 private:
  CopyStream(StreamHandle stream, std::vector<EventHandle> events, int ordinal)
      : stream_(stream), events_(std::move(events)), ordinal_(ordinal), busy_(events_.size(), false) {}

  const StreamHandle stream_;
  const std::vector<EventHandle> events_;
  const int ordinal_;
  mutable Mutex mu_;  // a leaf; Submit holds it across its enqueues (not I/O: they do not wait)
  std::vector<bool> busy_ GUARDED_BY(mu_);
  uint32_t next_ GUARDED_BY(mu_) = 0;  // the fence the next Submit takes
  uint32_t in_flight_ GUARDED_BY(mu_) = 0;
};

}  // namespace kvtier::gpu

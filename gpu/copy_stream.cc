#include "gpu/copy_stream.h"

#include <string>

#include "gpu/copy_kind.h"
#include "gpu/cuda_status.h"

namespace kvtier::gpu {

Result<std::unique_ptr<CopyStream>> CopyStream::Create(uint32_t fences, int ordinal) {
  if (fences == 0) return InvalidArgument("a copy stream needs at least one fence");
  if (Status s = CudaStatus(cudaSetDevice(ordinal), "cudaSetDevice(" + std::to_string(ordinal) + ")"); !s.ok()) {
    return s;
  }
  cudaStream_t stream = nullptr;
  if (Status s = CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
      !s.ok()) {
    return s;
  }
  std::vector<EventHandle> events;
  for (uint32_t i = 0; i < fences; ++i) {
    cudaEvent_t event = nullptr;
    Status s = CudaStatus(cudaEventCreateWithFlags(&event, cudaEventDisableTiming | cudaEventBlockingSync),
                          "cudaEventCreateWithFlags");
    if (!s.ok()) {
      for (EventHandle e : events) (void)cudaEventDestroy(e);
      (void)cudaStreamDestroy(stream);
      return s;
    }
    events.push_back(event);
  }
  return std::unique_ptr<CopyStream>(new CopyStream(stream, std::move(events), ordinal));
}

CopyStream::~CopyStream() {
  (void)cudaSetDevice(ordinal_);
  (void)cudaStreamSynchronize(stream_);
  for (EventHandle e : events_) (void)cudaEventDestroy(e);
  (void)cudaStreamDestroy(stream_);
}

Result<uint32_t> CopyStream::Submit(void* dst, const void* src, uint64_t bytes, CopyKind kind) {
  MutexLock lock(mu_);  // the copy and its fence are one unit in stream order
  const uint32_t fence = next_;
  if (busy_[fence]) return Busy("all " + std::to_string(events_.size()) + " copy fences are in flight");
  if (Status s = CudaStatus(cudaSetDevice(ordinal_), "cudaSetDevice"); !s.ok()) return s;
  if (Status s = CudaStatus(cudaMemcpyAsync(dst, src, bytes, ToCuda(kind), stream_), "cudaMemcpyAsync"); !s.ok()) {
    return s;
  }
  if (Status s = CudaStatus(cudaEventRecord(events_[fence], stream_), "cudaEventRecord"); !s.ok()) {
    // The copy is enqueued without a fence: wait for it here so the
    // caller may free its buffers as "nothing was enqueued" promises.
    (void)cudaStreamSynchronize(stream_);
    return s;
  }
  busy_[fence] = true;
  ++in_flight_;
  next_ = (next_ + 1) % static_cast<uint32_t>(events_.size());
  return fence;
}

Status CopyStream::Wait(uint32_t fence) {
  if (fence >= events_.size()) return InvalidArgument("no fence " + std::to_string(fence));
  (void)cudaSetDevice(ordinal_);  // this thread may never have used the device
  Status outcome = CudaStatus(cudaEventSynchronize(events_[fence]), "copy on the tier's stream");
  MutexLock lock(mu_);
  if (busy_[fence]) {
    busy_[fence] = false;
    --in_flight_;
  }
  return outcome;
}

uint32_t CopyStream::fences_in_flight() const {
  MutexLock lock(mu_);
  return in_flight_;
}

}  // namespace kvtier::gpu

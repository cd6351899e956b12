#include "gpu/ipc_event.h"

#include <cstring>
#include <string>

#include "gpu/cuda_status.h"

namespace kvtier::gpu {

Result<std::unique_ptr<ImportedEvent>> ImportedEvent::Open(const IpcEventHandle& handle, int ordinal) {
  if (Status s = CudaStatus(cudaSetDevice(ordinal), "cudaSetDevice(" + std::to_string(ordinal) + ")"); !s.ok()) {
    return s;
  }
  cudaIpcEventHandle_t raw;
  static_assert(sizeof(raw) == kIpcHandleBytes);
  std::memcpy(&raw, handle.bytes.data(), kIpcHandleBytes);
  cudaEvent_t event = nullptr;
  if (Status s = CudaStatus(cudaIpcOpenEventHandle(&event, raw), "cudaIpcOpenEventHandle"); !s.ok()) return s;
  return std::unique_ptr<ImportedEvent>(new ImportedEvent(event, ordinal));
}

ImportedEvent::~ImportedEvent() {
  (void)cudaSetDevice(ordinal_);
  (void)cudaEventDestroy(event_);
}

Status ImportedEvent::MakeStreamWait(StreamHandle stream) const {
  return CudaStatus(cudaStreamWaitEvent(stream, event_, 0), "cudaStreamWaitEvent (imported event)");
}

Status ImportedEvent::Synchronize() const {
  return CudaStatus(cudaEventSynchronize(event_), "cudaEventSynchronize (imported event)");
}

Result<bool> ImportedEvent::Ready() const {
  const cudaError_t error = cudaEventQuery(event_);
  if (error == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  if (Status s = CudaStatus(error, "cudaEventQuery (imported event)"); !s.ok()) return s;
  return true;
}

Status ImportedEvent::Record(StreamHandle stream) {
  return CudaStatus(cudaEventRecord(event_, stream), "cudaEventRecord (imported event)");
}

}  // namespace kvtier::gpu

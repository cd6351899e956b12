// ImportedEvent: another process's interprocess event (a LayerCopier
// layer event exported with ExportLayerEvent), opened once and destroyed
// with this object. No CUDA header.
//
// The ordering rule of gpu/layer_copier.h applies: wait on it only after
// the exporter told you (over the control socket) that it recorded the
// batch you want, and tell the exporter when you have issued your wait
// before it records the next batch. The exporter must keep its event alive
// until this object is gone (CUDA: undefined behaviour otherwise).
#pragma once

#include <memory>

#include "gpu/cuda_handles.h"
#include "gpu/ipc_handle.h"
#include "kvtier/result.h"

namespace kvtier::gpu {

// Thread-safe in the same sense as LayerCopier (immutable; CUDA orders).
class ImportedEvent {
 public:
  // cudaIpcOpenEventHandle on device `ordinal`. Errors: InvalidArgument (a
  // handle of this process, or not a handle), Unavailable (no device, IPC
  // events unsupported), IoError.
  static Result<std::unique_ptr<ImportedEvent>> Open(const IpcEventHandle& handle, int ordinal = 0);
  ~ImportedEvent();  // cudaEventDestroy of this process's copy
  ImportedEvent(const ImportedEvent&) = delete;
  ImportedEvent& operator=(const ImportedEvent&) = delete;

  // `stream` waits on the GPU for the exporter's last record issued before
  // this call (cudaStreamWaitEvent). The host thread does not wait.
  Status MakeStreamWait(StreamHandle stream) const;
  // Blocks the calling thread until that record has completed.
  Status Synchronize() const;
  // Whether it has completed, without waiting.
  Result<bool> Ready() const;
  // Records the event on `stream` of this process (the reverse direction:
  // "I am done reading"); the exporter may then wait on it. The same
  // one-message-per-batch rule applies.
  Status Record(StreamHandle stream);

  EventHandle event() const { return event_; }

 private:
  ImportedEvent(EventHandle event, int ordinal) : event_(event), ordinal_(ordinal) {}
  const EventHandle event_;
  const int ordinal_;
};

}  // namespace kvtier::gpu

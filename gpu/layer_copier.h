// LayerCopier: layer-wise loading and saving (docs/POLICIES.md). One
// dedicated non-blocking stream carries the copies; one event per layer
// marks "layer l has arrived", so the engine's compute stream waits for
// exactly the layer it is about to use, on the GPU, without blocking a host
// thread. No CUDA header (gpu/cuda_handles.h).
//
// Ordering rules:
// - A layer's event is recorded after the copies of each CopyLayer /
//   CopyLayerParts call for that layer. MakeStreamWait, Synchronize and
//   LayerReady refer to the last record issued *before* they are called: a
//   copy enqueued afterwards is not waited for. Issue the copies of a batch
//   first, then the waits (one host thread, or the caller orders them).
// - A layer never copied counts as arrived (CUDA: a never-recorded event is
//   complete).
// - Reusing a destination for the next batch: the copier's stream does not
//   know when the caller is done reading the previous batch; call
//   WaitForStream(caller) before enqueueing copies that overwrite it.
// - Cross-process (interprocess_events): another process opens a layer's
//   event (ImportedEvent, gpu/ipc_event.h) once. It must call its wait only
//   after this process *recorded* the event for the batch it cares about,
//   which it can only know from a message this process sends after
//   CopyLayer returned (the control socket): a wait issued before the
//   record waits for the previous batch, or for nothing. And this process
//   must not re-record a layer (the next batch) before the other process
//   has issued its wait, or it would wait for the wrong batch: one message
//   per batch, each way. Timing is disabled on interprocess events.
//
// Thread-safety: calls may come from any thread (the CUDA runtime is
// thread-safe and the object is immutable after Create); ordering between
// calls made on different threads is the caller's to establish.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "gpu/cuda_handles.h"
#include "gpu/ipc_handle.h"
#include "kvtier/result.h"

namespace kvtier::gpu {

struct LayerCopierOptions {
  int ordinal = 0;
  // Create the per-layer events with cudaEventInterprocess so that
  // ExportLayerEvent works (cudaEventDisableTiming is always set).
  bool interprocess_events = false;
};

class LayerCopier {
 public:
  // A stream (cudaStreamNonBlocking: it does not synchronize with the
  // legacy default stream) and `layer_count` events on device
  // options.ordinal. Errors: InvalidArgument (0 layers, bad ordinal),
  // Unavailable (no device), NoSpace, IoError.
  static Result<std::unique_ptr<LayerCopier>> Create(uint32_t layer_count, LayerCopierOptions options = {});
  // Waits for the copies in flight, then destroys the events and the
  // stream. Events exported to other processes must no longer be in use
  // there (CUDA: using an imported event after the exporter destroyed it
  // is undefined).
  ~LayerCopier();
  LayerCopier(const LayerCopier&) = delete;
  LayerCopier& operator=(const LayerCopier&) = delete;

  // Enqueues cudaMemcpyAsync(dst, src, bytes, kind) on the stream, then
  // records `layer`'s event. Returns at once. Host memory must be pinned
  // (HostRegistration, PinnedBuffer) for the copy to be asynchronous; a
  // pageable source is copied synchronously by the runtime. `src` and
  // `dst` are borrowed until the layer has arrived. Errors:
  // InvalidArgument (layer out of range, bad pointer), IoError.
  Status CopyLayer(uint32_t layer, void* dst, const void* src, uint64_t bytes, CopyKind kind);

  // The same for a layer made of several pieces (one per block of a
  // batch): every piece is enqueued, then the event is recorded once.
  struct Piece {
    void* dst = nullptr;
    const void* src = nullptr;
    uint64_t bytes = 0;
  };
  Status CopyLayerParts(uint32_t layer, std::span<const Piece> pieces, CopyKind kind);

  // Makes `caller` (the engine's compute stream, a cudaStream_t) wait on
  // the GPU until `layer` has arrived (cudaStreamWaitEvent); the host
  // thread does not wait. Errors: InvalidArgument (layer, stream), IoError.
  Status MakeStreamWait(StreamHandle caller, uint32_t layer) const;
  // Blocks the calling thread until `layer` has arrived. A failed copy
  // reports its error here (IoError, or the code CudaStatus gives it).
  Status Synchronize(uint32_t layer) const;
  // Whether `layer` has arrived, without waiting (cudaEventQuery).
  Result<bool> LayerReady(uint32_t layer) const;
  // Blocks until every copy enqueued so far is done.
  Status SynchronizeAll() const;
  // Makes the copier's stream wait for the work enqueued so far on
  // `other` (e.g. the compute that still reads the previous batch).
  Status WaitForStream(StreamHandle other);

  // The handle of `layer`'s event for another process (ImportedEvent).
  // Errors: FailedPrecondition (not created with interprocess_events),
  // InvalidArgument (layer), Unavailable (IPC events unsupported).
  Result<IpcEventHandle> ExportLayerEvent(uint32_t layer) const;

  StreamHandle stream() const { return stream_; }
  EventHandle event(uint32_t layer) const { return events_.at(layer); }
  uint32_t layer_count() const { return static_cast<uint32_t>(events_.size()); }
  int ordinal() const { return options_.ordinal; }

 private:
  LayerCopier(LayerCopierOptions options, StreamHandle stream, std::vector<EventHandle> events, EventHandle reverse)
      : options_(options), stream_(stream), events_(std::move(events)), reverse_(reverse) {}
  Status CheckLayer(uint32_t layer) const;

  const LayerCopierOptions options_;
  const StreamHandle stream_;
  const std::vector<EventHandle> events_;
  const EventHandle reverse_;  // recorded on `other` by WaitForStream
};

}  // namespace kvtier::gpu

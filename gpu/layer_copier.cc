#include "gpu/layer_copier.h"

#include <cstring>
#include <string>

#include "gpu/copy_kind.h"
#include "gpu/cuda_status.h"

namespace kvtier::gpu {
namespace {

// Destroys what Create made before it failed.
void Destroy(cudaStream_t stream, const std::vector<EventHandle>& events, cudaEvent_t reverse) {
  for (EventHandle e : events) (void)cudaEventDestroy(e);
  if (reverse != nullptr) (void)cudaEventDestroy(reverse);
  if (stream != nullptr) (void)cudaStreamDestroy(stream);
}

}  // namespace

Result<std::unique_ptr<LayerCopier>> LayerCopier::Create(uint32_t layer_count, LayerCopierOptions options) {
  if (layer_count == 0) return InvalidArgument("a layer copier needs at least one layer");
  if (Status s = CudaStatus(cudaSetDevice(options.ordinal), "cudaSetDevice(" + std::to_string(options.ordinal) + ")");
      !s.ok()) {
    return s;
  }
  cudaStream_t stream = nullptr;
  if (Status s = CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
      !s.ok()) {
    return s;
  }
  const unsigned flags = cudaEventDisableTiming | (options.interprocess_events ? cudaEventInterprocess : 0u);
  std::vector<EventHandle> events;
  events.reserve(layer_count);
  cudaEvent_t reverse = nullptr;
  for (uint32_t i = 0; i < layer_count; ++i) {
    cudaEvent_t event = nullptr;
    if (Status s = CudaStatus(cudaEventCreateWithFlags(&event, flags), "cudaEventCreateWithFlags"); !s.ok()) {
      Destroy(stream, events, reverse);
      return s;
    }
    events.push_back(event);
  }
  if (Status s = CudaStatus(cudaEventCreateWithFlags(&reverse, cudaEventDisableTiming), "cudaEventCreateWithFlags");
      !s.ok()) {
    Destroy(stream, events, nullptr);
    return s;
  }
  return std::unique_ptr<LayerCopier>(new LayerCopier(options, stream, std::move(events), reverse));
}

LayerCopier::~LayerCopier() {
  (void)cudaSetDevice(options_.ordinal);
  (void)cudaStreamSynchronize(stream_);  // copies in flight still use the events and buffers
  Destroy(stream_, events_, reverse_);
}

Status LayerCopier::CheckLayer(uint32_t layer) const {
  if (layer >= events_.size()) {
    return InvalidArgument("layer " + std::to_string(layer) + " of a copier of " + std::to_string(events_.size()) +
                           " layers");
  }
  return Status::Ok();
}

Status LayerCopier::CopyLayer(uint32_t layer, void* dst, const void* src, uint64_t bytes, CopyKind kind) {
  const Piece piece{dst, src, bytes};
  return CopyLayerParts(layer, std::span<const Piece>(&piece, 1), kind);
}

Status LayerCopier::CopyLayerParts(uint32_t layer, std::span<const Piece> pieces, CopyKind kind) {
  if (Status s = CheckLayer(layer); !s.ok()) return s;
  if (Status s = CudaStatus(cudaSetDevice(options_.ordinal), "cudaSetDevice"); !s.ok()) return s;
  for (const Piece& piece : pieces) {
    if (piece.bytes == 0) continue;
    if (Status s = CudaStatus(cudaMemcpyAsync(piece.dst, piece.src, piece.bytes, ToCuda(kind), stream_),
                              "cudaMemcpyAsync (layer " + std::to_string(layer) + ")");
        !s.ok()) {
      return s;
    }
  }
  return CudaStatus(cudaEventRecord(events_[layer], stream_), "cudaEventRecord (layer " + std::to_string(layer) + ")");
}

Status LayerCopier::MakeStreamWait(StreamHandle caller, uint32_t layer) const {
  if (Status s = CheckLayer(layer); !s.ok()) return s;
  return CudaStatus(cudaStreamWaitEvent(caller, events_[layer], 0),
                    "cudaStreamWaitEvent (layer " + std::to_string(layer) + ")");
}

Status LayerCopier::Synchronize(uint32_t layer) const {
  if (Status s = CheckLayer(layer); !s.ok()) return s;
  return CudaStatus(cudaEventSynchronize(events_[layer]), "cudaEventSynchronize (layer " + std::to_string(layer) + ")");
}

Result<bool> LayerCopier::LayerReady(uint32_t layer) const {
  if (Status s = CheckLayer(layer); !s.ok()) return s;
  const cudaError_t error = cudaEventQuery(events_[layer]);
  if (error == cudaErrorNotReady) {
    (void)cudaGetLastError();  // "not ready" is an answer, not an error
    return false;
  }
  if (Status s = CudaStatus(error, "cudaEventQuery (layer " + std::to_string(layer) + ")"); !s.ok()) return s;
  return true;
}

Status LayerCopier::SynchronizeAll() const {
  return CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

Status LayerCopier::WaitForStream(StreamHandle other) {
  if (Status s = CudaStatus(cudaEventRecord(reverse_, other), "cudaEventRecord (caller stream)"); !s.ok()) return s;
  return CudaStatus(cudaStreamWaitEvent(stream_, reverse_, 0), "cudaStreamWaitEvent (copier stream)");
}

Result<IpcEventHandle> LayerCopier::ExportLayerEvent(uint32_t layer) const {
  if (Status s = CheckLayer(layer); !s.ok()) return s;
  if (!options_.interprocess_events) {
    return FailedPrecondition("the layer copier was created without interprocess_events");
  }
  if (Status s = CudaStatus(cudaSetDevice(options_.ordinal), "cudaSetDevice"); !s.ok()) return s;
  cudaIpcEventHandle_t handle;
  static_assert(sizeof(handle) == kIpcHandleBytes);
  if (Status s = CudaStatus(cudaIpcGetEventHandle(&handle, events_[layer]), "cudaIpcGetEventHandle"); !s.ok()) {
    return s;
  }
  IpcEventHandle out;
  std::memcpy(out.bytes.data(), &handle, kIpcHandleBytes);
  return out;
}

}  // namespace kvtier::gpu

// DeviceLoadCopier over kvtier_gpu (built with KVTIER_HAVE_CUDA).
#include <vector>

#include "client_lib/device_copy.h"
#include "gpu/host_registration.h"
#include "gpu/layer_copier.h"

namespace kvtier::internal {
namespace {

class CudaArenaRegistration final : public ArenaRegistration {
 public:
  explicit CudaArenaRegistration(std::unique_ptr<gpu::HostRegistration> r) : registration_(std::move(r)) {}

 private:
  std::unique_ptr<gpu::HostRegistration> registration_;
};

class CudaLoadCopier final : public DeviceLoadCopier {
 public:
  explicit CudaLoadCopier(std::unique_ptr<gpu::LayerCopier> copier) : copier_(std::move(copier)) {}
  ~CudaLoadCopier() override { copier_->SynchronizeAll().IgnoreError(); }  // the destructor of copier_ waits too

  Status EnqueueLayer(uint32_t layer, std::span<const Piece> pieces) override {
    std::vector<gpu::LayerCopier::Piece> parts;
    parts.reserve(pieces.size());
    for (const Piece& p : pieces) parts.push_back(gpu::LayerCopier::Piece{p.dst, p.src, p.bytes});
    return copier_->CopyLayerParts(layer, parts, gpu::CopyKind::kHostToDevice);
  }
  Status MakeStreamWait(void* stream, uint32_t layer) override {
    return copier_->MakeStreamWait(static_cast<gpu::StreamHandle>(stream), layer);
  }
  Status SynchronizeAll() override { return copier_->SynchronizeAll(); }

 private:
  std::unique_ptr<gpu::LayerCopier> copier_;
};

}  // namespace

Result<std::unique_ptr<ArenaRegistration>> ArenaRegistration::Register(std::span<std::byte> arena) {
  auto registration = gpu::HostRegistration::Register(arena);
  if (!registration.ok()) return registration.status();
  return std::unique_ptr<ArenaRegistration>(new CudaArenaRegistration(std::move(*registration)));
}

Result<std::unique_ptr<DeviceLoadCopier>> DeviceLoadCopier::Create(uint32_t layers, int ordinal) {
  gpu::LayerCopierOptions options;
  options.ordinal = ordinal;
  auto copier = gpu::LayerCopier::Create(layers, options);
  if (!copier.ok()) return copier.status();
  return std::unique_ptr<DeviceLoadCopier>(new CudaLoadCopier(std::move(*copier)));
}

}  // namespace kvtier::internal

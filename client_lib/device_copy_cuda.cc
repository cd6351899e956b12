// DeviceLoadCopier over kvtier_gpu (built with KVTIER_HAVE_CUDA).
#include <cstring>
#include <vector>

#include "client_lib/device_copy.h"
#include "gpu/device_mapping.h"
#include "gpu/device_probe.h"
#include "gpu/host_registration.h"
#include "gpu/ipc_handle.h"
#include "gpu/layer_copier.h"

namespace kvtier::internal {
namespace {

class CudaArenaRegistration final : public ArenaRegistration {
 public:
  explicit CudaArenaRegistration(std::unique_ptr<gpu::HostRegistration> r) : registration_(std::move(r)) {}

 private:
  std::unique_ptr<gpu::HostRegistration> registration_;
};

class CudaPoolMapping final : public DevicePoolMapping {
 public:
  explicit CudaPoolMapping(std::unique_ptr<gpu::DeviceMapping> m)
      : DevicePoolMapping(static_cast<const std::byte*>(m->base()), m->bytes(), m->ordinal()), mapping_(std::move(m)) {}

 private:
  std::unique_ptr<gpu::DeviceMapping> mapping_;
};

class CudaLoadCopier final : public DeviceLoadCopier {
 public:
  explicit CudaLoadCopier(std::unique_ptr<gpu::LayerCopier> copier) : copier_(std::move(copier)) {}
  ~CudaLoadCopier() override { copier_->SynchronizeAll().IgnoreError(); }  // the destructor of copier_ waits too

  // One CopyLayerParts per kind of copy: each records the layer's event,
  // and the last record (after every piece, one stream) is the one waited on.
  Status EnqueueLayer(uint32_t layer, std::span<const Piece> pieces) override {
    std::vector<gpu::LayerCopier::Piece> from_host, from_device;
    for (const Piece& p : pieces) {
      (p.source == Source::kDevicePool ? from_device : from_host).push_back({p.dst, p.src, p.bytes});
    }
    if (!from_device.empty()) {
      if (Status s = copier_->CopyLayerParts(layer, from_device, gpu::CopyKind::kDeviceToDevice); !s.ok()) return s;
      if (from_host.empty()) return Status::Ok();
    }
    return copier_->CopyLayerParts(layer, from_host, gpu::CopyKind::kHostToDevice);
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

Result<int> DevicePoolMapping::OrdinalOf(const DevicePoolOffer& offer) {
  return gpu::OrdinalOfPciBusId(offer.pci_bus_id);
}

Result<std::unique_ptr<DevicePoolMapping>> DevicePoolMapping::Open(const DevicePoolOffer& offer, int ordinal) {
  if (offer.ipc_handle.size() != gpu::kIpcHandleBytes) {
    return InvalidArgument("the device pool's IPC handle is " + std::to_string(offer.ipc_handle.size()) +
                           " bytes, not " + std::to_string(gpu::kIpcHandleBytes));
  }
  gpu::IpcMemHandle handle;
  std::memcpy(handle.bytes.data(), offer.ipc_handle.data(), gpu::kIpcHandleBytes);
  auto mapping = gpu::DeviceMapping::Open(handle, offer.bytes, ordinal);
  if (!mapping.ok()) return mapping.status();
  return std::unique_ptr<DevicePoolMapping>(new CudaPoolMapping(std::move(*mapping)));
}

Result<std::unique_ptr<DeviceLoadCopier>> DeviceLoadCopier::Create(uint32_t layers, int ordinal) {
  gpu::LayerCopierOptions options;
  options.ordinal = ordinal;
  auto copier = gpu::LayerCopier::Create(layers, options);
  if (!copier.ok()) return copier.status();
  return std::unique_ptr<DeviceLoadCopier>(new CudaLoadCopier(std::move(*copier)));
}

}  // namespace kvtier::internal

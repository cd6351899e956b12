// DeviceLoadCopier without CUDA: the client library was built without the
// CUDA toolkit (KVTIER_CUDA=OFF, or AUTO on a machine without it).
#include "client_lib/device_copy.h"

namespace kvtier::internal {
namespace {

Status NoCuda() {
  return Unimplemented(
      "GPU destinations need libkvtier_client built with CUDA (KVTIER_CUDA=AUTO or ON "
      "with the CUDA toolkit installed)");
}

}  // namespace

Result<std::unique_ptr<ArenaRegistration>> ArenaRegistration::Register(std::span<std::byte>) { return NoCuda(); }

Result<std::unique_ptr<DeviceLoadCopier>> DeviceLoadCopier::Create(uint32_t, int) { return NoCuda(); }

Result<int> DevicePoolMapping::OrdinalOf(const DevicePoolOffer&) { return NoCuda(); }

Result<std::unique_ptr<DevicePoolMapping>> DevicePoolMapping::Open(const DevicePoolOffer&, int) { return NoCuda(); }

}  // namespace kvtier::internal

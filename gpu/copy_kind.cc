#include "gpu/copy_kind.h"

namespace kvtier::gpu {

cudaMemcpyKind ToCuda(CopyKind kind) {
  switch (kind) {
    case CopyKind::kHostToDevice:
      return cudaMemcpyHostToDevice;
    case CopyKind::kDeviceToHost:
      return cudaMemcpyDeviceToHost;
    case CopyKind::kDeviceToDevice:
      return cudaMemcpyDeviceToDevice;
    case CopyKind::kDefault:
      return cudaMemcpyDefault;
  }
  return cudaMemcpyDefault;
}

}  // namespace kvtier::gpu

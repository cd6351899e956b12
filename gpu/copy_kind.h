// CopyKind -> cudaMemcpyKind. Pulls in cuda_runtime.h: for gpu/*.cc only.
#pragma once

#include <cuda_runtime.h>

#include "gpu/cuda_handles.h"

namespace kvtier::gpu {

cudaMemcpyKind ToCuda(CopyKind kind);

}  // namespace kvtier::gpu

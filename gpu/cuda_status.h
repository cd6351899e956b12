// cudaError_t -> kvtier::Status. This header pulls in cuda_runtime.h: only
// gpu/*.cc (and code that calls CUDA itself, the tests and the bench)
// include it; the other gpu/ headers are free of CUDA types.
#pragma once

#include <cuda_runtime.h>

#include <string_view>

#include "kvtier/status.h"

namespace kvtier::gpu {

// Ok for cudaSuccess; otherwise a Status whose message is
// "<what>: <cudaErrorName> (<cuda error string>)" and whose code says what a
// caller can do about it:
//   NoSpace            out of device or pinned memory
//   InvalidArgument    a bad value, pointer or handle was passed
//   AlreadyExists      host memory already registered, handle already open
//   Unavailable        no usable device or driver (no GPU, driver too old,
//                      device busy or prohibited, IPC unsupported)
//   IoError            anything else, including sticky device faults
//                      (illegal address, ECC): the context is unusable
// It also clears the runtime's last error so a later call does not see it.
Status CudaStatus(cudaError_t error, std::string_view what);

}  // namespace kvtier::gpu

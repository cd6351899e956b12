// CUDA stream and event handles without cuda_runtime.h, for gpu/ headers.
// cudaStream_t is `CUstream_st*` and cudaEvent_t is `CUevent_st*`
// (driver_types.h): a caller passes its cudaStream_t as it is, and code
// that includes cuda_runtime.h uses these as the CUDA types they are.
#pragma once

struct CUstream_st;
struct CUevent_st;

namespace kvtier::gpu {

using StreamHandle = CUstream_st*;  // == cudaStream_t
using EventHandle = CUevent_st*;    // == cudaEvent_t

// Direction of a copy (cudaMemcpyKind without the header). kDefault lets
// the runtime infer it from the pointers (unified addressing).
enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice, kDefault };

}  // namespace kvtier::gpu

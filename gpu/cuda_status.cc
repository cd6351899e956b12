#include "gpu/cuda_status.h"

#include <string>

namespace kvtier::gpu {
namespace {

StatusCode CodeFor(cudaError_t error) {
  switch (error) {
    case cudaErrorMemoryAllocation:
      return StatusCode::kNoSpace;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidResourceHandle:
    case cudaErrorInvalidDevice:
    case cudaErrorHostMemoryNotRegistered:
      return StatusCode::kInvalidArgument;
    case cudaErrorHostMemoryAlreadyRegistered:
    case cudaErrorAlreadyMapped:
      return StatusCode::kAlreadyExists;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInitializationError:
    case cudaErrorDevicesUnavailable:
    case cudaErrorNotSupported:
    case cudaErrorNotPermitted:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorStubLibrary:
    case cudaErrorCallRequiresNewerDriver:
    case cudaErrorSystemNotReady:
    case cudaErrorCudartUnloading:
    case cudaErrorDeviceUninitialized:
    case cudaErrorMapBufferObjectFailed:
      return StatusCode::kUnavailable;
    default:
      return StatusCode::kIoError;
  }
}

}  // namespace

Status CudaStatus(cudaError_t error, std::string_view what) {
  if (error == cudaSuccess) return Status::Ok();
  (void)cudaGetLastError();  // clears a non-sticky error; a sticky one stays, as it must
  std::string message(what);
  message += ": ";
  message += cudaGetErrorName(error);
  message += " (";
  message += cudaGetErrorString(error);
  message += ")";
  return Status(CodeFor(error), std::move(message));
}

}  // namespace kvtier::gpu

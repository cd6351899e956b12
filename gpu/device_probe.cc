#include "gpu/device_probe.h"

#include <charconv>
#include <cstdio>
#include <string>

#include "gpu/cuda_status.h"

namespace kvtier::gpu {
namespace {

// One hexadecimal field of a PCI address: 1 to `max_digits` digits, at
// most `max`; false otherwise.
bool ParseHexField(std::string_view text, size_t max_digits, uint64_t max, uint64_t& value) {
  if (text.empty() || text.size() > max_digits) return false;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value, 16);
  return error == std::errc() && end == text.data() + text.size() && value <= max;
}

}  // namespace

Result<int> DeviceCount() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    return Unavailable("no device: " + CudaStatus(error, "cudaGetDeviceCount").message());
  }
  if (count <= 0) return Unavailable("no device: cudaGetDeviceCount found none");
  return count;
}

Result<DeviceInfo> ProbeDevice(int ordinal) {
  Result<int> count = DeviceCount();
  if (!count.ok()) return count.status();
  if (ordinal < 0 || ordinal >= *count) {
    return InvalidArgument("device " + std::to_string(ordinal) + " does not exist (" + std::to_string(*count) +
                           " found)");
  }
  cudaDeviceProp prop{};
  if (Status s = CudaStatus(cudaGetDeviceProperties(&prop, ordinal), "cudaGetDeviceProperties"); !s.ok()) return s;
  DeviceInfo info;
  info.ordinal = ordinal;
  info.name = prop.name;
  info.compute_major = prop.major;
  info.compute_minor = prop.minor;
  info.total_bytes = prop.totalGlobalMem;
  info.unified_addressing = prop.unifiedAddressing != 0;
  int ipc_events = 0;
  if (Status s = CudaStatus(cudaDeviceGetAttribute(&ipc_events, cudaDevAttrIpcEventSupport, ordinal),
                            "cudaDeviceGetAttribute(IpcEventSupport)");
      !s.ok()) {
    return s;
  }
  info.ipc_events = ipc_events != 0;
  char bus_id[32] = {};  // CUDA writes at most 13 bytes ("0000:3B:00.0")
  if (Status s = CudaStatus(cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), ordinal), "cudaDeviceGetPCIBusId"); !s.ok()) {
    return s;
  }
  Result<std::string> canonical = CanonicalPciBusId(bus_id);
  if (!canonical.ok()) return Internal("cudaDeviceGetPCIBusId: " + canonical.status().message());
  info.pci_bus_id = std::move(*canonical);
  if (Status s = CudaStatus(cudaSetDevice(ordinal), "cudaSetDevice"); !s.ok()) return s;
  size_t free_bytes = 0, total_bytes = 0;
  if (Status s = CudaStatus(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo"); !s.ok()) return s;
  info.free_bytes = free_bytes;
  return info;
}

Result<std::string> CanonicalPciBusId(std::string_view bus_id) {
  const auto bad = [&] {
    return InvalidArgument("\"" + std::string(bus_id) + "\" is not a PCI bus id ([domain:]bus:device.function, hex)");
  };
  // [domain:]bus:device.function
  const size_t last_colon = bus_id.rfind(':');
  const size_t dot = bus_id.rfind('.');
  if (last_colon == std::string_view::npos || dot == std::string_view::npos || dot < last_colon) return bad();
  std::string_view head = bus_id.substr(0, last_colon);
  std::string_view domain_text = "0";
  if (const size_t colon = head.find(':'); colon != std::string_view::npos) {
    domain_text = head.substr(0, colon);
    head = head.substr(colon + 1);
  }
  uint64_t domain = 0, bus = 0, device = 0, function = 0;
  if (!ParseHexField(domain_text, 8, 0xffffffff, domain) || !ParseHexField(head, 2, 0xff, bus) ||
      !ParseHexField(bus_id.substr(last_colon + 1, dot - last_colon - 1), 2, 0x1f, device) ||
      !ParseHexField(bus_id.substr(dot + 1), 1, 7, function)) {
    return bad();
  }
  char text[32];
  std::snprintf(text, sizeof(text), "%04x:%02x:%02x.%x", static_cast<unsigned>(domain), static_cast<unsigned>(bus),
                static_cast<unsigned>(device), static_cast<unsigned>(function));
  return std::string(text);
}

Result<int> OrdinalOfPciBusId(const std::string& bus_id) {
  Result<std::string> canonical = CanonicalPciBusId(bus_id);
  if (!canonical.ok()) return canonical.status();
  Result<int> count = DeviceCount();
  if (!count.ok()) return count.status();
  int ordinal = -1;
  const cudaError_t error = cudaDeviceGetByPCIBusId(&ordinal, canonical->c_str());
  if (error == cudaErrorInvalidDevice || error == cudaErrorInvalidValue) {
    (void)cudaGetLastError();  // an answer ("not here"), not a sticky error
    return NotFound("no GPU at PCI bus id " + *canonical + " is visible to this process (" + std::to_string(*count) +
                    " visible; CUDA_VISIBLE_DEVICES may hide it)");
  }
  if (Status s = CudaStatus(error, "cudaDeviceGetByPCIBusId(" + *canonical + ")"); !s.ok()) return s;
  return ordinal;
}

}  // namespace kvtier::gpu

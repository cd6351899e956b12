// The device probe, CUDA error mapping and handle encoding: these run with
// or without a GPU (on a host without a driver the probe must say so).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "gpu/cuda_status.h"
#include "gpu/device_pool.h"
#include "gpu/device_probe.h"
#include "gpu/host_registration.h"
#include "gpu/ipc_handle.h"
#include "gpu/layer_copier.h"

namespace kvtier::gpu {
namespace {

TEST(DeviceProbeTest, ReportsDevicesOrSaysWhyNot) {
  Result<int> count = DeviceCount();
  if (count.ok()) {
    EXPECT_GE(*count, 1);
    Result<DeviceInfo> info = ProbeDevice(0);
    ASSERT_TRUE(info.ok()) << info.status().ToString();
    EXPECT_FALSE(info->name.empty());
    EXPECT_GT(info->total_bytes, 0u);
    EXPECT_EQ(ProbeDevice(*count).status().code(), StatusCode::kInvalidArgument);
  } else {
    EXPECT_EQ(count.status().code(), StatusCode::kUnavailable);
    EXPECT_EQ(count.status().message().rfind("no device: ", 0), 0u) << count.status().message();
    EXPECT_EQ(ProbeDevice(0).status().code(), StatusCode::kUnavailable);
    // The objects that need a device say so too, and nothing aborts.
    EXPECT_EQ(DevicePool::Create(1 << 20).status().code(), StatusCode::kUnavailable);
    EXPECT_EQ(LayerCopier::Create(4).status().code(), StatusCode::kUnavailable);
  }
}

TEST(CudaStatusTest, CarriesTheCudaErrorAndAUsefulCode) {
  EXPECT_TRUE(CudaStatus(cudaSuccess, "anything").ok());
  Status oom = CudaStatus(cudaErrorMemoryAllocation, "cudaMalloc(1 TiB)");
  EXPECT_EQ(oom.code(), StatusCode::kNoSpace);
  EXPECT_NE(oom.message().find("cudaMalloc(1 TiB): cudaErrorMemoryAllocation ("), std::string::npos) << oom.message();
  EXPECT_EQ(CudaStatus(cudaErrorInsufficientDriver, "x").code(), StatusCode::kUnavailable);
  EXPECT_EQ(CudaStatus(cudaErrorNoDevice, "x").code(), StatusCode::kUnavailable);
  EXPECT_EQ(CudaStatus(cudaErrorInvalidValue, "x").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CudaStatus(cudaErrorHostMemoryAlreadyRegistered, "x").code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(CudaStatus(cudaErrorIllegalAddress, "x").code(), StatusCode::kIoError);
}

TEST(IpcHandleTest, HexRoundTripsAndRejectsGarbage) {
  IpcMemHandle handle;
  for (size_t i = 0; i < kIpcHandleBytes; ++i) handle.bytes[i] = static_cast<std::byte>(i * 37 + 1);
  const std::string hex = HandleToHex(handle.bytes);
  EXPECT_EQ(hex.size(), 2 * kIpcHandleBytes);
  auto back = HandleFromHex(hex);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, handle.bytes);
  EXPECT_EQ(HandleFromHex(hex.substr(1)).status().code(), StatusCode::kInvalidArgument);
  std::string bad = hex;
  bad[5] = 'g';
  EXPECT_EQ(HandleFromHex(bad).status().code(), StatusCode::kInvalidArgument);
}

TEST(ArgumentChecksTest, AreMadeBeforeTouchingTheDevice) {
  EXPECT_EQ(DevicePool::Create(0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DevicePool::Create(255).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(HostRegistration::Register({}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(PinnedBuffer::Allocate(0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(LayerCopier::Create(0).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvtier::gpu

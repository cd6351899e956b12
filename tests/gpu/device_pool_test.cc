// DevicePool and HostRegistration on a real device (skipped without one).
#include <cuda_runtime.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include "gpu/device_mapping.h"
#include "gpu/device_pool.h"
#include "gpu/host_registration.h"
#include "tests/gpu/gpu_test_util.h"

namespace kvtier::gpu {
namespace {

using ::kvtier::testing::FillPattern;
using ::kvtier::testing::MatchesPattern;

TEST(DevicePoolTest, HandsOutAlignedRangesThatHoldBytes) {
  KVTIER_SKIP_WITHOUT_DEVICE();
  auto pool = DevicePool::Create(64 << 20);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  Result<DeviceRange> a = (*pool)->Allocate(1000);
  Result<DeviceRange> b = (*pool)->Allocate(1 << 20);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->offset, 0u);
  EXPECT_EQ(a->bytes, 1024u);
  EXPECT_EQ(b->offset, 1024u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*pool)->At(b->offset)) % 256, 0u);
  std::vector<std::byte> in(1 << 20), out(1 << 20);
  FillPattern(7, in);
  ASSERT_EQ(cudaMemcpy((*pool)->At(b->offset), in.data(), in.size(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(out.data(), (*pool)->At(b->offset), out.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_TRUE(MatchesPattern(7, out));
  EXPECT_EQ((*pool)->usage().used_bytes, 1024u + (1 << 20));
  EXPECT_TRUE((*pool)->Free(a->offset).ok());
  EXPECT_EQ((*pool)->Free(a->offset).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*pool)->Allocate(65 << 20).status().code(), StatusCode::kInvalidArgument);
}

TEST(DevicePoolTest, MoreThanTheDeviceHasIsNoSpace) {
  KVTIER_SKIP_WITHOUT_DEVICE();
  auto pool = DevicePool::Create(uint64_t{1} << 50);
  EXPECT_EQ(pool.status().code(), StatusCode::kNoSpace) << pool.status().ToString();
}

TEST(DevicePoolTest, ExportsAHandleThatThisProcessCannotOpen) {
  KVTIER_SKIP_WITHOUT_DEVICE();
  auto pool = DevicePool::Create(4 << 20);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  Result<IpcMemHandle> handle = (*pool)->Export();
  ASSERT_TRUE(handle.ok()) << handle.status().ToString();
  EXPECT_TRUE(std::any_of(handle->bytes.begin(), handle->bytes.end(), [](std::byte b) { return b != std::byte{0}; }));
  // CUDA refuses to map a process's own allocation: the open belongs in
  // another process (ipc_test.cc).
  EXPECT_FALSE(DeviceMapping::Open(*handle, 4 << 20).ok());
}

// The client's case: a memfd arena mapped MAP_SHARED, registered once.
TEST(HostRegistrationTest, PinsAMemfdMappingUntilDestroyed) {
  KVTIER_SKIP_WITHOUT_DEVICE();
  constexpr size_t kBytes = 4 << 20;
  const int fd = memfd_create("kvtier-gpu-test", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, kBytes), 0);
  void* p = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(p, MAP_FAILED);
  close(fd);
  std::span<std::byte> arena(static_cast<std::byte*>(p), kBytes);
  std::vector<std::byte> pageable(4096);
  EXPECT_FALSE(IsPinnedHost(arena.data()));
  {
    auto registration = HostRegistration::Register(arena);
    ASSERT_TRUE(registration.ok()) << registration.status().ToString();
    EXPECT_TRUE(IsPinnedHost(arena.data() + 12345));
    EXPECT_FALSE(IsPinnedHost(pageable.data()));
    EXPECT_EQ(HostRegistration::Register(arena).status().code(), StatusCode::kAlreadyExists);
    // An async round trip through the device from the registered range.
    void* device = nullptr;
    ASSERT_EQ(cudaMalloc(&device, kBytes), cudaSuccess);
    FillPattern(11, arena.first(kBytes / 2));
    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(device, arena.data(), kBytes / 2, cudaMemcpyHostToDevice, stream), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(arena.data() + kBytes / 2, device, kBytes / 2, cudaMemcpyDeviceToHost, stream),
              cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_TRUE(MatchesPattern(11, arena.subspan(kBytes / 2)));
    cudaStreamDestroy(stream);
    cudaFree(device);
  }
  EXPECT_FALSE(IsPinnedHost(arena.data())) << "unregistered when the registration went";
  munmap(p, kBytes);
}

TEST(PinnedBufferTest, IsPinned) {
  KVTIER_SKIP_WITHOUT_DEVICE();
  auto buffer = PinnedBuffer::Allocate(1 << 20);
  ASSERT_TRUE(buffer.ok()) << buffer.status().ToString();
  EXPECT_TRUE(IsPinnedHost((*buffer)->span().data() + 100));
}

}  // namespace
}  // namespace kvtier::gpu

// The client library's GPU destinations (client_lib/device_copy.h): a
// load's DeviceLoadCopier copies blocks held in the daemon's device pool
// device to device and arena blocks host to device, in one layer; and how
// a client finds the pool's GPU (by PCI bus id, gpu/device_probe.h). The
// pure parts run everywhere; the copies skip without a device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "client_lib/device_copy.h"
#include "gpu/device_pool.h"
#include "gpu/device_probe.h"
#include "gpu/host_registration.h"
#include "tests/gpu/gpu_test_util.h"

namespace kvtier {
namespace {

using ::kvtier::internal::DeviceLoadCopier;
using ::kvtier::internal::DevicePoolMapping;
using ::kvtier::internal::DevicePoolOffer;
using ::kvtier::testing::FillPattern;
using ::kvtier::testing::MatchesPattern;

TEST(PciBusIdTest, HasOneCanonicalForm) {
  EXPECT_EQ(*gpu::CanonicalPciBusId("0000:3B:00.0"), "0000:3b:00.0");
  EXPECT_EQ(*gpu::CanonicalPciBusId("00000000:3b:00.0"), "0000:3b:00.0") << "nvidia-smi's 8-digit domain";
  EXPECT_EQ(*gpu::CanonicalPciBusId("3b:0.0"), "0000:3b:00.0") << "no domain";
  EXPECT_EQ(*gpu::CanonicalPciBusId("1:2:3.4"), "0001:02:03.4");
  EXPECT_EQ(*gpu::CanonicalPciBusId("10000:c1:1f.7"), "10000:c1:1f.7") << "a domain beyond 16 bits stays whole";
  for (const char* bad : {"", "3b", "0000:3b:00", "0000:3b:00.8", "0000:3b:20.0", "0000:100:00.0", "0000:3b:00.0x",
                          "x:3b:00.0", "0000::00.0", "0000:3b:00.", "0000.3b:00:0", "0:0:0:0.0", "-1:3b:00.0"}) {
    EXPECT_EQ(gpu::CanonicalPciBusId(bad).status().code(), StatusCode::kInvalidArgument) << '"' << bad << '"';
  }
}

TEST(PciBusIdTest, NamesADeviceOfThisProcessOrSaysWhyNot) {
  EXPECT_EQ(gpu::OrdinalOfPciBusId("not a bus id").status().code(), StatusCode::kInvalidArgument);
  Result<int> count = gpu::DeviceCount();
  if (!count.ok()) {
    EXPECT_EQ(gpu::OrdinalOfPciBusId("0000:3b:00.0").status().code(), StatusCode::kUnavailable);
    EXPECT_EQ(
        DevicePoolMapping::OrdinalOf(DevicePoolOffer{std::string(64, '\0'), 1 << 20, "0000:3b:00.0"}).status().code(),
        StatusCode::kUnavailable);
    GTEST_SKIP() << count.status().message();
  }
  for (int ordinal = 0; ordinal < *count; ++ordinal) {
    Result<gpu::DeviceInfo> info = gpu::ProbeDevice(ordinal);
    ASSERT_TRUE(info.ok()) << info.status().ToString();
    EXPECT_EQ(*gpu::CanonicalPciBusId(info->pci_bus_id), info->pci_bus_id) << "reported canonical";
    Result<int> back = gpu::OrdinalOfPciBusId(info->pci_bus_id);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(*back, ordinal) << info->pci_bus_id;
  }
  Status missing = gpu::OrdinalOfPciBusId("ffff:ff:1f.7").status();
  EXPECT_EQ(missing.code(), StatusCode::kNotFound) << missing.ToString();
}

TEST(DevicePoolMappingTest, RefusesAHandleOfTheWrongSizeBeforeTouchingTheDevice) {
  const DevicePoolOffer offer{std::string(63, '\1'), 1 << 20, "0000:3b:00.0"};
  EXPECT_EQ(DevicePoolMapping::Open(offer, 0).status().code(), StatusCode::kInvalidArgument);
}

constexpr uint32_t kLayers = 3;
constexpr uint64_t kLayerBytes = 256 << 10;
constexpr uint64_t kBlockBytes = kLayers * kLayerBytes;
constexpr uint64_t kPoolSeed = 0x900d, kArenaSeed = 0xa7e4;

class DeviceLoadCopierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KVTIER_SKIP_WITHOUT_DEVICE();
    auto pool = gpu::DevicePool::Create(4 * kBlockBytes);
    ASSERT_TRUE(pool.ok()) << pool.status().ToString();
    pool_ = std::move(*pool);
    // Not at offset 0: a block somewhere in the pool, as the HBM tier holds it.
    ASSERT_TRUE(pool_->Allocate(kBlockBytes).ok());
    auto range = pool_->Allocate(kBlockBytes);
    ASSERT_TRUE(range.ok()) << range.status().ToString();
    pool_block_ = static_cast<const std::byte*>(pool_->At(range->offset));
    auto arena = gpu::PinnedBuffer::Allocate(kBlockBytes);
    auto readback = gpu::PinnedBuffer::Allocate(2 * kBlockBytes);
    ASSERT_TRUE(arena.ok() && readback.ok());
    arena_ = std::move(*arena);
    readback_ = std::move(*readback);
    // Layer l of either block is the pattern of (seed + l): a byte in the
    // wrong place or from the wrong source does not match.
    std::vector<std::byte> staging(kBlockBytes);
    for (uint32_t l = 0; l < kLayers; ++l) {
      FillPattern(kPoolSeed + l, std::span(staging).subspan(l * kLayerBytes, kLayerBytes));
      FillPattern(kArenaSeed + l, arena_->span().subspan(l * kLayerBytes, kLayerBytes));
    }
    ASSERT_EQ(cudaMemcpy(pool_->At(range->offset), staging.data(), kBlockBytes, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dst_, 2 * kBlockBytes), cudaSuccess);
    ASSERT_EQ(cudaMemset(dst_, 0, 2 * kBlockBytes), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&caller_, cudaStreamNonBlocking), cudaSuccess);
    auto copier = DeviceLoadCopier::Create(kLayers, pool_->ordinal());
    ASSERT_TRUE(copier.ok()) << copier.status().ToString();
    copier_ = std::move(*copier);
  }
  void TearDown() override {
    copier_.reset();  // waits for its copies before the buffers go
    if (caller_ != nullptr) cudaStreamDestroy(caller_);
    if (dst_ != nullptr) cudaFree(dst_);
  }

  // Destination block 0 (from the pool) and 1 (from the arena), layer l.
  void* Dst(uint32_t block, uint32_t l) const {
    return static_cast<std::byte*>(dst_) + block * kBlockBytes + l * kLayerBytes;
  }

  std::unique_ptr<gpu::DevicePool> pool_;
  const std::byte* pool_block_ = nullptr;  // a device address
  std::unique_ptr<gpu::PinnedBuffer> arena_, readback_;
  void* dst_ = nullptr;
  cudaStream_t caller_ = nullptr;
  std::unique_ptr<DeviceLoadCopier> copier_;
};

TEST_F(DeviceLoadCopierTest, CopiesPoolPiecesDeviceToDeviceAndArenaPiecesHostToDevice) {
  using Piece = DeviceLoadCopier::Piece;
  using Source = DeviceLoadCopier::Source;
  // Layers 0 and 1 mix both sources (as a load with blocks in the HBM tier
  // and in the arena does); layer 2 comes from the pool only.
  for (uint32_t l = 0; l < kLayers; ++l) {
    std::vector<Piece> pieces{Piece{Dst(0, l), pool_block_ + l * kLayerBytes, kLayerBytes, Source::kDevicePool}};
    if (l < 2) pieces.push_back(Piece{Dst(1, l), arena_->span().data() + l * kLayerBytes, kLayerBytes, Source::kArena});
    ASSERT_TRUE(copier_->EnqueueLayer(l, pieces).ok());
  }
  // The caller's stream waits for the last layer on the GPU, then reads
  // both blocks back: the wait covers the pieces of both kinds.
  ASSERT_TRUE(copier_->MakeStreamWait(caller_, kLayers - 1).ok());
  for (uint32_t l = 0; l < kLayers - 1; ++l) ASSERT_TRUE(copier_->MakeStreamWait(caller_, l).ok());
  ASSERT_EQ(cudaMemcpyAsync(readback_->span().data(), dst_, 2 * kBlockBytes, cudaMemcpyDeviceToHost, caller_),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(caller_), cudaSuccess);
  const std::span<const std::byte> back = readback_->span();
  for (uint32_t l = 0; l < kLayers; ++l) {
    EXPECT_TRUE(MatchesPattern(kPoolSeed + l, back.subspan(l * kLayerBytes, kLayerBytes))) << "pool layer " << l;
  }
  for (uint32_t l = 0; l < 2; ++l) {
    EXPECT_TRUE(MatchesPattern(kArenaSeed + l, back.subspan(kBlockBytes + l * kLayerBytes, kLayerBytes)))
        << "arena layer " << l;
  }
  const auto untouched = back.subspan(kBlockBytes + 2 * kLayerBytes, kLayerBytes);
  EXPECT_TRUE(std::all_of(untouched.begin(), untouched.end(), [](std::byte b) { return b == std::byte{0}; }))
      << "layer 2 of the arena block was never copied";
  EXPECT_TRUE(copier_->SynchronizeAll().ok());
}

TEST_F(DeviceLoadCopierTest, ALayerWithNothingToCopyStillCountsAsArrived) {
  ASSERT_TRUE(copier_->EnqueueLayer(0, {}).ok());
  ASSERT_TRUE(copier_->MakeStreamWait(caller_, 0).ok());
  EXPECT_EQ(cudaStreamSynchronize(caller_), cudaSuccess);
  EXPECT_TRUE(copier_->SynchronizeAll().ok());
}

}  // namespace
}  // namespace kvtier

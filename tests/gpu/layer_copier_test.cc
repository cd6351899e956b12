// LayerCopier on a real device (skipped without one): per-layer events,
// a caller stream that waits on the GPU for exactly its layer.
#include "gpu/layer_copier.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <memory>

#include "gpu/host_registration.h"
#include "tests/gpu/gpu_test_util.h"

namespace kvtier::gpu {
namespace {

using ::kvtier::testing::FillPattern;
using ::kvtier::testing::MatchesPattern;
using ::kvtier::testing::StreamGate;

constexpr uint32_t kLayers = 4;
constexpr size_t kLayerBytes = 1 << 20;

class LayerCopierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KVTIER_SKIP_WITHOUT_DEVICE();
    auto copier = LayerCopier::Create(kLayers);
    ASSERT_TRUE(copier.ok()) << copier.status().ToString();
    copier_ = std::move(*copier);
    auto src = PinnedBuffer::Allocate(kLayers * kLayerBytes);
    auto dst = PinnedBuffer::Allocate(kLayerBytes);
    ASSERT_TRUE(src.ok() && dst.ok());
    src_ = std::move(*src);
    dst_ = std::move(*dst);
    for (uint32_t l = 0; l < kLayers; ++l) FillPattern(100 + l, src_->span().subspan(l * kLayerBytes, kLayerBytes));
    ASSERT_EQ(cudaMalloc(&device_, kLayers * kLayerBytes), cudaSuccess);
    ASSERT_EQ(cudaMemset(device_, 0, kLayers * kLayerBytes), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&caller_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    gate_.Open();
    copier_.reset();
    if (caller_ != nullptr) cudaStreamDestroy(caller_);
    if (device_ != nullptr) cudaFree(device_);
  }
  std::byte* DeviceLayer(uint32_t l) { return static_cast<std::byte*>(device_) + l * kLayerBytes; }

  std::unique_ptr<LayerCopier> copier_;
  std::unique_ptr<PinnedBuffer> src_, dst_;
  void* device_ = nullptr;
  cudaStream_t caller_ = nullptr;
  StreamGate gate_;
};

TEST_F(LayerCopierTest, ACallerStreamWaitsOnTheGpuForItsLayer) {
  // Stall the copier's stream so that nothing has arrived when the caller
  // enqueues its wait and its read of layer 2.
  ASSERT_EQ(gate_.Close(copier_->stream()), "");
  for (uint32_t l = 0; l < kLayers; ++l) {
    ASSERT_TRUE(
        copier_
            ->CopyLayer(l, DeviceLayer(l), src_->span().data() + l * kLayerBytes, kLayerBytes, CopyKind::kHostToDevice)
            .ok());
  }
  Result<bool> ready = copier_->LayerReady(2);
  ASSERT_TRUE(ready.ok()) << ready.status().ToString();
  EXPECT_FALSE(*ready) << "the stream is stalled";
  ASSERT_TRUE(copier_->MakeStreamWait(caller_, 2).ok());  // returns at once: the host does not wait
  ASSERT_EQ(cudaMemcpyAsync(dst_->span().data(), DeviceLayer(2), kLayerBytes, cudaMemcpyDeviceToHost, caller_),
            cudaSuccess);
  EXPECT_EQ(cudaStreamQuery(caller_), cudaErrorNotReady) << "the caller's copy ran before its layer arrived";
  gate_.Open();
  ASSERT_EQ(cudaStreamSynchronize(caller_), cudaSuccess);
  EXPECT_TRUE(MatchesPattern(102, dst_->span())) << "the caller read layer 2 before it arrived";
  EXPECT_TRUE(copier_->Synchronize(3).ok());
  EXPECT_TRUE(*copier_->LayerReady(3));
}

TEST_F(LayerCopierTest, PiecesOfALayerArriveTogether) {
  std::vector<LayerCopier::Piece> pieces;
  for (uint32_t i = 0; i < 4; ++i) {
    const size_t piece = kLayerBytes / 4;
    pieces.push_back({DeviceLayer(1) + i * piece, src_->span().data() + kLayerBytes + i * piece, piece});
  }
  ASSERT_TRUE(copier_->CopyLayerParts(1, pieces, CopyKind::kHostToDevice).ok());
  ASSERT_TRUE(copier_->Synchronize(1).ok());
  ASSERT_TRUE(copier_->CopyLayer(0, dst_->span().data(), DeviceLayer(1), kLayerBytes, CopyKind::kDeviceToHost).ok());
  ASSERT_TRUE(copier_->Synchronize(0).ok());
  EXPECT_TRUE(MatchesPattern(101, dst_->span()));
}

TEST_F(LayerCopierTest, ALayerNeverCopiedCountsAsArrived) {
  EXPECT_TRUE(*copier_->LayerReady(0));
  EXPECT_TRUE(copier_->Synchronize(0).ok());
  EXPECT_TRUE(copier_->MakeStreamWait(caller_, 0).ok());
}

TEST_F(LayerCopierTest, BadLayersAndExportsAreRefused) {
  EXPECT_EQ(copier_->CopyLayer(kLayers, DeviceLayer(0), src_->span().data(), 1, CopyKind::kHostToDevice).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(copier_->MakeStreamWait(caller_, kLayers).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(copier_->ExportLayerEvent(0).status().code(), StatusCode::kFailedPrecondition);
  auto ipc = LayerCopier::Create(2, LayerCopierOptions{0, true});
  ASSERT_TRUE(ipc.ok()) << ipc.status().ToString();
  Result<IpcEventHandle> handle = (*ipc)->ExportLayerEvent(1);
  EXPECT_TRUE(handle.ok()) << handle.status().ToString();
}

TEST_F(LayerCopierTest, WaitForStreamOrdersTheNextBatchAfterTheCallersReads) {
  // The caller's stream is stalled while it "still reads" layer 0; a copy
  // into that layer enqueued after WaitForStream must not land before.
  ASSERT_TRUE(copier_->CopyLayer(0, DeviceLayer(0), src_->span().data(), kLayerBytes, CopyKind::kHostToDevice).ok());
  ASSERT_TRUE(copier_->MakeStreamWait(caller_, 0).ok());
  ASSERT_EQ(gate_.Close(caller_), "");
  ASSERT_EQ(cudaMemcpyAsync(dst_->span().data(), DeviceLayer(0), kLayerBytes, cudaMemcpyDeviceToHost, caller_),
            cudaSuccess);
  ASSERT_TRUE(copier_->WaitForStream(caller_).ok());
  ASSERT_TRUE(
      copier_->CopyLayer(0, DeviceLayer(0), src_->span().data() + 3 * kLayerBytes, kLayerBytes, CopyKind::kHostToDevice)
          .ok());
  EXPECT_FALSE(*copier_->LayerReady(0));
  gate_.Open();
  ASSERT_TRUE(copier_->Synchronize(0).ok());
  ASSERT_EQ(cudaStreamSynchronize(caller_), cudaSuccess);
  EXPECT_TRUE(MatchesPattern(100, dst_->span())) << "the caller saw the next batch's bytes";
}

}  // namespace
}  // namespace kvtier::gpu

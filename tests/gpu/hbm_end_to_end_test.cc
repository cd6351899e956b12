// The HBM tier end to end, on a real GPU: kvtierd as a child process (a
// CUDA IPC handle cannot be opened by the process that exported it) with
// `hbm.enabled = "on"`, and a Client in this process loading layer by
// layer into cudaMalloc'ed buffers. It proves that
// - a first device load is served from the arena (host to device) with
//   exact bytes, and its hits are then copied up into the device pool
//   (engine.hbm_copies_up; Lookup answers kHbm);
// - a second device load gets the same blocks in place: the client maps
//   the daemon's pool and copies device to device
//   (engine.hbm_in_place_blocks), the bytes are exact again, and those
//   blocks have no arena bytes (TryLayerSpan: FailedPrecondition);
// - a zero-copy load (no device_dst) of the same keys still reads exact
//   bytes in the arena.
// Skips with the probe's reason without a device; scripts/gpu-check.sh
// runs it where there is one.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kvtier/client.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/test_daemon.h"

namespace kvtier::testing {
namespace {

constexpr uint32_t kLayers = 8;
constexpr uint64_t kBytesPerTokenPerLayer = 4096;  // 16 tokens: 64 KiB a layer, 512 KiB a block
constexpr size_t kBlocks = 4;
constexpr const char* kConfig =
    "[host]\ncapacity_bytes = \"64MiB\"\nlock_memory = \"off\"\n"
    "[hbm]\nenabled = \"on\"\ncapacity_bytes = \"64MiB\"\n";

NamespaceDescriptor Namespace() {
  NamespaceDescriptor ns = TestNamespace();
  ns.layer_count = kLayers;
  ns.bytes_per_token_per_layer = kBytesPerTokenPerLayer;
  return ns;
}

class HbmEndToEndTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KVTIER_SKIP_WITHOUT_DEVICE();
    daemon_ = std::make_unique<DaemonProcess>(KVTIERD_PATH, "", kConfig);
    ASSERT_TRUE(daemon_->running()) << "kvtierd with hbm.enabled = on did not start (its log is above)";
    ClientOptions options;
    options.socket_path = daemon_->socket_path();
    options.namespaces = {ns_};
    // Lookups through the daemon: the block directory knows the host tier
    // only and would answer kHost for blocks held in both tiers.
    options.use_directory = false;
    auto client = Client::Connect(options);
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    client_ = std::move(*client);

    keys_ = TestKeys(ns_, kBlocks, 11);
    std::vector<std::byte> block(ns_.BlockBytes());
    for (const BlockKey& key : keys_) {
      FillBlockBytes(key, 0, block);
      ASSERT_TRUE(client_->Put(0, key, block).ok());
    }
    for (size_t i = 0; i < kBlocks; ++i) {
      void* dst = nullptr;
      ASSERT_EQ(cudaMalloc(&dst, ns_.BlockBytes()), cudaSuccess);
      device_dst_.push_back(dst);
    }
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    for (void* dst : device_dst_) cudaFree(dst);
    client_.reset();
    daemon_.reset();
  }

  // A layer-wise load of keys_ into device_dst_ (cleared first), waited for
  // layer by layer, then the device buffers are read back and checked.
  // The load is left open (the caller ends it).
  void LoadIntoDevice(LayerLoad& load) {
    for (void* dst : device_dst_) ASSERT_EQ(cudaMemset(dst, 0, ns_.BlockBytes()), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    LoadOptions options;
    options.device_dst = device_dst_;
    options.cuda_stream = stream_;
    options.device_ordinal = 0;
    auto begun = client_->BeginLoad(0, keys_, std::move(options));
    ASSERT_TRUE(begun.ok()) << begun.status().ToString();
    load = std::move(*begun);
    for (uint32_t l = 0; l < kLayers; ++l) ASSERT_TRUE(load.WaitLayer(l).ok()) << "layer " << l;
    ASSERT_TRUE(load.WaitAll().ok());
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    std::vector<std::byte> back(ns_.BlockBytes());
    for (size_t b = 0; b < kBlocks; ++b) {
      ASSERT_TRUE(load.status(b).ok()) << b << ": " << load.status(b).ToString();
      ASSERT_EQ(cudaMemcpy(back.data(), device_dst_[b], back.size(), cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_TRUE(CheckBlockBytes(keys_[b], 0, back)) << "block " << b << " on the device";
    }
    EXPECT_EQ(load.usable_prefix(), kBlocks);
  }

  int64_t Counter(const std::string& name) {
    std::map<std::string, int64_t> counters = StatsCounters(*client_);
    auto it = counters.find(name);
    if (it == counters.end()) ADD_FAILURE() << "no counter " << name;
    return it == counters.end() ? -1 : it->second;
  }

  // Polls `name` (the copies up run on the daemon's mover, off the
  // request path) until it reaches `value`, for at most 5 s.
  int64_t WaitForCounter(const std::string& name, int64_t value) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    int64_t now = Counter(name);
    while (now < value && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      now = Counter(name);
    }
    return now;
  }

  NamespaceDescriptor ns_ = Namespace();
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<Client> client_;
  std::vector<BlockKey> keys_;
  std::vector<void*> device_dst_;
  cudaStream_t stream_ = nullptr;
};

TEST_F(HbmEndToEndTest, DeviceLoadsCopyHitsUpThenGetThemInPlace) {
  // 1. Through the arena (host to device); the hits are offered up.
  {
    LayerLoad load;
    ASSERT_NO_FATAL_FAILURE(LoadIntoDevice(load));
    EXPECT_EQ(load.source(), Tier::kHost);
    ASSERT_TRUE(load.End().ok());
  }
  ASSERT_EQ(WaitForCounter("engine.hbm_copies_up", kBlocks), static_cast<int64_t>(kBlocks))
      << "skipped " << Counter("engine.hbm_copy_up_skips") << ", failed " << Counter("engine.hbm_copy_up_failures");
  auto hit = client_->Lookup(0, keys_);
  ASSERT_TRUE(hit.ok()) << hit.status().ToString();
  ASSERT_EQ(hit->prefix_blocks, kBlocks);
  EXPECT_EQ(hit->tiers, std::vector<Tier>(kBlocks, Tier::kHbm));

  // 2. In place: device to device from the daemon's pool, no arena bytes.
  const int64_t in_place_before = Counter("engine.hbm_in_place_blocks");
  {
    LayerLoad load;
    ASSERT_NO_FATAL_FAILURE(LoadIntoDevice(load));
    for (size_t b = 0; b < kBlocks; ++b) {
      EXPECT_EQ(load.TryLayerSpan(b, 0).status().code(), StatusCode::kFailedPrecondition) << "block " << b;
    }
    ASSERT_TRUE(load.End().ok());
  }
  EXPECT_EQ(Counter("engine.hbm_in_place_blocks") - in_place_before, static_cast<int64_t>(kBlocks));

  // 3. Zero-copy from the arena: the host tier still holds every block.
  auto begun = client_->BeginLoad(0, keys_, LoadOptions{});
  ASSERT_TRUE(begun.ok()) << begun.status().ToString();
  LayerLoad load = std::move(*begun);
  ASSERT_TRUE(load.WaitAll().ok());
  for (size_t b = 0; b < kBlocks; ++b) {
    ASSERT_TRUE(load.status(b).ok()) << b << ": " << load.status(b).ToString();
    std::vector<std::byte> whole;
    for (uint32_t l = 0; l < kLayers; ++l) {
      auto span = load.TryLayerSpan(b, l);
      ASSERT_TRUE(span.ok()) << "block " << b << " layer " << l << ": " << span.status().ToString();
      whole.insert(whole.end(), span->begin(), span->end());
    }
    EXPECT_TRUE(CheckBlockBytes(keys_[b], 0, whole)) << "block " << b << " in the arena";
  }
  ASSERT_TRUE(load.End().ok());
}

}  // namespace
}  // namespace kvtier::testing

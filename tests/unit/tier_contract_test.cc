// The BlockTier contract (tiers/tier.h), run against every implementation:
// the host tier (the engine's HostBlockTier), NVMe on a memory device, and
// the test-only map tier. A tier stacked on another may rely on exactly
// what these cases check, whichever tier is below it.
#include <gtest/gtest.h>

#include <map>

#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/checksum.h"
#include "daemon/engine/engine.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/map_tier.h"
#include "tests/testing/memory_device.h"
#include "tests/testing/memory_nvme.h"
#include "tests/testing/test_daemon.h"
#include "tiers/nvme/nvme_tier.h"
#include "tiers/tier.h"
#ifdef KVTIER_HAVE_CUDA
#include "tests/gpu/fake_hbm_device.h"
#include "tests/gpu/gpu_test_util.h"
#include "tiers/hbm/cuda_hbm_device.h"
#include "tiers/hbm/hbm_tier.h"
#endif

namespace kvtier {
namespace {

constexpr uint64_t kBlockBytes = 64 << 10;  // 4 layers of 16 KiB
constexpr uint32_t kLayers = 4;
constexpr uint64_t kLayerBytes = kBlockBytes / kLayers;
constexpr NamespaceFingerprint kNs{0xc0de, 0x7e57};

BlockKey Key(uint64_t i) { return BlockKey{0xc0417, i}; }

std::vector<std::byte> Payload(uint64_t i) {
  std::vector<std::byte> bytes(kBlockBytes);
  ::kvtier::testing::FillBlockBytes(Key(i), 0, bytes);
  return bytes;
}

// The outcome of one asynchronous call, and the thread it came back on.
template <typename T>
struct Completion {
  std::promise<std::pair<T, std::thread::id>> promise;
  std::future<std::pair<T, std::thread::id>> future = promise.get_future();
  void Set(T value) { promise.set_value({std::move(value), std::this_thread::get_id()}); }
  std::pair<T, std::thread::id> Get() { return future.get(); }
};

class TierContractTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string& which = GetParam();
    if (which == "host") {
      host_ = ::kvtier::testing::OpenTestHostTier(16 * kBlockBytes);
      ASSERT_NE(host_, nullptr);
      auto engine = Engine::Create(EngineOptions{2, EvictionPolicyId::kLru}, *host_, clock_);
      ASSERT_TRUE(engine.ok()) << engine.status().ToString();
      engine_ = std::move(*engine);
      engine_->RegisterNamespace(kNs, NamespaceLayout{kLayers, kBlockBytes});
      tier_ = &engine_->host_tier();
    } else if (which == "nvme") {
      dir_ = ::kvtier::testing::MakeTempDir();
      memory_ = std::make_unique<::kvtier::testing::MemoryDevice>(16 << 20);
      auto nvme = ::kvtier::testing::OpenMemoryNvmeTier(*memory_, dir_, clock_);
      ASSERT_TRUE(nvme.ok()) << nvme.status().ToString();
      nvme_ = std::move(*nvme);
      tier_ = nvme_.get();
#ifdef KVTIER_HAVE_CUDA
    } else if (which == "hbm" || which == "hbm_cuda") {
      // The HBM tier on a host-memory device double (runs everywhere), and
      // on the GPU (skipped without one; scripts/gpu-check.sh runs it).
      std::unique_ptr<HbmDevice> device;
      if (which == "hbm") {
        device = std::make_unique<::kvtier::testing::FakeHbmDevice>(16 * kBlockBytes, 8 * kBlockBytes, 8);
      } else {
        KVTIER_SKIP_WITHOUT_DEVICE();
        auto cuda = CudaHbmDevice::Create(CudaHbmDeviceOptions{0, 16 * kBlockBytes, 8 * kBlockBytes, 8});
        ASSERT_TRUE(cuda.ok()) << cuda.status().ToString();
        device = std::move(*cuda);
      }
      auto hbm = HbmTier::Create(std::move(device));
      ASSERT_TRUE(hbm.ok()) << hbm.status().ToString();
      hbm_ = std::move(*hbm);
      tier_ = hbm_.get();
#endif
    } else {
      map_ = std::make_unique<::kvtier::testing::MapTier>();
      tier_ = map_.get();
    }
  }
  void TearDown() override {
    engine_.reset();
    nvme_.reset();
    map_.reset();
#ifdef KVTIER_HAVE_CUDA
    hbm_.reset();
#endif
    if (!dir_.empty()) ::kvtier::testing::RemoveTree(dir_);
  }

  // Writes block i (its checksum given when `checksum` is set) and waits
  // for its completion; the rejection, else the completion's status.
  Status WriteAndWait(uint64_t i, std::optional<uint64_t> checksum = std::nullopt) {
    const std::vector<std::byte> payload = Payload(i);
    auto done = std::make_shared<Completion<Status>>();
    Status accepted = tier_->Write(
        kNs, Key(i), kLayers, payload, [done](Status s) { done->Set(s); }, checksum);
    if (!accepted.ok()) return accepted;
    return done->Get().first;
  }
  // Reads layers [first, last) of block i; the rejection, else the
  // completion's result, with the bytes in `out`.
  Result<size_t> ReadAndWait(uint64_t i, uint32_t first, uint32_t last, std::vector<std::byte>& out,
                             std::thread::id* thread = nullptr) {
    out.assign((last - first) * kLayerBytes, std::byte{0});
    auto done = std::make_shared<Completion<Result<size_t>>>();
    Status accepted = tier_->Read(Key(i), first, last, out, [done](Result<size_t> r) { done->Set(std::move(r)); });
    if (!accepted.ok()) return accepted;
    auto [result, on] = done->Get();
    if (thread != nullptr) *thread = on;
    return result;
  }

  ::kvtier::testing::FakeClock clock_;
  std::unique_ptr<HostTier> host_;
  std::unique_ptr<Engine> engine_;
  std::string dir_;
  std::unique_ptr<::kvtier::testing::MemoryDevice> memory_;
  std::unique_ptr<NvmeTier> nvme_;
  std::unique_ptr<::kvtier::testing::MapTier> map_;
#ifdef KVTIER_HAVE_CUDA
  std::unique_ptr<HbmTier> hbm_;
#endif
  BlockTier* tier_ = nullptr;
};

TEST_P(TierContractTest, AWrittenBlockIsFoundAndReadBackByteExactOffTheCallersThread) {
  const std::vector<std::byte> payload = Payload(1);
  auto written = std::make_shared<Completion<Status>>();
  ASSERT_TRUE(tier_->Write(kNs, Key(1), kLayers, payload, [written](Status s) { written->Set(s); }).ok());
  auto [status, write_thread] = written->Get();
  ASSERT_TRUE(status.ok()) << status.ToString();
  EXPECT_NE(write_thread, std::this_thread::get_id()) << "a completion ran inline";
  std::optional<BlockTier::BlockInfo> info = tier_->Find(Key(1));
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->ns, kNs);
  EXPECT_EQ(info->payload_bytes, kBlockBytes);
  EXPECT_EQ(info->layer_count, kLayers);
  EXPECT_EQ(info->payload_checksum, BlockChecksum(payload));
  std::vector<std::byte> out;
  std::thread::id read_thread;
  Result<size_t> read = ReadAndWait(1, 0, kLayers, out, &read_thread);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(*read, kBlockBytes);
  EXPECT_EQ(out, payload);
  EXPECT_NE(read_thread, std::this_thread::get_id()) << "a completion ran inline";
  EXPECT_FALSE(tier_->Find(Key(2)).has_value());
}

TEST_P(TierContractTest, ALayerRangeReadCopiesExactlyThoseLayers) {
  ASSERT_TRUE(WriteAndWait(3).ok());
  const std::vector<std::byte> payload = Payload(3);
  std::vector<std::byte> out;
  Result<size_t> read = ReadAndWait(3, 1, 3, out);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(*read, 2 * kLayerBytes);
  EXPECT_EQ(0, std::memcmp(out.data(), payload.data() + kLayerBytes, 2 * kLayerBytes));
}

TEST_P(TierContractTest, AReadWithLayerChecksumsHandsOutEachLayersChecksum) {
  ASSERT_TRUE(WriteAndWait(5).ok());
  const std::vector<std::byte> payload = Payload(5);
  for (auto [first, last] : {std::pair<uint32_t, uint32_t>{0, kLayers}, {1, 3}, {3, 4}}) {
    SCOPED_TRACE(std::to_string(first) + ".." + std::to_string(last));
    std::vector<std::byte> out((last - first) * kLayerBytes);
    auto done = std::make_shared<Completion<Result<BlockTier::LayerRead>>>();
    Status accepted = tier_->ReadWithLayerChecksums(
        Key(5), first, last, out, [done](Result<BlockTier::LayerRead> r) { done->Set(std::move(r)); });
    ASSERT_TRUE(accepted.ok()) << accepted.ToString();
    auto [read, on] = done->Get();
    ASSERT_TRUE(read.ok()) << read.status().ToString();
    EXPECT_NE(on, std::this_thread::get_id()) << "a completion ran inline";
    EXPECT_EQ(read->bytes, out.size());
    EXPECT_EQ(0, std::memcmp(out.data(), payload.data() + first * kLayerBytes, out.size()));
    ASSERT_EQ(read->layer_checksums.size(), last - first);
    for (uint32_t l = first; l < last; ++l) {
      EXPECT_EQ(read->layer_checksums[l - first],
                BlockChecksum(std::span(payload).subspan(l * kLayerBytes, kLayerBytes)))
          << l;
    }
  }
}

TEST_P(TierContractTest, BytesChangedAfterWriteReturnsAreNotWhatIsStored) {
  std::vector<std::byte> payload = Payload(4);
  const std::vector<std::byte> original = payload;
  auto done = std::make_shared<Completion<Status>>();
  ASSERT_TRUE(tier_->Write(kNs, Key(4), kLayers, payload, [done](Status s) { done->Set(s); }).ok());
  std::memset(payload.data(), 0x5a, payload.size());  // the caller reuses its buffer at once
  ASSERT_TRUE(done->Get().first.ok());
  std::vector<std::byte> out;
  ASSERT_TRUE(ReadAndWait(4, 0, kLayers, out).ok());
  EXPECT_EQ(out, original);
}

TEST_P(TierContractTest, AChecksumTheBytesDoNotMatchLeavesNothingVisible) {
  const uint64_t wrong = BlockChecksum(Payload(5)) ^ 1;
  Status s = WriteAndWait(5, wrong);
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
  EXPECT_FALSE(tier_->Find(Key(5)).has_value());
  // The right checksum is accepted.
  EXPECT_TRUE(WriteAndWait(5, BlockChecksum(Payload(5))).ok());
  EXPECT_TRUE(tier_->Find(Key(5)).has_value());
}

TEST_P(TierContractTest, AStoredKeyIsNotWrittenTwice) {
  ASSERT_TRUE(WriteAndWait(6).ok());
  EXPECT_EQ(WriteAndWait(6).code(), StatusCode::kAlreadyExists);
}

TEST_P(TierContractTest, BadArgumentsAreRefusedWithoutACompletion) {
  const std::vector<std::byte> payload = Payload(7);
  bool called = false;
  const auto never = [&called](Status) { called = true; };
  EXPECT_EQ(tier_->Write(kNs, Key(7), kLayers, {}, never).code(), StatusCode::kInvalidArgument) << "empty";
  EXPECT_EQ(tier_->Write(kNs, Key(7), 3, payload, never).code(), StatusCode::kInvalidArgument) << "uneven layers";
  EXPECT_EQ(tier_->Write(kNs, Key(7), 0, payload, never).code(), StatusCode::kInvalidArgument) << "no layers";
  EXPECT_FALSE(tier_->Find(Key(7)).has_value());
  ASSERT_TRUE(WriteAndWait(7).ok());
  std::vector<std::byte> out(kBlockBytes);
  const auto never_read = [&called](Result<size_t>) { called = true; };
  EXPECT_EQ(tier_->Read(Key(7), 2, 2, out, never_read).code(), StatusCode::kInvalidArgument) << "empty range";
  EXPECT_EQ(tier_->Read(Key(7), 0, kLayers + 1, out, never_read).code(), StatusCode::kInvalidArgument);
  std::vector<std::byte> small(kLayerBytes);
  EXPECT_EQ(tier_->Read(Key(7), 0, 2, small, never_read).code(), StatusCode::kInvalidArgument) << "dst too small";
  EXPECT_EQ(tier_->Read(Key(8), 0, kLayers, out, never_read).code(), StatusCode::kNotFound);
  EXPECT_FALSE(called) << "a rejected call ran its completion";
}

TEST_P(TierContractTest, EraseForgetsTheBlock) {
  ASSERT_TRUE(WriteAndWait(9).ok());
  EXPECT_TRUE(tier_->Erase(Key(9)).ok());
  EXPECT_FALSE(tier_->Find(Key(9)).has_value());
  std::vector<std::byte> out;
  EXPECT_EQ(ReadAndWait(9, 0, kLayers, out).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(tier_->Erase(Key(9)).code(), StatusCode::kNotFound);
  EXPECT_TRUE(WriteAndWait(9).ok()) << "an erased key can be written again";
}

TEST_P(TierContractTest, ForEachBlockVisitsExactlyTheReadableBlocks) {
  for (uint64_t i = 20; i < 23; ++i) ASSERT_TRUE(WriteAndWait(i).ok());
  ASSERT_TRUE(tier_->Erase(Key(21)).ok());
  std::map<BlockKey, BlockTier::BlockInfo> seen;
  tier_->ForEachBlock([&](const BlockKey& key, const BlockTier::BlockInfo& info) {
    EXPECT_TRUE(seen.emplace(key, info).second) << "visited twice";
  });
  EXPECT_EQ(seen.count(Key(20)), 1u);
  EXPECT_EQ(seen.count(Key(21)), 0u) << "erased";
  ASSERT_EQ(seen.count(Key(22)), 1u);
  const auto found = tier_->Find(Key(22));
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(seen[Key(22)].ns, found->ns);
  EXPECT_EQ(seen[Key(22)].payload_bytes, found->payload_bytes);
  EXPECT_EQ(seen[Key(22)].layer_count, found->layer_count);
  EXPECT_EQ(seen[Key(22)].payload_checksum, found->payload_checksum);
}

TEST_P(TierContractTest, UseAndWriteTotalsCountWhatWasStored) {
  const uint64_t used_before = tier_->used_bytes();
  const uint64_t written_before = tier_->write_totals().device_bytes;
  for (uint64_t i = 10; i < 14; ++i) ASSERT_TRUE(WriteAndWait(i).ok());
  EXPECT_GE(tier_->used_bytes(), used_before + 4 * kBlockBytes);
  EXPECT_LE(tier_->used_bytes(), tier_->capacity_bytes());
  EXPECT_GE(tier_->write_totals().device_bytes, written_before + 4 * kBlockBytes);
  EXPECT_GE(tier_->StoredBytes(kBlockBytes), kBlockBytes);
}

// The per-namespace sums (VisitNamespaceBytes: the tier's kept sums where
// it has them, a walk of its blocks where not) agree with its blocks, and
// each capability accessor answers the same every time.
TEST_P(TierContractTest, NamespaceSumsAgreeWithTheBlocksAndCapabilitiesStayPut) {
  for (uint64_t i = 30; i < 33; ++i) ASSERT_TRUE(WriteAndWait(i).ok());
  std::map<NamespaceFingerprint, uint64_t> walked, summed;
  tier_->ForEachBlock(
      [&](const BlockKey&, const BlockTier::BlockInfo& info) { walked[info.ns] += info.payload_bytes; });
  VisitNamespaceBytes(*tier_, [&](const NamespaceFingerprint& ns, uint64_t bytes) {
    EXPECT_TRUE(summed.emplace(ns, bytes).second) << "one visit per namespace";
  });
  EXPECT_EQ(summed, walked);
  EXPECT_GE(summed[kNs], 3 * kBlockBytes);
  EXPECT_EQ(tier_->prober(), tier_->prober());
  EXPECT_EQ(tier_->in_place_holds(), tier_->in_place_holds());
  EXPECT_EQ(tier_->reclaim_hooks(), tier_->reclaim_hooks());
  EXPECT_EQ(tier_->reclaim_shares(), tier_->reclaim_shares());
  EXPECT_EQ(tier_->namespace_sums(), tier_->namespace_sums());
}

INSTANTIATE_TEST_SUITE_P(EveryTier, TierContractTest,
                         ::testing::Values("host", "nvme", "map"
#ifdef KVTIER_HAVE_CUDA
                                           ,
                                           "hbm", "hbm_cuda"
#endif
                                           ),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace kvtier

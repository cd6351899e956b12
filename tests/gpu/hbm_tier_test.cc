// HbmTier (tiers/hbm/hbm_tier.h): the HBM tier's own guarantees beyond
// the BlockTier contract (tests/unit/tier_contract_test.cc runs the
// contract cases on it); run on a host-memory FakeHbmDevice (always) and
// on a real GPU (skipped without).
#include "tiers/hbm/hbm_tier.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/checksum.h"
#include "gpu/host_registration.h"
#include "tests/gpu/fake_hbm_device.h"
#include "tests/gpu/gpu_test_util.h"
#include "tiers/hbm/cuda_hbm_device.h"

namespace kvtier {
namespace {

constexpr uint64_t kBlockBytes = 64 << 10;  // 4 layers of 16 KiB
constexpr uint32_t kLayers = 4;
constexpr uint64_t kLayerBytes = kBlockBytes / kLayers;
constexpr uint64_t kPoolBytes = 16 * kBlockBytes;
constexpr uint64_t kStagingBytes = 8 * kBlockBytes;  // 6 blocks' worth each for writes and reads
constexpr NamespaceFingerprint kNs{0xc0de, 0x7e57};

BlockKey Key(uint64_t i) { return BlockKey{0xb1b, i}; }

std::vector<std::byte> Payload(uint64_t i) {
  std::vector<std::byte> bytes(kBlockBytes);
  ::kvtier::testing::FillPattern(i, bytes);
  return bytes;
}

template <typename T>
struct Completion {
  std::promise<std::pair<T, std::thread::id>> promise;
  std::future<std::pair<T, std::thread::id>> future = promise.get_future();
  void Set(T value) { promise.set_value({std::move(value), std::this_thread::get_id()}); }
  std::pair<T, std::thread::id> Get() { return future.get(); }
};

class HbmTierTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::unique_ptr<HbmDevice> device;
    if (GetParam() == "fake") {
      auto fake = std::make_unique<::kvtier::testing::FakeHbmDevice>(kPoolBytes, kStagingBytes, 8);
      fake_ = fake.get();
      device = std::move(fake);
    } else {
      KVTIER_SKIP_WITHOUT_DEVICE();
      auto cuda = CudaHbmDevice::Create(CudaHbmDeviceOptions{0, kPoolBytes, kStagingBytes, 8});
      ASSERT_TRUE(cuda.ok()) << cuda.status().ToString();
      cuda_ = cuda->get();
      device = std::move(*cuda);
    }
    auto tier = HbmTier::Create(std::move(device));
    ASSERT_TRUE(tier.ok()) << tier.status().ToString();
    tier_ = std::move(*tier);
  }

  Status WriteAndWait(uint64_t i, std::optional<uint64_t> checksum = std::nullopt) {
    const std::vector<std::byte> payload = Payload(i);
    auto done = std::make_shared<Completion<Status>>();
    Status accepted = tier_->Write(
        kNs, Key(i), kLayers, payload, [done](Status s) { done->Set(s); }, checksum);
    if (!accepted.ok()) return accepted;
    return done->Get().first;
  }
  Result<size_t> ReadAndWait(uint64_t i, uint32_t first, uint32_t last, std::span<std::byte> out,
                             std::thread::id* thread = nullptr) {
    auto done = std::make_shared<Completion<Result<size_t>>>();
    Status accepted = tier_->Read(Key(i), first, last, out, [done](Result<size_t> r) { done->Set(std::move(r)); });
    if (!accepted.ok()) return accepted;
    auto [result, on] = done->Get();
    if (thread != nullptr) *thread = on;
    return result;
  }
  Result<size_t> ReadAndWait(uint64_t i, uint32_t first, uint32_t last, std::vector<std::byte>& out) {
    out.assign((last - first) * kLayerBytes, std::byte{0});
    return ReadAndWait(i, first, last, std::span<std::byte>(out));
  }
  // Flips one byte of the device's memory at `offset` of the pool.
  void CorruptDeviceByte(uint64_t offset) {
    if (fake_ != nullptr) {
      fake_->memory()[offset] ^= std::byte{0x40};
    } else {
      ASSERT_EQ(cudaMemset(cuda_->pool().At(offset), 0x5a, 1), cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    }
  }
  int64_t Counter(std::string_view name) const {
    CounterCollector c;
    tier_->VisitCounters(c);
    for (const auto& [n, v] : c.counters()) {
      if (n == name) return v;
    }
    ADD_FAILURE() << "no counter " << name;
    return -1;
  }

  ::kvtier::testing::FakeHbmDevice* fake_ = nullptr;
  CudaHbmDevice* cuda_ = nullptr;
  std::unique_ptr<HbmTier> tier_;
};

// ---- What the HBM tier adds to the BlockTier contract (whose cases
// tests/unit/tier_contract_test.cc runs on it, params hbm and hbm_cuda) ----

TEST_P(HbmTierTest, AFullPoolIsNoSpaceUntilSomethingIsErased) {
  for (uint64_t i = 0; i < kPoolBytes / kBlockBytes; ++i) ASSERT_TRUE(WriteAndWait(100 + i).ok()) << i;
  EXPECT_EQ(WriteAndWait(200).code(), StatusCode::kNoSpace);
  EXPECT_EQ(Counter("hbm.no_space"), 1);
  ASSERT_TRUE(tier_->Erase(Key(100)).ok());
  EXPECT_TRUE(WriteAndWait(200).ok());
}

TEST_P(HbmTierTest, ACorruptLayerFailsOnlyTheReadsThatReturnItAndDropsTheBlock) {
  ASSERT_TRUE(WriteAndWait(20).ok());  // the first block of a fresh pool lands at offset 0
  CorruptDeviceByte(3 * kLayerBytes + 17);
  std::vector<std::byte> out;
  Result<size_t> clean = ReadAndWait(20, 0, 2, out);
  ASSERT_TRUE(clean.ok()) << "layers 0-1 verify on their own: " << clean.status().ToString();
  EXPECT_EQ(0, std::memcmp(out.data(), Payload(20).data(), 2 * kLayerBytes));
  EXPECT_EQ(ReadAndWait(20, 2, 4, out).status().code(), StatusCode::kCorruption);
  EXPECT_FALSE(tier_->Find(Key(20)).has_value()) << "a corrupt block is dropped";
  EXPECT_EQ(Counter("hbm.corrupt_reads"), 1);
  EXPECT_EQ(tier_->used_bytes(), 0u);
}

TEST_P(HbmTierTest, AWholeBlockReadVerifiesThePayloadChecksum) {
  ASSERT_TRUE(WriteAndWait(21).ok());
  CorruptDeviceByte(5);
  std::vector<std::byte> out;
  EXPECT_EQ(ReadAndWait(21, 0, kLayers, out).status().code(), StatusCode::kCorruption);
  EXPECT_FALSE(tier_->Find(Key(21)).has_value());
}

TEST_P(HbmTierTest, APinnedDestinationIsReadDirectlyAndStillVerified) {
  ASSERT_TRUE(WriteAndWait(22).ok());
  std::vector<std::byte> out(kBlockBytes);
  std::unique_ptr<gpu::HostRegistration> registration;
  if (fake_ != nullptr) {
    fake_->MarkPinned(out);
  } else {
    auto r = gpu::HostRegistration::Register(out);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    registration = std::move(*r);
  }
  Result<size_t> read = ReadAndWait(22, 1, kLayers, std::span<std::byte>(out));
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(0, std::memcmp(out.data(), Payload(22).data() + kLayerBytes, 3 * kLayerBytes));
  EXPECT_EQ(Counter("hbm.direct_reads"), 1);
  EXPECT_EQ(Counter("hbm.staging_read_bytes"), 0);
}

TEST_P(HbmTierTest, CountersCarryTheHbmPrefix) {
  ASSERT_TRUE(WriteAndWait(23).ok());
  CounterCollector c;
  tier_->VisitCounters(c);
  ASSERT_FALSE(c.counters().empty());
  // Its own counters, and the tier-independent families labelled with it.
  for (const auto& [name, value] : c.counters()) {
    EXPECT_TRUE(name.rfind("hbm.", 0) == 0 ||
                (name.rfind("tier.", 0) == 0 && name.find("{tier=\"hbm\"") != std::string::npos))
        << name;
  }
  EXPECT_EQ(Counter("hbm.blocks"), 1);
  EXPECT_EQ(Counter("hbm.writes"), 1);
}

// Work in flight: only the fake device can hold its stream back on demand.
class HbmTierFakeTest : public HbmTierTest {};

TEST_P(HbmTierFakeTest, ABlockIsInvisibleUntilItsCopyCompletes) {
  fake_->Hold();
  const std::vector<std::byte> payload = Payload(30);
  auto done = std::make_shared<Completion<Status>>();
  ASSERT_TRUE(tier_->Write(kNs, Key(30), kLayers, payload, [done](Status s) { done->Set(s); }).ok());
  EXPECT_FALSE(tier_->Find(Key(30)).has_value());
  std::vector<std::byte> out(kBlockBytes);
  EXPECT_EQ(tier_->Read(Key(30), 0, kLayers, out, [](Result<size_t>) {}).code(), StatusCode::kNotFound);
  EXPECT_EQ(WriteAndWait(30).code(), StatusCode::kAlreadyExists) << "being written counts as stored";
  fake_->Release();
  EXPECT_TRUE(done->Get().first.ok());
  EXPECT_TRUE(tier_->Find(Key(30)).has_value());
}

TEST_P(HbmTierFakeTest, EraseCancelsAWriteInFlightAndFreesItsRange) {
  fake_->Hold();
  const std::vector<std::byte> payload = Payload(31);
  auto done = std::make_shared<Completion<Status>>();
  ASSERT_TRUE(tier_->Write(kNs, Key(31), kLayers, payload, [done](Status s) { done->Set(s); }).ok());
  EXPECT_TRUE(tier_->Erase(Key(31)).ok());
  EXPECT_EQ(tier_->used_bytes(), 0u);
  fake_->Release();
  EXPECT_EQ(done->Get().first.code(), StatusCode::kCancelled);
  EXPECT_FALSE(tier_->Find(Key(31)).has_value());
  EXPECT_EQ(fake_->live_ranges(), 0u);
  EXPECT_TRUE(WriteAndWait(31).ok()) << "and the key can be written again";
}

TEST_P(HbmTierFakeTest, ReusedRangesKeepStreamOrder) {
  // Erase a block while a read of it is queued, and write another block
  // into the freed range: the read still returns the old, verified bytes.
  ASSERT_TRUE(WriteAndWait(32).ok());
  fake_->Hold();
  std::vector<std::byte> out(kBlockBytes);
  auto read = std::make_shared<Completion<Result<size_t>>>();
  ASSERT_TRUE(tier_->Read(Key(32), 0, kLayers, out, [read](Result<size_t> r) { read->Set(std::move(r)); }).ok());
  ASSERT_TRUE(tier_->Erase(Key(32)).ok());
  const std::vector<std::byte> next = Payload(33);
  auto written = std::make_shared<Completion<Status>>();
  ASSERT_TRUE(tier_->Write(kNs, Key(33), kLayers, next, [written](Status s) { written->Set(s); }).ok());
  fake_->Release();
  Result<size_t> r = read->Get().first;
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(out, Payload(32));
  EXPECT_TRUE(written->Get().first.ok());
}

TEST_P(HbmTierFakeTest, StagingAndFencesRunningOutIsBusyNotAStall) {
  fake_->Hold();
  std::vector<std::shared_ptr<Completion<Status>>> done;
  const std::vector<std::byte> payload = Payload(40);
  Status s;
  int accepted = 0;
  for (uint64_t i = 0; i < 10; ++i) {
    auto d = std::make_shared<Completion<Status>>();
    s = tier_->Write(kNs, Key(40 + i), kLayers, payload, [d](Status st) { d->Set(st); });
    if (!s.ok()) break;
    done.push_back(d);
    ++accepted;
  }
  EXPECT_EQ(s.code(), StatusCode::kBusy) << s.ToString();
  EXPECT_EQ(accepted, 6) << "3/4 of 8 blocks of staging";
  EXPECT_GE(Counter("hbm.busy"), 1);
  fake_->Release();
  for (auto& d : done) EXPECT_TRUE(d->Get().first.ok());
  EXPECT_EQ(Counter("hbm.staging_write_bytes"), 0);
}

TEST_P(HbmTierFakeTest, ADeviceFaultFailsTheWriteAndLeavesNothing) {
  fake_->FailCopies();
  EXPECT_EQ(WriteAndWait(50).code(), StatusCode::kIoError);
  EXPECT_FALSE(tier_->Find(Key(50)).has_value());
  EXPECT_EQ(tier_->used_bytes(), 0u);
  EXPECT_EQ(Counter("hbm.write_failures"), 1);
}

INSTANTIATE_TEST_SUITE_P(Devices, HbmTierTest, ::testing::Values("fake", "cuda"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });
INSTANTIATE_TEST_SUITE_P(Devices, HbmTierFakeTest, ::testing::Values("fake"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace kvtier

// The BlockDevice contract, checked against every implementation: the
// memory device of tests/testing, the pread/pwrite thread pool and io_uring
// (the last skips, saying why, where io_uring cannot be set up).
#include "tiers/nvme/block_device.h"

#include <gtest/gtest.h>

#include <atomic>

#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <future>
#include <memory>
#include <random>
#include <sys/mman.h>
#include <thread>
#include <unistd.h>

#include "tests/testing/memory_device.h"
#include "tests/testing/test_daemon.h"
#include "tiers/nvme/device_file.h"

namespace kvtier {
namespace {

using ::kvtier::testing::MakeTempDir;
using ::kvtier::testing::RemoveTree;

constexpr uint64_t kCapacity = 8 << 20;
constexpr uint32_t kAlign = 4096;

// Page-aligned buffer (O_DIRECT needs aligned memory).
class AlignedBuffer {
 public:
  explicit AlignedBuffer(size_t bytes) : bytes_(bytes) {
    data_ = static_cast<std::byte*>(std::aligned_alloc(kAlign, bytes == 0 ? kAlign : bytes));
  }
  ~AlignedBuffer() { std::free(data_); }
  std::span<std::byte> span() { return {data_, bytes_}; }
  std::byte* data() { return data_; }

 private:
  std::byte* data_;
  size_t bytes_;
};

void Fill(std::span<std::byte> out, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (auto& b : out) b = static_cast<std::byte>(rng());
}

enum class Kind { kMemory, kThreads, kIoUring };
std::string KindName(const ::testing::TestParamInfo<Kind>& info) {
  switch (info.param) {
    case Kind::kMemory:
      return "Memory";
    case Kind::kThreads:
      return "Threads";
    case Kind::kIoUring:
      return "IoUring";
  }
  return "Unknown";
}

class BlockDeviceTest : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    if (GetParam() == Kind::kMemory) {
      device_ = std::make_unique<::kvtier::testing::MemoryDevice>(kCapacity);
      return;
    }
    BlockDeviceOptions options;
    options.path = dir_ + "/tier.dat";
    options.capacity_bytes = kCapacity;
    options.queue_depth = 8;
    options.io_threads = 2;
    options.engine = GetParam() == Kind::kThreads ? IoEngine::kThreads : IoEngine::kIoUring;
    auto device = OpenBlockDevice(options);
    if (!device.ok() && device.status().code() == StatusCode::kInvalidArgument) {
      options.direct_io = false;  // a file system without O_DIRECT (tmpfs): test the engine anyway
      device = OpenBlockDevice(options);
    }
    if (!device.ok() && device.status().code() == StatusCode::kUnavailable) {
      GTEST_SKIP() << "io_uring cannot be set up here: " << device.status().ToString();
    }
    ASSERT_TRUE(device.ok()) << device.status().ToString();
    device_ = std::move(*device);
  }
  void TearDown() override {
    device_.reset();
    RemoveTree(dir_);
  }

  std::string dir_;
  std::unique_ptr<BlockDevice> device_;
};

TEST_P(BlockDeviceTest, ReportsGeometryAndKind) {
  EXPECT_EQ(device_->capacity_bytes(), kCapacity);
  EXPECT_EQ(device_->alignment_bytes(), kAlign);
  const std::string_view want = GetParam() == Kind::kMemory    ? "memory"
                                : GetParam() == Kind::kThreads ? "threads"
                                                               : "io_uring";
  EXPECT_EQ(device_->kind(), want);
}

TEST_P(BlockDeviceTest, ManyConcurrentWritesReadBackExactly) {
  constexpr size_t kOps = 64;
  constexpr size_t kBytes = 64 << 10;
  AlignedBuffer out(kOps * kBytes), in(kOps * kBytes);
  Fill(out.span(), 7);
  std::vector<std::future<Result<size_t>>> writes;
  std::vector<std::shared_ptr<std::promise<Result<size_t>>>> promises;
  for (size_t i = 0; i < kOps; ++i) {  // all in flight at once: more than the queue depth
    auto p = std::make_shared<std::promise<Result<size_t>>>();
    writes.push_back(p->get_future());
    device_->Write(i * kBytes, out.span().subspan(i * kBytes, kBytes),
                   [p](Result<size_t> r) { p->set_value(std::move(r)); });
  }
  for (auto& w : writes) {
    auto r = w.get();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(*r, kBytes);
  }
  ASSERT_TRUE(FlushSync(*device_).ok());
  std::vector<std::future<Result<size_t>>> reads;
  for (size_t i = kOps; i-- > 0;) {  // reverse order: completions are matched by op, not by position
    auto p = std::make_shared<std::promise<Result<size_t>>>();
    reads.push_back(p->get_future());
    device_->Read(i * kBytes, in.span().subspan(i * kBytes, kBytes),
                  [p](Result<size_t> r) { p->set_value(std::move(r)); });
  }
  for (auto& r : reads) {
    auto got = r.get();
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, kBytes);
  }
  EXPECT_EQ(std::memcmp(out.data(), in.data(), kOps * kBytes), 0);
}

TEST_P(BlockDeviceTest, LargeTransferAndLastBlockOfTheDevice) {
  AlignedBuffer out(4 << 20), in(4 << 20);
  Fill(out.span(), 8);
  const uint64_t at = kCapacity - (4 << 20);  // ends exactly at the capacity
  auto w = WriteSync(*device_, at, out.span());
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(*w, 4u << 20);
  auto r = ReadSync(*device_, at, in.span());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, 4u << 20);
  EXPECT_EQ(std::memcmp(out.data(), in.data(), 4 << 20), 0);
}

TEST_P(BlockDeviceTest, MisalignedOrOutOfRangeIsInvalidArgumentAndDeviceKeepsWorking) {
  AlignedBuffer buffer(3 * kAlign);
  Fill(buffer.span(), 9);
  auto code = [](const Result<size_t>& r) { return r.ok() ? StatusCode::kOk : r.status().code(); };
  EXPECT_EQ(code(WriteSync(*device_, 100, buffer.span().first(kAlign))), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(WriteSync(*device_, 0, buffer.span().first(100))), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(ReadSync(*device_, 0, buffer.span().subspan(8, kAlign))), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(ReadSync(*device_, kCapacity - kAlign, buffer.span().first(2 * kAlign))),
            StatusCode::kInvalidArgument);
  auto past = ReadSync(*device_, kCapacity, buffer.span().first(kAlign));
  EXPECT_EQ(code(past), StatusCode::kInvalidArgument);
  if (!past.ok()) {
    EXPECT_NE(past.status().message().find("runs past"), std::string::npos) << past.status().message();
  }
  auto good = WriteSync(*device_, kAlign, buffer.span().first(kAlign));
  EXPECT_TRUE(good.ok()) << good.status().ToString();
}

TEST_P(BlockDeviceTest, CompletionsNeverRunInlineOnTheSubmitter) {
  AlignedBuffer buffer(kAlign);
  std::mutex held;  // not recursive: an inline completion taking it would deadlock
  std::promise<std::thread::id> ran_on;
  auto future = ran_on.get_future();
  {
    std::lock_guard lock(held);
    device_->Read(0, buffer.span(), [&](Result<size_t>) {
      std::lock_guard again(held);
      ran_on.set_value(std::this_thread::get_id());
    });
  }
  ASSERT_EQ(future.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_NE(future.get(), std::this_thread::get_id());
  // Rejected requests too.
  std::promise<std::thread::id> rejected_on;
  auto rejected = rejected_on.get_future();
  device_->Read(1, buffer.span(), [&](Result<size_t>) { rejected_on.set_value(std::this_thread::get_id()); });
  ASSERT_EQ(rejected.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_NE(rejected.get(), std::this_thread::get_id());
}

TEST_P(BlockDeviceTest, RegisteredBuffersCarryIo) {
  AlignedBuffer slab(1 << 20), in(256 << 10);
  std::span<std::byte> slabs[] = {slab.span()};
  ASSERT_TRUE(device_->RegisterBuffers(slabs).ok());
  Fill(slab.span(), 10);
  // Inside the fixed buffer, at an offset into it, and a read into it.
  auto w = WriteSync(*device_, 0, slab.span().subspan(64 << 10, 256 << 10));
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  auto r = ReadSync(*device_, 0, in.span());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(std::memcmp(in.data(), slab.data() + (64 << 10), 256 << 10), 0);
  auto back = ReadSync(*device_, 0, slab.span().first(256 << 10));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(std::memcmp(in.data(), slab.data(), 256 << 10), 0);
  CounterCollector counters;
  device_->VisitCounters(counters);
  std::map<std::string, int64_t> c(counters.counters().begin(), counters.counters().end());
  EXPECT_EQ(c["nvme.device.writes"], 1);
  EXPECT_EQ(c["nvme.device.reads"], 2);
  EXPECT_EQ(c["nvme.device.written_bytes"], 256 << 10);
}

INSTANTIATE_TEST_SUITE_P(AllDevices, BlockDeviceTest, ::testing::Values(Kind::kMemory, Kind::kThreads, Kind::kIoUring),
                         KindName);

// A file written through one engine reads back through the other after a
// close: both address the same bytes of the same file.
// io_uring: a read submitted behind a queue of writes overtakes them (the
// writes keep a share of the depth, so they finish too).
TEST(UringDevice, ReadsGoBeforeQueuedWrites) {
  const std::string dir = MakeTempDir();
  BlockDeviceOptions options;
  options.path = dir + "/tier.dat";
  options.capacity_bytes = kCapacity;
  options.queue_depth = 2;
  options.io_threads = 1;
  options.engine = IoEngine::kIoUring;
  auto device = OpenBlockDevice(options);
  if (!device.ok() && device.status().code() == StatusCode::kInvalidArgument) {
    options.direct_io = false;
    device = OpenBlockDevice(options);
  }
  if (!device.ok() && device.status().code() == StatusCode::kUnavailable) {
    RemoveTree(dir);
    GTEST_SKIP() << "io_uring cannot be set up here: " << device.status().ToString();
  }
  ASSERT_TRUE(device.ok()) << device.status().ToString();
  constexpr int kWrites = 32;
  constexpr size_t kBytes = 256 << 10;
  AlignedBuffer source(kBytes);
  AlignedBuffer target(kAlign);
  std::atomic<int> completed{0};
  std::atomic<int> read_at{-1};
  std::promise<void> all_done;
  auto finished = [&] {
    if (completed.fetch_add(1) + 1 == kWrites + 1) all_done.set_value();
  };
  for (int i = 0; i < kWrites; ++i) {
    (*device)->Write(uint64_t(i) * kBytes, source.span(), [&](Result<size_t> r) {
      EXPECT_TRUE(r.ok()) << r.status().ToString();
      finished();
    });
  }
  (*device)->Read(0, target.span(), [&](Result<size_t> r) {
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    read_at = completed.load();
    finished();
  });
  ASSERT_EQ(all_done.get_future().wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_GE(read_at.load(), 0);
  EXPECT_LT(read_at.load(), kWrites / 4) << "the read waited behind the queued writes";
  device->reset();
  RemoveTree(dir);
}

TEST(OpenBlockDevice, EnginesShareTheOnDiskFormat) {
  const std::string dir = MakeTempDir();
  BlockDeviceOptions options;
  options.path = dir + "/tier.dat";
  options.capacity_bytes = 1 << 20;
  options.direct_io = false;
  options.engine = IoEngine::kThreads;
  AlignedBuffer out(64 << 10), in(64 << 10);
  Fill(out.span(), 11);
  {
    auto device = OpenBlockDevice(options);
    ASSERT_TRUE(device.ok()) << device.status().ToString();
    ASSERT_TRUE(WriteSync(**device, 128 << 10, out.span()).ok());
    ASSERT_TRUE(FlushSync(**device).ok());
  }
  options.engine = IoEngine::kAuto;
  auto device = OpenBlockDevice(options);
  ASSERT_TRUE(device.ok()) << device.status().ToString();
  auto r = ReadSync(**device, 128 << 10, in.span());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(std::memcmp(out.data(), in.data(), 64 << 10), 0);
  device->reset();
  RemoveTree(dir);
}

TEST(OpenBlockDevice, BadOptionsAreClearErrors) {
  const std::string dir = MakeTempDir();
  BlockDeviceOptions options;
  options.path = dir + "/tier.dat";
  options.capacity_bytes = 1 << 20;
  options.direct_io = false;

  auto expect = [&](BlockDeviceOptions o, StatusCode code, const std::string& part) {
    auto d = OpenBlockDevice(o);
    ASSERT_FALSE(d.ok());
    EXPECT_EQ(d.status().code(), code) << d.status().ToString();
    EXPECT_NE(d.status().message().find(part), std::string::npos) << d.status().message();
  };
  BlockDeviceOptions o = options;
  o.capacity_bytes = 0;
  expect(o, StatusCode::kInvalidArgument, "multiple of 4096");
  o = options;
  o.capacity_bytes = (1 << 20) + 1;
  expect(o, StatusCode::kInvalidArgument, "multiple of 4096");
  o = options;
  o.queue_depth = 0;
  expect(o, StatusCode::kInvalidArgument, "queue depth");
  o = options;
  o.io_threads = 0;
  expect(o, StatusCode::kInvalidArgument, "I/O threads");
  o = options;
  o.path = dir + "/no/such/dir/tier.dat";
  expect(o, StatusCode::kIoError, o.path);
  o = options;
  o.path = dir;  // a directory
  expect(o, StatusCode::kIoError, dir);
  o = options;
  o.path = "";
  expect(o, StatusCode::kInvalidArgument, "empty");
  RemoveTree(dir);
}

TEST(DeviceFile, MapsErrnoToStatus) {
  EXPECT_EQ(ErrnoStatus(ENOSPC, "x").code(), StatusCode::kNoSpace);
  EXPECT_EQ(ErrnoStatus(EDQUOT, "x").code(), StatusCode::kNoSpace);
  EXPECT_EQ(ErrnoStatus(EINVAL, "x").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ErrnoStatus(EIO, "x").code(), StatusCode::kIoError);
  EXPECT_NE(ErrnoStatus(EIO, "pwrite of tier.dat").message().find("pwrite of tier.dat"), std::string::npos);
}

}  // namespace
}  // namespace kvtier

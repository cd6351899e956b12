#include "tiers/nvme/block_device.h"

#include <future>

#include "common/logging.h"
#include "tiers/nvme/device_file.h"
#include "tiers/nvme/thread_pool_device.h"
#include "tiers/nvme/uring_device.h"

namespace kvtier {

Status BlockDevice::CheckRange(uint64_t offset, size_t length, const void* address) const {
  const uint64_t align = alignment_bytes();
  if (offset % align != 0 || length % align != 0 || reinterpret_cast<uintptr_t>(address) % align != 0) {
    return InvalidArgument("I/O of " + std::to_string(length) + " bytes at offset " + std::to_string(offset) +
                           " is not aligned to " + std::to_string(align) + " bytes");
  }
  if (offset > capacity_bytes() || length > capacity_bytes() - offset) {
    return InvalidArgument("I/O of " + std::to_string(length) + " bytes at offset " + std::to_string(offset) +
                           " runs past the device's " + std::to_string(capacity_bytes()) + " bytes");
  }
  return Status::Ok();
}

void DeviceCounters::Record(Op op, const Result<size_t>& outcome) {
  constexpr auto relaxed = std::memory_order_relaxed;
  if (!outcome.ok()) {
    errors_.fetch_add(1, relaxed);
    return;
  }
  const auto bytes = static_cast<int64_t>(*outcome);
  switch (op) {
    case Op::kRead:
      reads_.fetch_add(1, relaxed);
      read_bytes_.fetch_add(bytes, relaxed);
      break;
    case Op::kWrite:
      writes_.fetch_add(1, relaxed);
      written_bytes_.fetch_add(bytes, relaxed);
      break;
    case Op::kFlush:
      flushes_.fetch_add(1, relaxed);
      break;
  }
}

void DeviceCounters::Visit(CounterVisitor& v) const {
  auto load = [](const std::atomic<int64_t>& a) { return a.load(std::memory_order_relaxed); };
  v.Visit("nvme.device.reads", load(reads_));
  v.Visit("nvme.device.writes", load(writes_));
  v.Visit("nvme.device.flushes", load(flushes_));
  v.Visit("nvme.device.errors", load(errors_));
  v.Visit("nvme.device.read_bytes", load(read_bytes_));
  v.Visit("nvme.device.written_bytes", load(written_bytes_));
}

namespace {

template <typename Submit>
Result<size_t> Wait(Submit submit) {
  std::promise<Result<size_t>> promise;
  auto future = promise.get_future();
  submit([&promise](Result<size_t> r) { promise.set_value(std::move(r)); });
  return future.get();
}

}  // namespace

Result<size_t> ReadSync(BlockDevice& device, uint64_t offset, std::span<std::byte> dst) {
  return Wait([&](IoDone done) { device.Read(offset, dst, std::move(done)); });
}

Result<size_t> WriteSync(BlockDevice& device, uint64_t offset, std::span<const std::byte> src) {
  return Wait([&](IoDone done) { device.Write(offset, src, std::move(done)); });
}

Status FlushSync(BlockDevice& device) {
  return Wait([&](IoDone done) { device.Flush(std::move(done)); }).status();
}

Result<std::unique_ptr<BlockDevice>> OpenBlockDevice(const BlockDeviceOptions& options) {
  if (options.queue_depth == 0 || options.queue_depth > 4096) {
    return InvalidArgument("nvme queue depth must be in [1, 4096], got " + std::to_string(options.queue_depth));
  }
  if (options.io_threads == 0 || options.io_threads > 64) {
    return InvalidArgument("nvme I/O threads must be in [1, 64], got " + std::to_string(options.io_threads));
  }
  auto file = DeviceFile::Open(options);
  if (!file.ok()) return file.status();
  if (options.engine != IoEngine::kThreads) {
    // Takes the file only when it succeeds.
    auto uring = UringDevice::Create(std::move(*file), options.queue_depth, options.io_threads);
    if (uring.ok()) return std::unique_ptr<BlockDevice>(std::move(*uring));
    if (options.engine == IoEngine::kIoUring) return uring.status();
    spdlog::warn("io_uring unavailable for {} ({}); using the pread/pwrite thread pool", options.path,
                 uring.status().ToString());
  }
  return std::unique_ptr<BlockDevice>(
      std::make_unique<ThreadPoolDevice>(std::move(*file), options.queue_depth, options.io_threads));
}

}  // namespace kvtier

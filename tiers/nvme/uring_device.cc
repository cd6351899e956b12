#include "tiers/nvme/uring_device.h"

#include "tiers/nvme/uring_worker.h"

namespace kvtier {

Result<std::unique_ptr<UringDevice>> UringDevice::Create(DeviceFile&& file, uint32_t queue_depth, uint32_t io_threads) {
  std::unique_ptr<UringDevice> device(new UringDevice());
  for (uint32_t i = 0; i < io_threads; ++i) {
    auto worker = UringWorker::Create(file.fd(), queue_depth, device->counters_);
    if (!worker.ok()) return worker.status();  // `file` untouched: the caller may fall back
    device->workers_.push_back(std::move(*worker));
  }
  device->file_ = std::move(file);  // same fd: the workers' borrowed fd stays valid
  return device;
}

UringDevice::~UringDevice() { workers_.clear(); }  // drains the rings before file_ closes the fd

UringWorker& UringDevice::NextWorker() {
  return *workers_[next_worker_.fetch_add(1, std::memory_order_relaxed) % workers_.size()];
}

namespace {

std::unique_ptr<UringWorker::Op> MakeOp(DeviceCounters::Op kind, uint64_t offset, std::byte* data, size_t length,
                                        IoDone done) {
  auto op = std::make_unique<UringWorker::Op>();
  static_cast<IoJob&>(*op) = IoJob{kind, offset, data, length, std::move(done)};
  return op;
}

}  // namespace

void UringDevice::Read(uint64_t offset, std::span<std::byte> dst, IoDone done) {
  auto op = MakeOp(DeviceCounters::Op::kRead, offset, dst.data(), dst.size(), std::move(done));
  op->rejected = CheckRange(offset, dst.size(), dst.data());
  NextWorker().Submit(std::move(op));
}

void UringDevice::Write(uint64_t offset, std::span<const std::byte> src, IoDone done) {
  auto op = MakeOp(DeviceCounters::Op::kWrite, offset, const_cast<std::byte*>(src.data()), src.size(), std::move(done));
  op->rejected = CheckRange(offset, src.size(), src.data());
  NextWorker().Submit(std::move(op));
}

void UringDevice::Flush(IoDone done) {
  // Each ring completes its own writes; an fdatasync on any ring covers
  // every write that completed before it, on whichever ring.
  NextWorker().Submit(MakeOp(DeviceCounters::Op::kFlush, 0, nullptr, 0, std::move(done)));
}

Status UringDevice::RegisterBuffers(std::span<const std::span<std::byte>> buffers) {
  std::vector<iovec> iovecs;
  for (const auto& b : buffers) iovecs.push_back(iovec{b.data(), b.size()});
  for (auto& worker : workers_) {
    if (Status s = worker->RegisterBuffers(iovecs); !s.ok()) return s;
  }
  return Status::Ok();
}

void UringDevice::VisitCounters(CounterVisitor& visitor) const { counters_.Visit(visitor); }

}  // namespace kvtier

#include "tests/testing/memory_device.h"

#include <cstring>

namespace kvtier::testing {

MemoryDevice::MemoryDevice(uint64_t capacity_bytes, uint32_t alignment_bytes)
    : bytes_(capacity_bytes), alignment_(alignment_bytes), thread_([this] { Loop(); }) {}

MemoryDevice::~MemoryDevice() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void MemoryDevice::Read(uint64_t offset, std::span<std::byte> dst, IoDone done) {
  Submit(Job{DeviceCounters::Op::kRead, offset, dst.data(), dst.size(), std::move(done)});
}

void MemoryDevice::Write(uint64_t offset, std::span<const std::byte> src, IoDone done) {
  Submit(Job{DeviceCounters::Op::kWrite, offset, const_cast<std::byte*>(src.data()), src.size(), std::move(done)});
}

void MemoryDevice::Flush(IoDone done) { Submit(Job{DeviceCounters::Op::kFlush, 0, nullptr, 0, std::move(done)}); }

void MemoryDevice::Submit(Job job) {
  std::lock_guard lock(mu_);
  queue_.push_back(std::move(job));
  cv_.notify_one();
}

void MemoryDevice::Loop() {
  for (;;) {
    Job job;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    Result<size_t> outcome = size_t{0};
    if (job.op != DeviceCounters::Op::kFlush) {
      Status s = CheckRange(job.offset, job.length, job.data);
      if (!s.ok()) {
        outcome = s;
      } else {
        if (job.op == DeviceCounters::Op::kRead) {
          std::memcpy(job.data, bytes_.data() + job.offset, job.length);
        } else {
          std::memcpy(bytes_.data() + job.offset, job.data, job.length);
        }
        outcome = job.length;
      }
    }
    counters_.Record(job.op, outcome);
    job.done(std::move(outcome));
  }
}

}  // namespace kvtier::testing

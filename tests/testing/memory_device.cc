#include "tests/testing/memory_device.h"

#include <cstring>

namespace kvtier::testing {

MemoryDevice::MemoryDevice(uint64_t capacity_bytes, uint32_t alignment_bytes)
    : bytes_(capacity_bytes), alignment_(alignment_bytes) {}

MemoryDevice::~MemoryDevice() = default;

void MemoryDevice::Read(uint64_t offset, std::span<std::byte> dst, IoDone done) {
  Submit(Job{DeviceCounters::Op::kRead, offset, dst.data(), dst.size(), std::move(done)});
}

void MemoryDevice::Write(uint64_t offset, std::span<const std::byte> src, IoDone done) {
  Submit(Job{DeviceCounters::Op::kWrite, offset, const_cast<std::byte*>(src.data()), src.size(), std::move(done)});
}

void MemoryDevice::Flush(IoDone done) { Submit(Job{DeviceCounters::Op::kFlush, 0, nullptr, 0, std::move(done)}); }

void MemoryDevice::Submit(Job job) {
  thread_.Post([this, job = std::move(job)] {
    Result<size_t> outcome = Run(job);
    counters_.Record(job.kind, outcome);
    job.done(std::move(outcome));
  });
}

Result<size_t> MemoryDevice::Run(const Job& job) {
  if (job.kind == DeviceCounters::Op::kFlush) return size_t{0};
  if (Status s = CheckRange(job.offset, job.length, job.data); !s.ok()) return s;
  if (job.kind == DeviceCounters::Op::kRead) {
    std::memcpy(job.data, bytes_.data() + job.offset, job.length);
  } else {
    std::memcpy(bytes_.data() + job.offset, job.data, job.length);
  }
  return job.length;
}

}  // namespace kvtier::testing

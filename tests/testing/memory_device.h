// MemoryDevice: a BlockDevice in process memory, for tests. Same contract as
// the real devices (alignment and range checks, completions on a device
// thread, never inline), so code that passes against it behaves the same on
// io_uring. Flush is a no-op that completes in order.
//
// Thread-safe. One completion thread runs I/Os in submission order.
#pragma once

#include <vector>

#include "common/worker_pool.h"
#include "tiers/nvme/block_device.h"

namespace kvtier::testing {

class MemoryDevice final : public BlockDevice {
 public:
  // `capacity_bytes` of zeros; alignment as given (a power of two).
  explicit MemoryDevice(uint64_t capacity_bytes, uint32_t alignment_bytes = 4096);
  ~MemoryDevice() override;  // completes everything submitted first

  uint64_t capacity_bytes() const override { return bytes_.size(); }
  uint32_t alignment_bytes() const override { return alignment_; }
  std::string_view kind() const override { return "memory"; }

  void Read(uint64_t offset, std::span<std::byte> dst, IoDone done) override;
  void Write(uint64_t offset, std::span<const std::byte> src, IoDone done) override;
  void Flush(IoDone done) override;
  void VisitCounters(CounterVisitor& visitor) const override { counters_.Visit(visitor); }

  // Direct access for tests that corrupt or inspect the medium. Not
  // synchronized with in-flight I/O: call when the device is idle.
  std::span<std::byte> raw() { return bytes_; }

 private:
  using Job = IoJob;
  void Submit(Job job);
  Result<size_t> Run(const Job& job);

  std::vector<std::byte> bytes_;
  const uint32_t alignment_;
  DeviceCounters counters_;
  WorkerPool thread_{1};  // last: drained and joined first
};

}  // namespace kvtier::testing

// ThreadPoolDevice: BlockDevice over pread/pwrite/fdatasync on a pool of
// threads. The fallback when io_uring cannot be set up (seccomp filters,
// old kernels, io_uring_disabled). Each thread has one I/O in flight, so
// the pool has io_threads * queue_depth threads (at most 64).
//
// Thread-safe. Completions run on the pool's threads. The destructor lets
// every submitted I/O complete, then joins; submitting while it runs is a
// caller bug.
#pragma once

#include "common/worker_pool.h"
#include "tiers/nvme/block_device.h"
#include "tiers/nvme/device_file.h"

namespace kvtier {

class ThreadPoolDevice final : public BlockDevice {
 public:
  ThreadPoolDevice(DeviceFile file, uint32_t queue_depth, uint32_t io_threads);
  ~ThreadPoolDevice() override;

  uint64_t capacity_bytes() const override { return file_.capacity_bytes(); }
  uint32_t alignment_bytes() const override { return file_.alignment_bytes(); }
  std::string_view kind() const override { return "threads"; }

  void Read(uint64_t offset, std::span<std::byte> dst, IoDone done) override;
  void Write(uint64_t offset, std::span<const std::byte> src, IoDone done) override;
  void Flush(IoDone done) override;
  void VisitCounters(CounterVisitor& visitor) const override { counters_.Visit(visitor); }

 private:
  using Op = DeviceCounters::Op;
  using Job = IoJob;

  void Submit(Job job);
  Result<size_t> Run(const Job& job);

  DeviceFile file_;
  DeviceCounters counters_;
  WorkerPool pool_;  // last: drained and joined before the file closes
};

}  // namespace kvtier

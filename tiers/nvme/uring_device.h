// UringDevice: BlockDevice on io_uring. One ring per I/O thread (never a
// process-wide ring); each thread batches the submissions queued to it into
// one io_uring_enter, reaps completions, and maps each back to its
// operation. Buffers registered with RegisterBuffers are used as fixed
// buffers (READ_FIXED / WRITE_FIXED) whenever an I/O lies inside one.
//
// Thread-safe. Completions run on the ring's thread. Submissions are spread
// over the rings round-robin. The destructor lets every submitted I/O
// complete, then stops the threads; submitting while it runs is a caller bug.
#pragma once

#include <atomic>
#include <memory>
#include <vector>

#include "tiers/nvme/block_device.h"
#include "tiers/nvme/device_file.h"

namespace kvtier {

class UringWorker;

class UringDevice final : public BlockDevice {
 public:
  // Sets up `io_threads` rings of `queue_depth` entries and their threads.
  // Takes `file` only on success. Errors: Unavailable when io_uring cannot
  // be used here (ENOSYS, EPERM from seccomp or io_uring_disabled, ENOMEM
  // from RLIMIT_MEMLOCK on old kernels), naming the cause.
  static Result<std::unique_ptr<UringDevice>> Create(DeviceFile&& file, uint32_t queue_depth, uint32_t io_threads);
  ~UringDevice() override;

  uint64_t capacity_bytes() const override { return file_.capacity_bytes(); }
  uint32_t alignment_bytes() const override { return file_.alignment_bytes(); }
  std::string_view kind() const override { return "io_uring"; }

  void Read(uint64_t offset, std::span<std::byte> dst, IoDone done) override;
  void Write(uint64_t offset, std::span<const std::byte> src, IoDone done) override;
  void Flush(IoDone done) override;
  // Registers the buffers with every ring (waits for each ring's thread).
  // FailedPrecondition if buffers were registered before; the kernel's
  // error (e.g. ENOMEM for RLIMIT_MEMLOCK) otherwise.
  Status RegisterBuffers(std::span<const std::span<std::byte>> buffers) override;
  void VisitCounters(CounterVisitor& visitor) const override;

 private:
  UringDevice() = default;
  UringWorker& NextWorker();

  DeviceFile file_;
  std::vector<std::unique_ptr<UringWorker>> workers_;
  std::atomic<uint32_t> next_worker_{0};
  DeviceCounters counters_;
};

}  // namespace kvtier

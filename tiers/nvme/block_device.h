// BlockDevice: the I/O seam of the NVMe tier. Aligned, asynchronous reads,
// writes and flushes on one file or block device, so the tier never knows
// whether io_uring, a thread pool or memory (tests) moves its bytes.
//
// Implementations: UringDevice (io_uring, one ring per I/O thread),
// ThreadPoolDevice (pread/pwrite fallback), and in tests/testing a memory
// device and a fault-injecting wrapper. OpenBlockDevice picks the first two.
//
// Thread-safe: any thread may submit. Completions run exactly once, on a
// device thread, never inline in the submitting call, so a caller may hold
// its own lock while submitting and take it again in the callback.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "common/counters.h"
#include "kvtier/result.h"
#include "policy/option_defaults.h"

namespace kvtier {

// Completion of one I/O: the bytes transferred (fewer than asked for is a
// short transfer, which the caller must treat as a failure of that range) or
// an error: IoError (EIO and the like), NoSpace (ENOSPC), InvalidArgument
// (misaligned or out-of-range request), Unavailable (the device is closing).
using IoDone = std::function<void(Result<size_t>)>;

class BlockDevice {
 public:
  virtual ~BlockDevice() = default;

  // Bytes addressable: offsets + lengths never exceed this.
  virtual uint64_t capacity_bytes() const = 0;
  // Offsets, lengths and buffer addresses must be multiples of this
  // (4096 for O_DIRECT on today's drives).
  virtual uint32_t alignment_bytes() const = 0;
  // "io_uring", "threads", "memory", ... for logs and stats.
  virtual std::string_view kind() const = 0;

  // Reads dst.size() bytes at `offset` into `dst`. `dst` is borrowed until
  // `done` runs.
  virtual void Read(uint64_t offset, std::span<std::byte> dst, IoDone done) = 0;
  // Writes `src` at `offset`. `src` is borrowed until `done` runs.
  virtual void Write(uint64_t offset, std::span<const std::byte> src, IoDone done) = 0;
  // Makes every write completed before this call durable (fdatasync);
  // completes with 0 bytes.
  virtual void Flush(IoDone done) = 0;

  // Registers long-lived buffers (staging slabs) once, so I/O inside them
  // skips per-request page pinning (io_uring fixed buffers). Optional: a
  // device without the notion accepts and ignores them. Call before the
  // first I/O that uses them; the buffers must outlive the device.
  virtual Status RegisterBuffers(std::span<const std::span<std::byte>> buffers) { return Status::Ok(); }

  virtual void VisitCounters(CounterVisitor& visitor) const {}

 protected:
  // InvalidArgument unless [offset, offset + length) lies on the device and
  // offset, length and `address` are aligned. For implementations.
  Status CheckRange(uint64_t offset, size_t length, const void* address) const;
};

// The counters every device implementation reports (nvme.device.*).
// Thread-safe.
class DeviceCounters {
 public:
  enum class Op { kRead, kWrite, kFlush };
  // Records one completed I/O with its outcome.
  void Record(Op op, const Result<size_t>& outcome);
  void Visit(CounterVisitor& visitor) const;

 private:
  std::atomic<int64_t> reads_{0}, writes_{0}, flushes_{0}, errors_{0};
  std::atomic<int64_t> read_bytes_{0}, written_bytes_{0};
};

// One I/O as queue-based implementations carry it (data is writable for
// reads; for writes it is the caller's const buffer, never written).
struct IoJob {
  DeviceCounters::Op kind = DeviceCounters::Op::kFlush;
  uint64_t offset = 0;
  std::byte* data = nullptr;
  size_t length = 0;
  IoDone done;
};

// Blocking helpers (start-up, tests): submit and wait for the completion.
Result<size_t> ReadSync(BlockDevice& device, uint64_t offset, std::span<std::byte> dst);
Result<size_t> WriteSync(BlockDevice& device, uint64_t offset, std::span<const std::byte> src);
Status FlushSync(BlockDevice& device);

enum class IoEngine {
  kAuto,     // io_uring, else threads (logged once)
  kIoUring,  // io_uring or fail
  kThreads,  // pread/pwrite thread pool
};
// (kvtierd's nvme.io_engine names them: daemon/config/option_choices.h.)

struct BlockDeviceOptions {
  std::string path;                          // a regular file (created and preallocated) or a block device
  uint64_t capacity_bytes = 0;               // regular file: its size; block device: 0 = the whole device
  bool direct_io = defaults::kNvmeDirectIo;  // O_DIRECT: bypass the page cache
  // Regular file: allocate every byte at open (fallocate), so a full file
  // system fails the open, never a write. false: a sparse file whose
  // writes may hit ENOSPC later (the tier then reports itself full).
  bool preallocate = defaults::kNvmePreallocate;
  uint32_t queue_depth = defaults::kNvmeQueueDepth;  // in-flight I/Os per I/O thread
  uint32_t io_threads = defaults::kNvmeIoThreads;    // threads (and io_uring rings) doing I/O
  IoEngine engine = IoEngine::kAuto;
};

// Opens (creating and fallocating a regular file to capacity_bytes) and
// starts the device. Errors name the path and the fix: InvalidArgument (bad
// options; O_DIRECT refused by the file system: set direct_io = false),
// NoSpace (the file system cannot hold capacity_bytes), IoError.
Result<std::unique_ptr<BlockDevice>> OpenBlockDevice(const BlockDeviceOptions& options);

}  // namespace kvtier

#include "tiers/nvme/thread_pool_device.h"

#include <algorithm>
#include <cerrno>
#include <unistd.h>

namespace kvtier {

ThreadPoolDevice::ThreadPoolDevice(DeviceFile file, uint32_t queue_depth, uint32_t io_threads)
    : file_(std::move(file)), pool_(std::clamp<uint32_t>(io_threads * queue_depth, 1, 64)) {}

ThreadPoolDevice::~ThreadPoolDevice() = default;

void ThreadPoolDevice::Read(uint64_t offset, std::span<std::byte> dst, IoDone done) {
  Submit(Job{Op::kRead, offset, dst.data(), dst.size(), std::move(done)});
}

void ThreadPoolDevice::Write(uint64_t offset, std::span<const std::byte> src, IoDone done) {
  Submit(Job{Op::kWrite, offset, const_cast<std::byte*>(src.data()), src.size(), std::move(done)});
}

void ThreadPoolDevice::Flush(IoDone done) { Submit(Job{Op::kFlush, 0, nullptr, 0, std::move(done)}); }

void ThreadPoolDevice::Submit(Job job) {
  pool_.Post([this, job = std::move(job)] {
    Result<size_t> r = Run(job);
    counters_.Record(job.kind, r);
    job.done(std::move(r));
  });
}

Result<size_t> ThreadPoolDevice::Run(const Job& job) {
  if (job.kind == Op::kFlush) {
    if (::fdatasync(file_.fd()) != 0) return ErrnoStatus(errno, "fdatasync " + file_.path());
    return size_t{0};
  }
  if (Status s = CheckRange(job.offset, job.length, job.data); !s.ok()) return s;
  size_t done = 0;
  while (done < job.length) {
    const off_t at = static_cast<off_t>(job.offset + done);
    const ssize_t n = job.kind == Op::kRead ? ::pread(file_.fd(), job.data + done, job.length - done, at)
                                            : ::pwrite(file_.fd(), job.data + done, job.length - done, at);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return ErrnoStatus(errno, std::string(job.kind == Op::kRead ? "pread" : "pwrite") + " of " +
                                    std::to_string(job.length) + " bytes at " + std::to_string(job.offset) + " on " +
                                    file_.path());
    }
    if (n == 0) break;  // end of file: a short transfer, reported as such
    done += static_cast<size_t>(n);
  }
  return done;
}

}  // namespace kvtier

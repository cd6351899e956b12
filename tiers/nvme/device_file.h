// DeviceFile: the open file descriptor under a BlockDevice, with its
// geometry. Opening decides everything that can fail about the path itself
// (O_DIRECT support, preallocation, block device size), so the I/O engines
// only move bytes.
//
// Move-only; closes the fd on destruction. Thread-compatible.
#pragma once

#include <cstdint>
#include <string>

#include "kvtier/result.h"
#include "tiers/nvme/block_device.h"

namespace kvtier {

class DeviceFile {
 public:
  // Opens `options.path` read-write (O_DIRECT if options.direct_io). A
  // regular file is created if missing and preallocated (fallocate) to
  // options.capacity_bytes; a block device's capacity is its size, or
  // options.capacity_bytes if smaller and non-zero. Errors: InvalidArgument
  // (capacity 0 or not a multiple of the alignment, O_DIRECT refused by the
  // file system, path neither a regular file nor a block device), NoSpace,
  // IoError; each names the path.
  static Result<DeviceFile> Open(const BlockDeviceOptions& options);

  DeviceFile() = default;
  DeviceFile(DeviceFile&& other) noexcept;
  DeviceFile& operator=(DeviceFile&& other) noexcept;
  DeviceFile(const DeviceFile&) = delete;
  DeviceFile& operator=(const DeviceFile&) = delete;
  ~DeviceFile();

  int fd() const { return fd_; }
  uint64_t capacity_bytes() const { return capacity_bytes_; }
  uint32_t alignment_bytes() const { return alignment_bytes_; }
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  uint64_t capacity_bytes_ = 0;
  uint32_t alignment_bytes_ = 4096;
  std::string path_;
};

// The errno of a failed syscall as a Status naming `what`: NoSpace for
// ENOSPC/EDQUOT, InvalidArgument for EINVAL, IoError otherwise.
Status ErrnoStatus(int error, const std::string& what);

}  // namespace kvtier

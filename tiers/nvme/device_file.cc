#include "tiers/nvme/device_file.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace kvtier {

Status ErrnoStatus(int error, const std::string& what) {
  const std::string message = what + ": " + std::strerror(error);
  switch (error) {
    case ENOSPC:
    case EDQUOT:
      return NoSpace(message);
    case EINVAL:
      return InvalidArgument(message);
    default:
      return IoError(message);
  }
}

DeviceFile::DeviceFile(DeviceFile&& other) noexcept { *this = std::move(other); }

DeviceFile& DeviceFile::operator=(DeviceFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    capacity_bytes_ = other.capacity_bytes_;
    alignment_bytes_ = other.alignment_bytes_;
    path_ = std::move(other.path_);
    other.fd_ = -1;
  }
  return *this;
}

DeviceFile::~DeviceFile() {
  if (fd_ >= 0) ::close(fd_);
}

Result<DeviceFile> DeviceFile::Open(const BlockDeviceOptions& options) {
  DeviceFile file;
  file.path_ = options.path;
  if (options.path.empty()) return InvalidArgument("nvme device path is empty");
  const int flags = O_RDWR | O_CREAT | O_CLOEXEC | (options.direct_io ? O_DIRECT : 0);
  // A symlink is followed only to a block device (/dev/disk/by-id/...): one
  // to a regular file may have been planted to make kvtierd write over it.
  file.fd_ = ::open(options.path.c_str(), flags | O_NOFOLLOW, 0600);
  if (file.fd_ < 0 && errno == ELOOP) {
    struct stat target {};
    if (::stat(options.path.c_str(), &target) != 0 || !S_ISBLK(target.st_mode)) {
      return InvalidArgument("nvme.path " + options.path +
                             " is a symlink to something other than a block device; give the file's own path");
    }
    file.fd_ = ::open(options.path.c_str(), flags & ~O_CREAT);
  }
  if (file.fd_ < 0) {
    const int error = errno;
    if (error == EINVAL && options.direct_io) {
      return InvalidArgument("the file system of " + options.path +
                             " does not support O_DIRECT; set nvme.direct_io = false (e.g. on tmpfs)");
    }
    return ErrnoStatus(error, "cannot open " + options.path);
  }
  struct stat st {};
  if (::fstat(file.fd_, &st) != 0) return ErrnoStatus(errno, "fstat " + options.path);
  if (S_ISBLK(st.st_mode)) {
    uint64_t device_bytes = 0;
    if (::ioctl(file.fd_, BLKGETSIZE64, &device_bytes) != 0) {
      return ErrnoStatus(errno, "BLKGETSIZE64 on " + options.path);
    }
    int logical_block = 0;
    if (::ioctl(file.fd_, BLKSSZGET, &logical_block) == 0 && logical_block > 4096) {
      file.alignment_bytes_ = static_cast<uint32_t>(logical_block);
    }
    file.capacity_bytes_ = options.capacity_bytes == 0 ? device_bytes : std::min(device_bytes, options.capacity_bytes);
    file.capacity_bytes_ -= file.capacity_bytes_ % file.alignment_bytes_;
  } else if (S_ISREG(st.st_mode)) {
    if (options.capacity_bytes == 0 || options.capacity_bytes % file.alignment_bytes_ != 0) {
      return InvalidArgument("nvme capacity of " + std::to_string(options.capacity_bytes) + " bytes for " +
                             options.path + " must be a positive multiple of " + std::to_string(file.alignment_bytes_));
    }
    file.capacity_bytes_ = options.capacity_bytes;
    if (options.preallocate) {
      // No write later fails for lack of space because the file system
      // filled up meanwhile, and extents are laid out once.
      const int error = ::posix_fallocate(file.fd_, 0, static_cast<off_t>(file.capacity_bytes_));
      if (error != 0) {
        return ErrnoStatus(error, "cannot preallocate " + std::to_string(file.capacity_bytes_) + " bytes for " +
                                      options.path + " (free space, or nvme.preallocate = false)");
      }
    } else if (static_cast<uint64_t>(st.st_size) < file.capacity_bytes_ &&
               ::ftruncate(file.fd_, static_cast<off_t>(file.capacity_bytes_)) != 0) {
      return ErrnoStatus(errno, "cannot size " + options.path);
    }
  } else {
    return InvalidArgument(options.path + " is neither a regular file nor a block device");
  }
  if (file.capacity_bytes_ == 0) return InvalidArgument(options.path + " has no usable capacity");
  return file;
}

}  // namespace kvtier

#include "tiers/host/host_arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <string>

#include "common/logging.h"

namespace kvtier {
namespace {

std::string Errno(const char* call, int err) { return std::string(call) + ": " + std::strerror(err); }

std::string RlimitValue(rlim_t value) { return value == RLIM_INFINITY ? "unlimited" : std::to_string(value); }

// The facts and the fix, for both the kRequired error and the kBestEffort
// warning (which is already best effort, so it is not offered that way out).
std::string MlockFailure(uint64_t capacity_bytes, int err, bool required) {
  rlimit limit{};
  std::string limits = "unknown (getrlimit failed)";
  if (getrlimit(RLIMIT_MEMLOCK, &limit) == 0) {
    limits = "soft=" + RlimitValue(limit.rlim_cur) + " hard=" + RlimitValue(limit.rlim_max) + " bytes";
  }
  return "mlock of the " + std::to_string(capacity_bytes) + "-byte host arena failed (" + std::strerror(err) +
         "); RLIMIT_MEMLOCK is " + limits + "; raise it with ulimit -l / systemd LimitMEMLOCK=infinity" +
         (required ? ", or set host.lock_memory = \"best_effort\"" : "");
}

// Closes the fd unless released: keeps Open's error paths short.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) ::close(fd_);
  }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;
  int Release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

// memfd_create + ftruncate + fallocate + seals. Returns the fd or an error.
Result<int> CreateSealedMemfd(const HostArenaOptions& o) {
  int fd = ::memfd_create(o.name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return IoError(Errno("memfd_create", errno));
  FdCloser closer(fd);
  const auto size = static_cast<off_t>(o.capacity_bytes);
  if (::ftruncate(fd, size) != 0) {
    return IoError(Errno("ftruncate of the host arena", errno));
  }
  // Reserve the pages now so a short machine fails here, not with SIGBUS on
  // first touch (MAP_POPULATE does not report failure). Some kernels or
  // sandboxes lack fallocate on shmem: MAP_POPULATE (and mlock) then do it.
  if (::fallocate(fd, 0, 0, size) != 0 && errno != EOPNOTSUPP && errno != ENOSYS) {
    return IoError(Errno("fallocate of the host arena", errno) + " (" + std::to_string(o.capacity_bytes) + " bytes)");
  }
  if (::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return IoError(Errno("fcntl(F_ADD_SEALS) on the host arena", errno));
  }
  return closer.Release();
}

}  // namespace

Result<std::unique_ptr<HostArena>> HostArena::Open(const HostArenaOptions& o) {
  if (o.capacity_bytes == 0) {
    return InvalidArgument("host arena capacity_bytes must be > 0");
  }
  if (o.capacity_bytes > static_cast<uint64_t>(std::numeric_limits<off_t>::max())) {
    return InvalidArgument("host arena capacity_bytes " + std::to_string(o.capacity_bytes) + " is too large");
  }
  Result<int> fd = CreateSealedMemfd(o);
  if (!fd.ok()) return fd.status();
  FdCloser closer(*fd);

  void* base = ::mmap(nullptr, o.capacity_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, *fd, 0);
  if (base == MAP_FAILED) {
    return IoError(Errno("mmap of the host arena", errno) + " (" + std::to_string(o.capacity_bytes) + " bytes)");
  }
  bool locked = false;
  if (o.lock != HostArenaOptions::LockMode::kOff) {
    if (::mlock(base, o.capacity_bytes) == 0) {
      locked = true;
    } else {
      const bool required = o.lock == HostArenaOptions::LockMode::kRequired;
      const std::string why = MlockFailure(o.capacity_bytes, errno, required);
      if (required) {
        ::munmap(base, o.capacity_bytes);
        return IoError(why);
      }
      spdlog::warn(
          "{}; continuing unlocked (pages are pre-faulted but may be "
          "swapped out)",
          why);
    }
  }
  return std::unique_ptr<HostArena>(
      new HostArena(closer.Release(), static_cast<std::byte*>(base), o.capacity_bytes, locked));
}

HostArena::~HostArena() {
  ::munmap(base_, capacity_bytes_);
  ::close(fd_);
}

void HostArena::VisitCounters(CounterVisitor& v) const {
  v.VisitGauge("host.arena.capacity_bytes", static_cast<int64_t>(capacity_bytes_));
  v.VisitGauge("host.arena.locked", locked_ ? 1 : 0);
}

}  // namespace kvtier

// HostArena: the daemon-owned shared-memory region that is the host tier. A
// sealed memfd, mapped read-write and (ideally) locked in RAM; its fd is what
// the daemon passes to clients with SCM_RIGHTS.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/counters.h"
#include "kvtier/result.h"

namespace kvtier {

struct HostArenaOptions {
  // Size of the region. Must be > 0.
  uint64_t capacity_bytes = 0;
  // What to do when mlock fails (usually RLIMIT_MEMLOCK without
  // CAP_IPC_LOCK): kRequired fails Open, kBestEffort logs one warning and
  // continues unlocked (still pre-faulted), kOff never calls mlock.
  enum class LockMode { kRequired, kBestEffort, kOff };
  LockMode lock = LockMode::kBestEffort;
  // memfd name, visible in /proc/<pid>/fd and /proc/<pid>/maps.
  std::string name = "kvtier-arena";
};

// Owns a memfd of capacity_bytes sealed with F_SEAL_SHRINK | F_SEAL_GROW |
// F_SEAL_SEAL (a client's mapping can never SIGBUS on truncation), mapped
// MAP_SHARED | MAP_POPULATE read-write at base().
//
// Immutable after Open; every method is safe from any thread. Reads and
// writes of the bytes themselves are the caller's to synchronize.
class HostArena {
 public:
  // Creates, sizes, reserves (fallocate), seals, maps and optionally locks
  // the region. Returns:
  //   InvalidArgument  capacity_bytes is 0 or does not fit in off_t;
  //   IoError          memfd_create / ftruncate / fallocate / fcntl / mmap
  //                    failed (message carries strerror), or mlock failed with
  //                    LockMode::kRequired (message names RLIMIT_MEMLOCK's
  //                    soft and hard values, the size, and the fix).
  static Result<std::unique_ptr<HostArena>> Open(const HostArenaOptions& o);

  // Unmaps the region and closes the memfd. Clients' own mappings stay valid.
  ~HostArena();

  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;

  // The memfd; owned by this object (dup it to keep it past ~HostArena).
  int fd() const { return fd_; }
  std::byte* base() const { return base_; }
  uint64_t capacity_bytes() const { return capacity_bytes_; }
  // Whether mlock succeeded.
  bool locked() const { return locked_; }

  // host.arena.capacity_bytes, host.arena.locked (0/1).
  void VisitCounters(CounterVisitor& v) const;

 private:
  HostArena(int fd, std::byte* base, uint64_t capacity_bytes, bool locked)
      : fd_(fd), base_(base), capacity_bytes_(capacity_bytes), locked_(locked) {}

  const int fd_;
  std::byte* const base_;
  const uint64_t capacity_bytes_;
  const bool locked_;
};

}  // namespace kvtier

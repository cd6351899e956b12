// HostArena: the daemon-owned shared-memory region that is the host tier. A
// sealed memfd, mapped read-write and (ideally) locked in RAM; its fd is what
// the daemon passes to clients with SCM_RIGHTS.
//
// Allocating, mapping and locking an arena of many GiB takes about 1 s per
// GiB, allocating alone (fallocate, which clears the pages) about 0.25 s.
// With `warm_in_background` Open allocates only the first
// `allocate_at_open_bytes` and locks the whole arena on fault (mlock2
// MLOCK_ONFAULT: the memlock limit is checked here for all of it), then
// returns; a thread of the arena allocates the rest, chunk by chunk
// (allocated_bytes() grows as it does: the host tier hands out only
// allocated bytes), then maps the pages (and so locks them), while the
// daemon serves. A page touched before the thread reaches it is allocated
// and mapped (and locked) by that touch.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

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
  // Allocate, fault in and lock the rest after Open returns (above).
  bool warm_in_background = false;
  // With warm_in_background: the bytes Open allocates itself (rounded up to
  // a page; all of the arena when larger); the rest is allocated behind it.
  uint64_t allocate_at_open_bytes = UINT64_MAX;
  // With warm_in_background, where Open reads MemAvailable: what the arena
  // has not allocated (all of a new one, a kept one's missing part), with
  // what the process's other arenas still have to allocate, must fit in it,
  // or Open fails before it allocates anything, as allocating it all would
  // have. Unreadable, or without MemTotal: no check (common/machine_memory.h).
  std::string meminfo_path = "/proc/meminfo";
  // Small chunks: each holds the process's memory-map lock only briefly.
  uint64_t warm_chunk_bytes = uint64_t{16} << 20;
  // >= 0: the arena is this memfd, kept by a previous daemon (Open takes
  // it: closed on every path but success), not a new one. Its bytes are
  // left as they are.
  int kept_fd = -1;
};

// Owns a memfd of capacity_bytes sealed with F_SEAL_SHRINK | F_SEAL_GROW |
// F_SEAL_SEAL (a client's mapping can never SIGBUS on truncation), mapped
// MAP_SHARED read-write at base(), its pages allocated (fallocate, which
// reports a machine short of memory, and charges the daemon's memory
// cgroup, not a client's) and mapped (by mlock, or MADV_POPULATE_READ when
// not locking).
//
// Every method is safe from any thread. Reads and writes of the bytes
// themselves are the caller's to synchronize.
class HostArena {
 public:
  // Creates, sizes, seals, maps, allocates and optionally locks the region
  // (mapping its pages in the background with warm_in_background). Returns:
  //   InvalidArgument  capacity_bytes is 0 or does not fit in off_t;
  //   IoError          memfd_create / ftruncate / fcntl / mmap failed, or
  //                    allocating the pages failed (the machine lacks the
  //                    memory; message carries strerror: the part Open
  //                    allocates itself), or mlock failed
  //                    with LockMode::kRequired (message names
  //                    RLIMIT_MEMLOCK's soft and hard values, the size, and
  //                    the fix);
  //   NoSpace          what is left to allocate exceeds MemAvailable
  //                    (meminfo_path), before anything is allocated;
  //   FailedPrecondition  kept_fd is not a memfd of capacity_bytes sealed
  //                    exactly as Open seals an arena (shrink, grow, seal).
  // Should allocating a chunk fail in the background (the machine ran
  // short meanwhile), it is logged and allocated_bytes() stays where it
  // got; should mapping one fail, the rest maps as it is touched. Either
  // way the warming stops (warm_failed()).
  static Result<std::unique_ptr<HostArena>> Open(const HostArenaOptions& o);

  // Stops the warming, unmaps the region and closes the memfd. Clients' own
  // mappings stay valid.
  ~HostArena();

  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;

  // The memfd; owned by this object (dup it to keep it past ~HostArena).
  int fd() const { return fd_; }
  std::byte* base() const { return base_; }
  uint64_t capacity_bytes() const { return capacity_bytes_; }
  // Whether mlock succeeded for every chunk so far (and is not off).
  bool locked() const { return locked_.load(std::memory_order_relaxed); }
  // Bytes allocated so far, from the start: what may be handed out (a page
  // past it would be allocated by the first touch, charged to whoever
  // touches it, and may not exist). capacity_bytes() once Open returns
  // unless warm_in_background; for a kept arena at least what its daemon
  // had allocated (the pages its memfd holds); never decreases.
  uint64_t allocated_bytes() const { return allocated_bytes_.load(std::memory_order_acquire); }
  // Whether allocated_bytes() will still grow (the warming allocates the
  // rest and has not failed).
  bool growing() const {
    return allocated_bytes() < capacity_bytes_ && !warm_failed_.load() && !stopping_.load(std::memory_order_relaxed);
  }
  // Bytes faulted in (and locked, when locking) so far, from the start.
  uint64_t warm_bytes() const { return warm_bytes_.load(std::memory_order_relaxed); }
  // Waits until the warming ended (done or failed); for tests.
  void WaitWarm() const;
  // Whether the warming stopped short (logged; the rest maps as it is touched).
  bool warm_failed() const { return warm_failed_.load(); }

  // host.arena.capacity_bytes, host.arena.locked (0/1),
  // host.arena.allocated_bytes, host.arena.warm_bytes.
  void VisitCounters(CounterVisitor& v) const;

 private:
  HostArena(int fd, std::byte* base, uint64_t capacity_bytes, HostArenaOptions::LockMode lock)
      : fd_(fd), base_(base), capacity_bytes_(capacity_bytes), lock_(lock) {}
  // Allocates [allocated_bytes(), end); the reason it stopped, if it failed.
  Status AllocateUpTo(uint64_t end);
  // Allocates and faults in (and locks) [warm_bytes(), end); the reason it
  // stopped, if it failed.
  Status WarmUpTo(uint64_t end);
  void WarmRest(uint64_t chunk_bytes);

  const int fd_;
  std::byte* const base_;
  const uint64_t capacity_bytes_;
  const HostArenaOptions::LockMode lock_;
  std::atomic<bool> locked_{false};
  std::atomic<uint64_t> allocated_bytes_{0};  // written by Open, then by the warming thread alone
  // The part of the arena still to allocate that Open counted in the
  // process's pending total (host_arena.cc); Open, then the warming thread,
  // then the destructor (after the join) touch it.
  uint64_t pending_bytes_ = 0;
  std::atomic<uint64_t> warm_bytes_{0};
  std::atomic<bool> stopping_{false};
  std::atomic<bool> warm_done_{false};
  std::atomic<bool> warm_failed_{false};
  std::thread warmer_;
};

}  // namespace kvtier

#include "tiers/host/host_arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "common/logging.h"
#include "common/machine_memory.h"

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

// What the process's arenas still have to allocate behind their Open: the
// next arena's check counts it as taken (host_arena.h meminfo_path).
std::atomic<uint64_t> g_pending_bytes{0};

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

// The kept arena `o.kept_fd` when it is one this daemon can map safely:
// sealed so that nobody can shrink it under a mapping, of the size asked.
Result<int> CheckKeptMemfd(const HostArenaOptions& o) {
  FdCloser closer(o.kept_fd);
  // Exactly the seals Open puts on an arena: no one can resize it under a
  // mapping, add a seal, or keep it from being written.
  const int seals = ::fcntl(o.kept_fd, F_GET_SEALS);
  constexpr int kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
  if (seals != kSeals) {
    return FailedPrecondition("the kept host arena is not a memfd sealed as kvtierd seals its arenas");
  }
  struct stat st {};
  if (::fstat(o.kept_fd, &st) != 0) return IoError(Errno("fstat of the kept host arena", errno));
  if (static_cast<uint64_t>(st.st_size) != o.capacity_bytes) {
    return FailedPrecondition("the kept host arena has " + std::to_string(st.st_size) + " bytes, host.capacity_bytes " +
                              std::to_string(o.capacity_bytes));
  }
  return closer.Release();
}

// memfd_create + ftruncate + seals (or the kept memfd). Returns the fd or
// an error. The pages are allocated as the arena is warmed (WarmUpTo).
Result<int> CreateSealedMemfd(const HostArenaOptions& o) {
  if (o.kept_fd >= 0) return CheckKeptMemfd(o);
  int fd = ::memfd_create(o.name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return IoError(Errno("memfd_create", errno));
  FdCloser closer(fd);
  const auto size = static_cast<off_t>(o.capacity_bytes);
  if (::ftruncate(fd, size) != 0) {
    return IoError(Errno("ftruncate of the host arena", errno));
  }
  if (::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return IoError(Errno("fcntl(F_ADD_SEALS) on the host arena", errno));
  }
  return closer.Release();
}

}  // namespace

Result<std::unique_ptr<HostArena>> HostArena::Open(const HostArenaOptions& o) {
  FdCloser kept(o.kept_fd);  // until CreateSealedMemfd takes it
  if (o.capacity_bytes == 0) {
    return InvalidArgument("host arena capacity_bytes must be > 0");
  }
  if (o.capacity_bytes > static_cast<uint64_t>(std::numeric_limits<off_t>::max())) {
    return InvalidArgument("host arena capacity_bytes " + std::to_string(o.capacity_bytes) + " is too large");
  }
  kept.Release();
  Result<int> fd = CreateSealedMemfd(o);
  if (!fd.ok()) return fd.status();
  FdCloser closer(*fd);

  void* base = ::mmap(nullptr, o.capacity_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
  if (base == MAP_FAILED) {
    return IoError(Errno("mmap of the host arena", errno) + " (" + std::to_string(o.capacity_bytes) + " bytes)");
  }
  std::unique_ptr<HostArena> arena(
      new HostArena(closer.Release(), static_cast<std::byte*>(base), o.capacity_bytes, o.lock));
  arena->locked_.store(o.lock != HostArenaOptions::LockMode::kOff, std::memory_order_relaxed);
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t chunk = std::max(o.warm_chunk_bytes / page * page, page);
  if (!o.warm_in_background || o.capacity_bytes <= chunk) {
    if (Status s = arena->WarmUpTo(o.capacity_bytes); !s.ok()) {
      if (s.code() != StatusCode::kPermissionDenied) return s;  // no memory
      // mlock failed.
      if (o.lock == HostArenaOptions::LockMode::kRequired) return IoError(s.message());
      spdlog::warn("{}; continuing unlocked (pages are pre-faulted but may be swapped out)", s.message());
      arena->locked_.store(false, std::memory_order_relaxed);
      if (Status rest = arena->WarmUpTo(o.capacity_bytes); !rest.ok()) return rest;
    }
    arena->warm_done_.store(true);
    return arena;
  }
  // In the background. Two things stay at Open, so that a machine that
  // cannot hold the arena fails start-up as before: the memory the arena
  // still needs is checked against MemAvailable, and its first
  // allocate_at_open_bytes are allocated now (fallocate: no page is mapped,
  // so it is the cheap part, and the daemon's memory cgroup is charged,
  // never a client that touches a page first); and the whole arena is
  // locked on fault (mlock2 MLOCK_ONFAULT: the kernel checks
  // RLIMIT_MEMLOCK, or CAP_IPC_LOCK, for all of it and every other arena of
  // the process now; each page is locked as it is mapped). The thread then
  // allocates the rest and maps the pages. A kept arena has its pages from
  // the start up to where its daemon got (it allocated in order, and no
  // page is ever given back): as many as the memfd holds (st_blocks, which
  // counts allocated pages not yet written; SEEK_HOLE does not see them).
  if (o.kept_fd >= 0) {
    struct stat st {};
    const uint64_t held = ::fstat(arena->fd_, &st) == 0 ? static_cast<uint64_t>(st.st_blocks) * 512 : 0;
    arena->allocated_bytes_.store(std::min(o.capacity_bytes, held / page * page), std::memory_order_release);
  }
  if (const uint64_t missing = o.capacity_bytes - arena->allocated_bytes(); missing > 0) {
    const uint64_t pending = g_pending_bytes.load();
    // An unreadable meminfo skips the check: the allocation itself then
    // fails, or not.
    if (const Result<MachineMemory> machine = ReadMachineMemory(o.meminfo_path);
        machine.ok() && missing + pending > machine->available_bytes) {
      const uint64_t available = machine->available_bytes;
      return NoSpace("the " + std::to_string(o.capacity_bytes >> 20) + " MiB host arena needs " +
                     std::to_string(missing >> 20) + " MiB it has not allocated, and the machine has " +
                     std::to_string(available >> 20) + " MiB available (MemAvailable in " + o.meminfo_path +
                     (pending > 0 ? ", less " + std::to_string(pending >> 20) + " MiB other arenas still allocate"
                                  : std::string()) +
                     "); lower host.capacity_bytes or free memory");
    }
    // Opens are serial in kvtierd (one arena after another), so the load
    // above and this add need no compare-and-swap.
    g_pending_bytes += missing;
    arena->pending_bytes_ = missing;
  }
  const uint64_t at_open =
      std::min(o.capacity_bytes, (std::min(o.capacity_bytes, o.allocate_at_open_bytes) + page - 1) / page * page);
  if (Status s = arena->AllocateUpTo(at_open); !s.ok()) return s;
  if (arena->locked() && ::mlock2(base, o.capacity_bytes, MLOCK_ONFAULT) != 0) {
    const bool required = o.lock == HostArenaOptions::LockMode::kRequired;
    const std::string why = MlockFailure(o.capacity_bytes, errno, required);
    if (required) return IoError(why);
    spdlog::warn("{}; continuing unlocked (pages are pre-faulted but may be swapped out)", why);
    arena->locked_.store(false, std::memory_order_relaxed);
  }
  HostArena* a = arena.get();
  arena->warmer_ = std::thread([a, chunk] { a->WarmRest(chunk); });
  return arena;
}

Status HostArena::AllocateUpTo(uint64_t end) {
  const uint64_t begin = allocated_bytes_.load(std::memory_order_relaxed);
  if (end <= begin) return Status::Ok();
  const uint64_t bytes = end - begin;
  if (::fallocate(fd_, 0, static_cast<off_t>(begin), static_cast<off_t>(bytes)) != 0 && errno != EOPNOTSUPP &&
      errno != ENOSYS) {
    return IoError(Errno("fallocate of the host arena", errno) + " (" + std::to_string(bytes) + " bytes at " +
                   std::to_string(begin) + ")");
  }
  allocated_bytes_.store(end, std::memory_order_release);
  const uint64_t counted = std::min(pending_bytes_, bytes);
  pending_bytes_ -= counted;
  g_pending_bytes -= counted;
  return Status::Ok();
}

Status HostArena::WarmUpTo(uint64_t end) {
  const uint64_t begin = warm_bytes_.load(std::memory_order_relaxed);
  if (end <= begin) return Status::Ok();
  std::byte* const from = base_ + begin;
  const uint64_t bytes = end - begin;
  // Allocate the pages first (a file operation: it takes none of the
  // process's memory-map lock, which the other threads' page faults and
  // mmaps need), then map them: mlock does it as it locks (measured the
  // faster way, docs/BENCHMARKS.md "Start-up"); unlocked, MADV_POPULATE_READ
  // (kernels before 5.14 lack it: the pages then map at first touch). The
  // bytes are never touched (a client may already be writing there).
  if (Status s = AllocateUpTo(end); !s.ok()) return s;
  if (locked_.load(std::memory_order_relaxed)) {
    if (::mlock(from, bytes) != 0) {
      return Status(StatusCode::kPermissionDenied,
                    MlockFailure(capacity_bytes_, errno, lock_ == HostArenaOptions::LockMode::kRequired));
    }
  } else if (::madvise(from, bytes, MADV_POPULATE_READ) != 0 && errno != EINVAL) {
    // EINVAL: a kernel before 5.14 (or a sandbox) without it; the pages,
    // allocated above, are then mapped as they are first touched.
    return IoError(Errno("mapping the host arena", errno) + " (" + std::to_string(bytes) + " bytes at " +
                   std::to_string(begin) + ")");
  }
  warm_bytes_.store(end, std::memory_order_relaxed);
  return Status::Ok();
}

void HostArena::WarmRest(uint64_t chunk_bytes) {
  const auto started = std::chrono::steady_clock::now();
  // Allocation first, four chunks at a time (a file operation: no
  // memory-map lock is held): the tier can hand out the whole arena about
  // four times sooner than if each chunk were mapped before the next one
  // is allocated.
  while (!stopping_.load(std::memory_order_relaxed)) {
    const uint64_t at = allocated_bytes();
    if (at >= capacity_bytes_) break;
    if (Status s = AllocateUpTo(std::min(capacity_bytes_, at + 4 * chunk_bytes)); !s.ok()) {
      spdlog::error("{}; the host arena holds the {} MiB allocated so far of its {} MiB", s.message(), at >> 20,
                    capacity_bytes_ >> 20);
      g_pending_bytes -= std::exchange(pending_bytes_, 0);
      warm_failed_.store(true);
      warm_done_.store(true);
      return;
    }
  }
  while (!stopping_.load(std::memory_order_relaxed)) {
    const uint64_t at = warm_bytes_.load(std::memory_order_relaxed);
    if (at >= capacity_bytes_) break;
    Status s = WarmUpTo(std::min(capacity_bytes_, at + chunk_bytes));
    if (s.code() == StatusCode::kPermissionDenied) {
      // Locked on fault at Open, so the limit was checked; should a chunk's
      // lock fail anyway, the rest is mapped unlocked.
      spdlog::error("mlock of the host arena failed {} bytes in ({}); the rest is mapped unlocked", at, s.message());
      (void)::munlock(base_ + at, capacity_bytes_ - at);  // the rest, locked on fault until now
      locked_.store(false, std::memory_order_relaxed);
      continue;
    }
    if (!s.ok()) {
      spdlog::error("{}; the rest of the host arena is mapped as it is written", s.message());
      warm_failed_.store(true);
      break;
    }
    std::this_thread::yield();  // the daemon's threads take the memory-map lock between chunks
  }
  if (warm_bytes_.load(std::memory_order_relaxed) >= capacity_bytes_) {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    spdlog::info("host arena: {} MiB allocated and faulted in{} in {:.1f} s, while serving", capacity_bytes_ >> 20,
                 locked() ? " and locked" : "", seconds);
  }
  warm_done_.store(true);
}

void HostArena::WaitWarm() const {
  while (!warm_done_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

HostArena::~HostArena() {
  stopping_.store(true);
  if (warmer_.joinable()) warmer_.join();
  g_pending_bytes -= std::exchange(pending_bytes_, 0);
  ::munmap(base_, capacity_bytes_);
  ::close(fd_);
}

void HostArena::VisitCounters(CounterVisitor& v) const {
  v.VisitGauge("host.arena.capacity_bytes", static_cast<int64_t>(capacity_bytes_));
  v.VisitGauge("host.arena.locked", locked() ? 1 : 0);
  v.VisitGauge("host.arena.allocated_bytes", static_cast<int64_t>(allocated_bytes()));
  v.VisitGauge("host.arena.warm_bytes", static_cast<int64_t>(warm_bytes()));
}

}  // namespace kvtier

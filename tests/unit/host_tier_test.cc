#include "tiers/host/host_tier.h"

#include <fcntl.h>
#include <linux/capability.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/sanitizers.h"

namespace kvtier {
namespace {

using Extent = HostTier::Extent;
using LockMode = HostArenaOptions::LockMode;

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;

HostArenaOptions Options(uint64_t capacity, LockMode lock = LockMode::kBestEffort) {
  HostArenaOptions o;
  o.capacity_bytes = capacity;
  o.lock = lock;
  o.name = "kvtier-test-arena";
  return o;
}

std::unique_ptr<HostTier> OpenTier(uint64_t capacity, LockMode lock = LockMode::kBestEffort) {
  auto tier = HostTier::Open(Options(capacity, lock));
  EXPECT_TRUE(tier.ok()) << tier.status().ToString();
  return tier.ok() ? std::move(*tier) : nullptr;
}

// Maps a memfd the way a client does, read-write and shared.
std::byte* MapLikeClient(int fd, uint64_t length) {
  void* p = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  EXPECT_NE(p, MAP_FAILED) << std::strerror(errno);
  return p == MAP_FAILED ? nullptr : static_cast<std::byte*>(p);
}

TEST(HostArenaTest, RejectsZeroCapacity) {
  auto arena = HostArena::Open(Options(0));
  ASSERT_FALSE(arena.ok());
  EXPECT_EQ(arena.status().code(), StatusCode::kInvalidArgument);
  auto tier = HostTier::Open(Options(0));
  ASSERT_FALSE(tier.ok());
  EXPECT_EQ(tier.status().code(), StatusCode::kInvalidArgument);
}

TEST(HostArenaTest, LockOffIsUnlockedAndCloexec) {
  auto arena = HostArena::Open(Options(4 * kMiB, LockMode::kOff));
  ASSERT_TRUE(arena.ok()) << arena.status().ToString();
  EXPECT_FALSE((*arena)->locked());
  EXPECT_EQ((*arena)->capacity_bytes(), 4 * kMiB);
  EXPECT_NE(fcntl((*arena)->fd(), F_GETFD) & FD_CLOEXEC, 0);
  CounterCollector c;
  (*arena)->VisitCounters(c);
  ASSERT_EQ(c.counters().size(), 4u);
  EXPECT_EQ(c.counters()[0], std::make_pair(std::string("host.arena.capacity_bytes"), int64_t(4 * kMiB)));
  EXPECT_EQ(c.counters()[1], std::make_pair(std::string("host.arena.locked"), int64_t(0)));
  EXPECT_EQ(c.counters()[2], std::make_pair(std::string("host.arena.allocated_bytes"), int64_t(4 * kMiB)));
  EXPECT_EQ(c.counters()[3], std::make_pair(std::string("host.arena.warm_bytes"), int64_t(4 * kMiB)));
}

TEST(HostTierTest, ClientMappingSeesTheSameBytes) {
  auto tier = OpenTier(64 * kMiB);
  ASSERT_NE(tier, nullptr);
  auto e = tier->Allocate(300 * kKiB);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  std::span<std::byte> bytes = tier->Bytes(*e);
  ASSERT_EQ(bytes.size(), e->length);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = std::byte(i * 31 + 7);

  std::byte* client = MapLikeClient(tier->memfd(), tier->capacity_bytes());
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(std::memcmp(client + e->offset, bytes.data(), bytes.size()), 0);
  client[e->offset + 5] = std::byte{0xAB};  // and back the other way
  EXPECT_EQ(bytes[5], std::byte{0xAB});

  // A client's mapping (and a dup of the fd) outlives the daemon's tier.
  const int dup_fd = dup(tier->memfd());
  const uint64_t capacity = tier->capacity_bytes();
  const Extent extent = *e;
  tier.reset();
  EXPECT_EQ(client[extent.offset + 5], std::byte{0xAB});
  std::byte* again = MapLikeClient(dup_fd, capacity);
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(std::memcmp(again + extent.offset, client + extent.offset, extent.length), 0);
  munmap(again, capacity);
  munmap(client, capacity);
  close(dup_fd);
}

TEST(HostTierTest, MemfdIsSealedAgainstResize) {
  auto tier = OpenTier(8 * kMiB);
  ASSERT_NE(tier, nullptr);
  const int seals = fcntl(tier->memfd(), F_GET_SEALS);
  ASSERT_GE(seals, 0) << std::strerror(errno);
  EXPECT_NE(seals & F_SEAL_SHRINK, 0);
  EXPECT_NE(seals & F_SEAL_GROW, 0);
  EXPECT_NE(seals & F_SEAL_SEAL, 0);
  EXPECT_EQ(seals & F_SEAL_WRITE, 0);
  EXPECT_NE(ftruncate(tier->memfd(), 4 * kMiB), 0);
  EXPECT_EQ(errno, EPERM);
  EXPECT_NE(ftruncate(tier->memfd(), 16 * kMiB), 0);
  EXPECT_NE(fcntl(tier->memfd(), F_ADD_SEALS, F_SEAL_WRITE), 0);  // sealed seals
}

TEST(HostTierTest, NoSpaceMessageGivesTheNumbers) {
  auto tier = OpenTier(64 * kMiB);
  ASSERT_NE(tier, nullptr);
  std::vector<Extent> live;
  for (int i = 0; i < 32; ++i) {
    auto e = tier->Allocate(2 * kMiB);
    ASSERT_TRUE(e.ok()) << i << ": " << e.status().ToString();
    live.push_back(*e);
  }
  tier->Free(live[0]);
  tier->Free(live[2]);  // 4 MiB free, in two 2 MiB ranges
  auto e = tier->Allocate(3 * kMiB);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kNoSpace);
  const std::string& m = e.status().message();
  EXPECT_NE(m.find("3145728 bytes"), std::string::npos) << m;
  EXPECT_NE(m.find("free 4194304 bytes"), std::string::npos) << m;
  EXPECT_NE(m.find("largest free range 2097152 bytes"), std::string::npos) << m;
  EXPECT_TRUE(tier->Allocate(2 * kMiB).ok());  // the caller evicted; retry fits
}

TEST(HostTierTest, InvalidArgumentForZeroOrOversize) {
  auto tier = OpenTier(8 * kMiB);
  ASSERT_NE(tier, nullptr);
  auto zero = tier->Allocate(0);
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.status().code(), StatusCode::kInvalidArgument);
  auto huge = tier->Allocate(8 * kMiB + 1);
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(tier->Allocate(8 * kMiB).ok());
}

TEST(HostTierTest, CountersVisitArenaThenAllocator) {
  auto tier = OpenTier(8 * kMiB, LockMode::kOff);
  ASSERT_NE(tier, nullptr);
  ASSERT_TRUE(tier->Allocate(100 * kKiB).ok());
  CounterCollector c;
  tier->VisitCounters(c);
  const std::vector<std::pair<std::string, int64_t>> expected = {
      {"host.arena.capacity_bytes", 8 * kMiB},
      {"host.arena.locked", 0},
      {"host.arena.allocated_bytes", 8 * kMiB},
      {"host.arena.warm_bytes", 8 * kMiB},
      {"host.alloc.used_bytes", 112 * kKiB},
      {"host.alloc.free_bytes", 8 * kMiB - 112 * kKiB},
      {"host.alloc.largest_free_bytes", 8 * kMiB - 112 * kKiB},
      {"host.alloc.allocations", 1},
      {"host.alloc.failed_allocations", 0},
  };
  EXPECT_EQ(c.counters(), expected);
}

TEST(HostTierDeathTest, BytesOutsideTheArenaAborts) {
  auto tier = OpenTier(1 * kMiB, LockMode::kOff);
  ASSERT_NE(tier, nullptr);
  EXPECT_DEATH(tier->Bytes(Extent{1 * kMiB, 4 * kKiB}), "outside the host arena");
}

// Each thread allocates, stamps its blocks, checks its stamps survive, and
// frees, with its own fixed seed. At the end the live extents of all threads
// must not overlap and must add up to used_bytes().
TEST(HostTierTest, ConcurrentAllocateFreeKeepsAccounting) {
  auto tier = OpenTier(64 * kMiB);
  ASSERT_NE(tier, nullptr);
  constexpr int kThreads = 4;
  std::vector<std::vector<Extent>> live(kThreads);
  std::vector<int> stamp_errors(kThreads, 0);
  auto stamp = [&](const Extent& e, int t) {
    auto b = tier->Bytes(e);
    std::fill(b.begin(), b.begin() + 64, std::byte(t + 1));
    std::fill(b.end() - 64, b.end(), std::byte(t + 1));
  };
  auto stamped = [&](const Extent& e, int t) {
    auto b = tier->Bytes(e);
    return b[0] == std::byte(t + 1) && b[63] == std::byte(t + 1) && b[b.size() - 1] == std::byte(t + 1);
  };
  auto worker = [&](int t) {
    std::mt19937_64 rng(1000 + t);
    for (int i = 0; i < 3000; ++i) {
      if (live[t].size() < 12 && rng() % 3 != 0) {
        auto e = tier->Allocate(4 * kKiB + rng() % (1 * kMiB));
        if (!e.ok()) continue;  // NoSpace: free something next round
        stamp(*e, t);
        live[t].push_back(*e);
      } else if (!live[t].empty()) {
        const size_t j = rng() % live[t].size();
        if (!stamped(live[t][j], t)) ++stamp_errors[t];
        tier->Free(live[t][j]);
        live[t][j] = live[t].back();
        live[t].pop_back();
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (auto& th : threads) th.join();

  std::vector<Extent> all;
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(stamp_errors[t], 0) << "thread " << t << " saw its bytes overwritten";
    for (const Extent& e : live[t]) EXPECT_TRUE(stamped(e, t));
    all.insert(all.end(), live[t].begin(), live[t].end());
  }
  std::sort(all.begin(), all.end(), [](const Extent& a, const Extent& b) { return a.offset < b.offset; });
  uint64_t sum = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    if (i > 0) {
      EXPECT_LE(all[i - 1].offset + all[i - 1].length, all[i].offset);
    }
    sum += all[i].length;
  }
  EXPECT_EQ(tier->used_bytes(), sum);
  for (const Extent& e : all) tier->Free(e);
  EXPECT_EQ(tier->used_bytes(), 0u);
}

// The sanitizers (ASan and TSan share sanitizer_common's interceptor)
// make mlock a no-op that returns 0, so the lock tests can only run in
// builds without them; the release suite runs them.
constexpr bool kMlockIsReal = !KVTIER_ASAN && !KVTIER_TSAN;
constexpr const char* kNoMlockUnderAsan = "ASan/TSan turn mlock into a no-op; this runs in the release suite";

uint64_t LockedKiB() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmLck:", 0) == 0) return std::stoull(line.substr(6));
  }
  return 0;
}

TEST(HostTierTest, LockRequiredSucceedsAsRoot) {
  if (!kMlockIsReal) GTEST_SKIP() << kNoMlockUnderAsan;
  if (geteuid() != 0) GTEST_SKIP() << "needs root (or CAP_IPC_LOCK) to lock 64 MiB";
  auto arena = HostArena::Open(Options(64 * kMiB, LockMode::kRequired));
  ASSERT_TRUE(arena.ok()) << arena.status().ToString();
  EXPECT_TRUE((*arena)->locked());
  EXPECT_GE(LockedKiB(), 64 * kKiB);
}

// The bytes of `fd`'s file that have pages (allocated), by st_blocks.
uint64_t PagesAllocatedBytes(int fd) {
  struct stat st {};
  EXPECT_EQ(::fstat(fd, &st), 0);
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

// With allocate_at_open_bytes, Open allocates that much and returns; the
// rest is allocated behind it (allocated_bytes() grows to the capacity,
// every byte it counts has its page), then mapped.
TEST(HostArenaTest, AllocatesTheRestOfTheArenaBehindOpen) {
  HostArenaOptions o = Options(64 * kMiB, LockMode::kOff);
  o.warm_in_background = true;
  o.warm_chunk_bytes = 1 * kMiB;
  o.allocate_at_open_bytes = 2 * kMiB - 100;  // rounded up to a page
  auto arena = HostArena::Open(o);
  ASSERT_TRUE(arena.ok()) << arena.status().ToString();
  uint64_t seen = (*arena)->allocated_bytes();
  EXPECT_GE(seen, 2 * kMiB);
  EXPECT_EQ(seen % 4096, 0u);
  while ((*arena)->growing()) {
    const uint64_t now = (*arena)->allocated_bytes();
    ASSERT_GE(now, seen);  // never shrinks
    EXPECT_GE(PagesAllocatedBytes((*arena)->fd()), now);
    seen = now;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  (*arena)->WaitWarm();
  EXPECT_FALSE((*arena)->warm_failed());
  EXPECT_EQ((*arena)->allocated_bytes(), 64 * kMiB);
  EXPECT_EQ((*arena)->warm_bytes(), 64 * kMiB);
  EXPECT_GE(PagesAllocatedBytes((*arena)->fd()), 64 * kMiB);
}

// A memfd sealed as kvtierd seals its arenas, of `capacity` bytes, whose
// first `allocated` bytes have pages (a kept arena whose daemon stopped
// while it was allocating the rest).
int PartlyAllocatedArena(uint64_t capacity, uint64_t allocated) {
  const int fd = ::memfd_create("kvtier-test-kept", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(::ftruncate(fd, static_cast<off_t>(capacity)), 0);
  EXPECT_EQ(::fallocate(fd, 0, 0, static_cast<off_t>(allocated)), 0);
  EXPECT_EQ(::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
  return fd;
}

// A 256 MiB arena that allocates one page at Open and the rest behind it,
// reading MemAvailable from `meminfo`: a kept arena's daemon had allocated
// only part of it.
HostArenaOptions GrowingArenaOptions(const std::string& meminfo) {
  HostArenaOptions o = Options(256 * kMiB, LockMode::kOff);
  o.warm_in_background = true;
  o.warm_chunk_bytes = 16 * kMiB;
  o.allocate_at_open_bytes = 4096;
  o.meminfo_path = meminfo;
  return o;
}

// A kept arena starts with what its daemon allocated (the pages its memfd
// holds), and the part it still needs is checked against MemAvailable.
TEST(HostArenaTest, AKeptArenaKeepsWhatItsDaemonAllocatedAndChecksTheRest) {
  const std::string meminfo = ::testing::TempDir() + "/kvtier-meminfo-kept-" + std::to_string(::getpid());
  HostArenaOptions o = GrowingArenaOptions(meminfo);
  std::ofstream(meminfo) << "MemTotal:        1048576 kB\nMemAvailable:     102400 kB\n";
  o.kept_fd = PartlyAllocatedArena(256 * kMiB, 100 * kMiB);
  auto short_machine = HostArena::Open(o);  // 156 MiB to go, 100 available
  ASSERT_FALSE(short_machine.ok());
  EXPECT_NE(short_machine.status().message().find("needs 156 MiB it has not allocated"), std::string::npos)
      << short_machine.status().message();
  std::ofstream(meminfo) << "MemTotal:        1048576 kB\nMemAvailable:     1048576 kB\n";
  o.kept_fd = PartlyAllocatedArena(256 * kMiB, 100 * kMiB);
  auto kept = HostArena::Open(o);
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  EXPECT_GE((*kept)->allocated_bytes(), 100 * kMiB);
  (*kept)->WaitWarm();
  EXPECT_EQ((*kept)->allocated_bytes(), 256 * kMiB);
  std::remove(meminfo.c_str());
}

// A kept arena the machine lacks the memory to complete fails the tier's
// Open (NoSpace) and stays kept (release_kept is not called): opening a new
// arena instead would need as much once the kept one is freed, and would
// lose the kept blocks. The next Open, with the memory there, adopts it.
TEST(HostTierTest, AKeptArenaTheMachineCannotCompleteFailsOpenAndStaysKept) {
  const std::string meminfo = ::testing::TempDir() + "/kvtier-meminfo-keep-" + std::to_string(::getpid());
  HostArenaOptions o = GrowingArenaOptions(meminfo);
  const int arena = PartlyAllocatedArena(256 * kMiB, 100 * kMiB);  // what the store keeps
  auto journal = HostJournal::Create(256 * kMiB, "kvtier-test-kept-journal");
  ASSERT_TRUE(journal.ok()) << journal.status().ToString();
  int released = 0;
  const auto kept = [&] { return HostKeep{true, ::dup(arena), ::dup((*journal)->fd()), [&] { ++released; }}; };

  std::ofstream(meminfo) << "MemTotal:        1048576 kB\nMemAvailable:     102400 kB\n";
  auto short_machine = HostTier::Open(o, 0, kept());  // 156 MiB to go, 100 available
  ASSERT_FALSE(short_machine.ok());
  EXPECT_EQ(short_machine.status().code(), StatusCode::kNoSpace);
  EXPECT_NE(short_machine.status().message().find("stay kept"), std::string::npos) << short_machine.status().message();
  EXPECT_EQ(released, 0) << "the kept pair is let go only when a new arena replaces it";

  std::ofstream(meminfo) << "MemTotal:        1048576 kB\nMemAvailable:     1048576 kB\n";
  auto enough = HostTier::Open(o, 0, kept());
  ASSERT_TRUE(enough.ok()) << enough.status().ToString();
  EXPECT_TRUE((*enough)->adopted());
  EXPECT_EQ(released, 0);
  enough->reset();
  ::close(arena);
  std::remove(meminfo.c_str());
}

// An arena whose part left to the background exceeds MemAvailable fails
// Open with the sizes, before it allocates anything, as allocating it all
// at once would have failed; with enough available it opens.
TEST(HostArenaTest, AnArenaTheMachineCannotHoldFailsOpenThoughMostIsAllocatedLater) {
  const std::string meminfo = ::testing::TempDir() + "/kvtier-meminfo-" + std::to_string(::getpid());
  HostArenaOptions o = Options(64 * kMiB, LockMode::kOff);
  o.warm_in_background = true;
  o.warm_chunk_bytes = 1 * kMiB;
  o.allocate_at_open_bytes = 4 * kMiB;
  o.meminfo_path = meminfo;
  std::ofstream(meminfo) << "MemTotal:        1048576 kB\nMemFree:   10 kB\nMemAvailable:     32768 kB\n";
  auto short_machine = HostArena::Open(o);
  ASSERT_FALSE(short_machine.ok());
  EXPECT_EQ(short_machine.status().code(), StatusCode::kNoSpace);
  EXPECT_NE(short_machine.status().message().find("needs 64 MiB it has not allocated"), std::string::npos)
      << short_machine.status().message();
  EXPECT_NE(short_machine.status().message().find("32 MiB available"), std::string::npos);
  std::ofstream(meminfo) << "MemTotal:        1048576 kB\nMemAvailable:     1048576 kB\n";
  auto enough = HostArena::Open(o);
  ASSERT_TRUE(enough.ok()) << enough.status().ToString();
  (*enough)->WaitWarm();
  EXPECT_EQ((*enough)->allocated_bytes(), 64 * kMiB);
  std::remove(meminfo.c_str());
}

// While the arena grows, the tier hands out only what it has allocated (a
// page past it would be allocated by the client that first writes it), and
// AwaitGrowth says when more has come: the whole arena is filled by
// allocations made at once after the start, each retried after the growth.
TEST(HostTierTest, HandsOutOnlyTheAllocatedPartAsTheArenaGrows) {
  HostArenaOptions o = Options(64 * kMiB, LockMode::kOff);
  o.warm_in_background = true;
  o.warm_chunk_bytes = 1 * kMiB;
  o.allocate_at_open_bytes = 1 * kMiB;
  auto tier = HostTier::Open(o);
  ASSERT_TRUE(tier.ok()) << tier.status().ToString();
  int past_allocated = 0;
  for (int i = 0; i < 64; ++i) {
    Result<Extent> e = (*tier)->Allocate(1 * kMiB);
    while (!e.ok() && e.status().code() == StatusCode::kNoSpace &&
           (*tier)->AwaitGrowth(std::chrono::milliseconds(100))) {
      e = (*tier)->Allocate(1 * kMiB);
    }
    ASSERT_TRUE(e.ok()) << i << ": " << e.status().ToString();
    if (e->offset + e->length > (*tier)->allocated_bytes()) ++past_allocated;
  }
  EXPECT_EQ(past_allocated, 0);
  EXPECT_EQ((*tier)->used_bytes(), 64 * kMiB);
  EXPECT_FALSE((*tier)->AwaitGrowth(std::chrono::milliseconds(100)));  // all allocated: at once
  EXPECT_EQ((*tier)->Allocate(1 * kMiB).status().code(), StatusCode::kNoSpace);
}

// With warm_in_background, Open allocates and locks on fault and returns;
// the pages are mapped while the arena is in use, never clobbering bytes
// written meanwhile; the destructor stops a warming midway.
TEST(HostArenaTest, WarmsTheRestInTheBackgroundWithoutTouchingWhatIsWritten) {
  HostArenaOptions o = Options(256 * kMiB, kMlockIsReal && geteuid() == 0 ? LockMode::kRequired : LockMode::kOff);
  o.warm_in_background = true;
  o.warm_chunk_bytes = 1 * kMiB;
  auto arena = HostArena::Open(o);
  ASSERT_TRUE(arena.ok()) << arena.status().ToString();
  EXPECT_LE((*arena)->warm_bytes(), 256 * kMiB);  // mapped in the background, from 0
  // Written at once, far past the first chunk, and near the end.
  std::byte* base = (*arena)->base();
  for (uint64_t at : {uint64_t{200} * kMiB, uint64_t{256} * kMiB - 4096}) {
    for (uint64_t i = 0; i < 4096; ++i) base[at + i] = static_cast<std::byte>((at + i * 7) & 0xff);
  }
  (*arena)->WaitWarm();
  EXPECT_EQ((*arena)->warm_bytes(), 256 * kMiB);
  for (uint64_t at : {uint64_t{200} * kMiB, uint64_t{256} * kMiB - 4096}) {
    for (uint64_t i = 0; i < 4096; ++i) ASSERT_EQ(base[at + i], static_cast<std::byte>((at + i * 7) & 0xff)) << at;
  }
  if (o.lock == LockMode::kRequired) {
    EXPECT_TRUE((*arena)->locked());
    EXPECT_GE(LockedKiB(), 256 * kKiB);
  }
  CounterCollector counters;
  (*arena)->VisitCounters(counters);
  EXPECT_NE(std::find(counters.counters().begin(), counters.counters().end(),
                      std::pair<std::string, int64_t>{"host.arena.warm_bytes", 256 * kMiB}),
            counters.counters().end());

  // A large arena destroyed while it warms: the warming stops.
  o.capacity_bytes = 2048 * kMiB;
  o.lock = LockMode::kOff;
  auto big = HostArena::Open(o);
  ASSERT_TRUE(big.ok()) << big.status().ToString();
  EXPECT_LT((*big)->warm_bytes(), o.capacity_bytes);  // still warming: the destructor stops it midway
  big->reset();
}

// Runs `body` in a forked child (so limits and capabilities changed there do
// not leak into this process) and returns what it wrote.
std::string RunInChild(const std::function<std::string()>& body) {
  int fds[2];
  if (pipe(fds) != 0) return std::string("FAIL: pipe: ") + std::strerror(errno);
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    const std::string out = body();
    const ssize_t written = write(fds[1], out.data(), out.size());
    _exit(written == static_cast<ssize_t>(out.size()) ? 0 : 1);
  }
  close(fds[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, n);
  close(fds[0]);
  int wstatus = 0;
  waitpid(pid, &wstatus, 0);
  if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
    out = "FAIL: child died (status " + std::to_string(wstatus) + "): " + out;
  }
  return out;
}

// Removes CAP_IPC_LOCK from this process's effective and permitted sets, so
// that RLIMIT_MEMLOCK applies to mlock even for root. Returns "" or why not.
std::string DropIpcLockCapability() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
  if (syscall(SYS_capget, &header, data) != 0) {
    return std::string("capget: ") + std::strerror(errno);
  }
  const uint32_t bit = 1u << (CAP_IPC_LOCK % 32);
  data[CAP_IPC_LOCK / 32].effective &= ~bit;
  data[CAP_IPC_LOCK / 32].permitted &= ~bit;
  data[CAP_IPC_LOCK / 32].inheritable &= ~bit;
  if (syscall(SYS_capset, &header, data) != 0) {
    return std::string("capset: ") + std::strerror(errno);
  }
  return "";
}

std::string MlockFailsUnderLowLimit() {
  const rlimit low{64 * kKiB, 64 * kKiB};
  if (setrlimit(RLIMIT_MEMLOCK, &low) != 0) {
    return std::string("FAIL: setrlimit: ") + std::strerror(errno);
  }
  if (std::string why = DropIpcLockCapability(); !why.empty()) {
    return "SKIP: cannot drop CAP_IPC_LOCK (" + why + ")";
  }
  auto required = HostArena::Open(Options(64 * kMiB, LockMode::kRequired));
  if (required.ok()) {
    return "FAIL: kRequired Open succeeded under a 64 KiB RLIMIT_MEMLOCK";
  }
  const std::string m = required.status().message();
  for (const char* needle : {"RLIMIT_MEMLOCK", "soft=65536 hard=65536", "67108864", "ulimit -l",
                             "LimitMEMLOCK=infinity", "host.lock_memory = \"best_effort\""}) {
    if (m.find(needle) == std::string::npos) {
      return std::string("FAIL: message lacks '") + needle + "': " + m;
    }
  }
  auto best_effort = HostArena::Open(Options(64 * kMiB, LockMode::kBestEffort));
  if (!best_effort.ok()) return "FAIL: kBestEffort: " + best_effort.status().ToString();
  if ((*best_effort)->locked()) return "FAIL: kBestEffort reports locked()";
  // Warmed in the background, the whole arena is locked on fault at Open:
  // over the limit it is refused there, as a synchronous lock would be.
  HostArenaOptions background = Options(64 * kMiB, LockMode::kRequired);
  background.warm_in_background = true;
  background.warm_chunk_bytes = 32 * kKiB;
  auto refused = HostArena::Open(background);
  if (refused.ok()) return "FAIL: a background kRequired Open succeeded under a 64 KiB RLIMIT_MEMLOCK";
  if (refused.status().message().find("RLIMIT_MEMLOCK") == std::string::npos) {
    return "FAIL: the background refusal lacks RLIMIT_MEMLOCK: " + refused.status().ToString();
  }
  background.lock = LockMode::kBestEffort;
  auto unlocked = HostArena::Open(background);
  if (!unlocked.ok()) return "FAIL: background kBestEffort: " + unlocked.status().ToString();
  (*unlocked)->WaitWarm();
  if ((*unlocked)->warm_bytes() != 64 * kMiB) return "FAIL: background kBestEffort did not fault in the whole arena";
  if ((*unlocked)->locked()) return "FAIL: background kBestEffort reports locked() past its limit";
  return "OK " + m;
}

TEST(HostTierTest, LockRequiredFailsClearlyUnderLowMemlockLimit) {
  if (!kMlockIsReal) GTEST_SKIP() << kNoMlockUnderAsan;
  const std::string out = RunInChild(MlockFailsUnderLowLimit);
  if (out.rfind("SKIP", 0) == 0) GTEST_SKIP() << out;
  EXPECT_EQ(out.rfind("OK ", 0), 0u) << out;
  std::printf("[ info     ] kRequired error: %s\n", out.c_str() + 3);
}

}  // namespace
}  // namespace kvtier

// Memory pressure (issue 18, 6): kvtierd in a memory-limited cgroup.
// - Sizes that cannot fit under the limit are refused at start with a clear
//   error, instead of the kernel OOM-killing the daemon as it pre-faults
//   its arena.
// - Under a load that wants far more than the tiers hold (stress clients
//   and connections parked on partial frames), puts past the tiers are
//   refused or evict, nothing is OOM-killed, and the daemon's peak resident
//   memory stays under its tier sizes plus the documented base and
//   per-connection overhead (docs/RELIABILITY.md).
// Needs root and a memory cgroup it may create children in (cgroup v1's
// memory controller, or v2 with memory delegated); skipped with the reason
// otherwise.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "common/sanitizers.h"
#include "daemon/setup/memory_limit.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/test_daemon.h"

namespace kvtier::testing {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
// The overhead per open connection the daemon promises
// (docs/RELIABILITY.md): its socket buffers' accounting, the connection's
// state, its first frame buffer and its share of the write path.
constexpr uint64_t kPerConnectionBytes = 64 * 1024;

bool WriteText(const std::string& path, const std::string& text) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  return ok;
}

// The number after `name ` in a "name value" per line file; -1 if absent.
int64_t Field(const std::string& text, const std::string& name) {
  std::istringstream lines(text);
  std::string key;
  int64_t value = 0;
  while (lines >> key >> value) {
    if (key == name) return value;
  }
  return -1;
}

// A memory cgroup below the test's own, limited (swap included), that a
// child joins before it execs.
class MemoryCgroup {
 public:
  // nullopt with `why_not` set when this machine cannot make one.
  static std::optional<MemoryCgroup> Create(uint64_t limit_bytes, std::string* why_not) {
    if (::geteuid() != 0) {
      *why_not = "needs root to create a memory cgroup";
      return std::nullopt;
    }
    MemoryCgroup cg;
    const std::string procs = ReadFile("/proc/self/cgroup");
    std::istringstream lines(procs);
    std::string line, v1_path, v2_path;
    while (std::getline(lines, line)) {
      const size_t a = line.find(':'), b = line.find(':', a + 1);
      if (b == std::string::npos) continue;
      const std::string controllers = "," + line.substr(a + 1, b - a - 1) + ",";
      if (controllers.find(",memory,") != std::string::npos) v1_path = line.substr(b + 1);
      if (line.compare(0, 3, "0::") == 0) v2_path = line.substr(b + 1);
    }
    const std::string name = "/kvtier-memory-test-" + std::to_string(::getpid());
    if (!v1_path.empty() && ::access("/sys/fs/cgroup/memory/memory.limit_in_bytes", F_OK) == 0) {
      cg.v2_ = false;
      cg.dir_ = "/sys/fs/cgroup/memory" + (v1_path == "/" ? "" : v1_path) + name;
    } else if (ReadFile("/sys/fs/cgroup/cgroup.controllers").find("memory") != std::string::npos) {
      cg.v2_ = true;
      cg.dir_ = "/sys/fs/cgroup" + (v2_path == "/" ? "" : v2_path) + name;
    } else {
      *why_not = "no memory cgroup controller mounted under /sys/fs/cgroup";
      return std::nullopt;
    }
    if (::mkdir(cg.dir_.c_str(), 0755) != 0) {
      *why_not = "cannot create " + cg.dir_ + ": " + std::strerror(errno);
      return std::nullopt;
    }
    const std::string limit = std::to_string(limit_bytes);
    if (!WriteText(cg.File(cg.v2_ ? "memory.max" : "memory.limit_in_bytes"), limit)) {
      *why_not = "cannot set the limit of " + cg.dir_ + " (memory not delegated?): " + std::strerror(errno);
      ::rmdir(cg.dir_.c_str());
      return std::nullopt;
    }
    // No swap to spill into (absent without swap accounting: fine).
    if (cg.v2_)
      WriteText(cg.File("memory.swap.max"), "0");
    else
      WriteText(cg.File("memory.memsw.limit_in_bytes"), limit);
    return cg;
  }

  MemoryCgroup(MemoryCgroup&& other) noexcept : dir_(std::move(other.dir_)), v2_(other.v2_) { other.dir_.clear(); }
  ~MemoryCgroup() {
    if (dir_.empty()) return;
    // Its processes are gone by now (the daemons are killed first); the
    // kernel may take a moment to let go of a cgroup whose task just died.
    for (int i = 0; i < 100 && ::rmdir(dir_.c_str()) != 0 && errno == EBUSY; ++i) ::usleep(20000);
  }

  std::string File(const std::string& name) const { return dir_ + "/" + name; }
  // A shell script that joins this cgroup and execs `binary` with its arguments.
  std::string Wrapper(const std::string& dir, const std::string& binary) const {
    const std::string path = dir + "/in-cgroup.sh";
    std::ofstream(path) << "#!/bin/sh\necho $$ > " << File("cgroup.procs") << " || exit 97\nexec " << binary
                        << " \"$@\"\n";
    ::chmod(path.c_str(), 0755);
    return path;
  }
  int64_t OomKills() const { return Field(ReadFile(File(v2_ ? "memory.events" : "memory.oom_control")), "oom_kill"); }

 private:
  MemoryCgroup() = default;
  std::string dir_;
  bool v2_ = false;
};

// The peak resident memory of `pid` (VmHWM; the arena counts, as it is
// mapped and pre-faulted), in bytes; 0 if unreadable.
uint64_t PeakResidentBytes(pid_t pid) {
  const std::string status = ReadFile("/proc/" + std::to_string(pid) + "/status");
  const size_t at = status.find("VmHWM:");
  if (at == std::string::npos) return 0;
  return std::stoull(status.substr(at + 6)) * 1024;
}

// A connection that sends a frame header announcing `announced` bytes and
// `sent` of them, then waits: memory the daemon holds for it until the
// frame timeout. -1 if the connection failed.
int ParkOnPartialFrame(const std::string& socket_path, uint32_t announced, uint32_t sent) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, socket_path.c_str(), sizeof(addr.sun_path) - 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  std::vector<char> bytes(4 + sent, 'x');
  std::memcpy(bytes.data(), &announced, 4);  // little-endian length prefix
  if (::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(bytes.size())) {
    ::close(fd);
    return -1;
  }
  return fd;
}

TEST(MemoryPressure, SizesPastTheCgroupLimitAreAStartupErrorNotAnOomKill) {
  std::string why_not;
  auto cgroup = MemoryCgroup::Create(256 * kMiB, &why_not);
  if (!cgroup) GTEST_SKIP() << why_not;
  const std::string dir = MakeTempDir();
  const std::string config = dir + "/kvtierd.toml";
  std::ofstream(config) << "[server]\nsocket_path = \"" << dir
                        << "/kvtierd.sock\"\n[host]\ncapacity_bytes = \"512MiB\"\n"
                        << "[metrics]\nport = 0\n";
  const CommandResult run = RunCommand({cgroup->Wrapper(dir, KVTIERD_PATH), "--config", config});
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("memory limit of kvtierd's cgroup: 256 MiB"), std::string::npos) << run.output;
  EXPECT_EQ(cgroup->OomKills(), 0) << run.output;

  // "auto" sizes the arena under the limit instead: it starts.
  {
    DaemonProcess daemon(cgroup->Wrapper(dir, KVTIERD_PATH), "", "[host]\ncapacity_bytes = 0\n");
    ASSERT_TRUE(daemon.running());
    EXPECT_LE(PeakResidentBytes(daemon.pid()), 256 * kMiB);
    EXPECT_EQ(daemon.SignalAndWait(SIGTERM, 10000), 0) << ReadFile(daemon.log_path());
  }
  EXPECT_EQ(cgroup->OomKills(), 0);
  RemoveTree(dir);
}

TEST(MemoryPressure, UnderLoadPutsAreRefusedNothingIsKilledAndMemoryStaysBounded) {
  if (KVTIER_ASAN || KVTIER_TSAN) {
    GTEST_SKIP() << "under a sanitizer the daemon's memory is mostly the sanitizer's (shadow, quarantine): "
                    "the bound is checked by the release suite";
  }
  // The tiers' memory: a 64 MiB arena and 16 MiB of NVMe staging (on a
  // 128 MiB file, which the load overflows too); partial frames bounded
  // at 16 MiB. Everything else is the base and the connections.
  constexpr uint64_t kArena = 64 * kMiB, kStaging = 16 * kMiB, kPartialFrames = 16 * kMiB;
  constexpr int kParked = 200, kClients = 8;
  const uint64_t connections = kParked + kClients + 4;  // and the test's probes
  const uint64_t bound = kArena + kStaging + kPartialFrames + kDaemonBaseBytes + connections * kPerConnectionBytes;
  std::string why_not;
  // Room above the bound for what the cgroup is charged besides the
  // daemon's resident memory (page cache of the index, kernel socket buffers).
  auto cgroup = MemoryCgroup::Create(bound + 64 * kMiB, &why_not);
  if (!cgroup) GTEST_SKIP() << why_not;
  const std::string dir = MakeTempDir();
  DaemonProcess daemon(cgroup->Wrapper(dir, KVTIERD_PATH),
                       "partial_frame_bytes = \"16MiB\"\nframe_timeout_ms = 60000\n",
                       "[host]\ncapacity_bytes = \"64MiB\"\n[nvme]\npath = \"" + dir +
                           "/nvme\"\n"
                           "capacity_bytes = \"128MiB\"\nregion_bytes = \"8MiB\"\nstaging_bytes = \"16MiB\"\n");
  ASSERT_TRUE(daemon.running());

  // Parked connections, each announcing 1 MiB and sending 64 KiB: together
  // they ask for 200 MiB of frame memory, 12x the budget.
  std::vector<int> parked;
  for (int i = 0; i < kParked; ++i) {
    const int fd = ParkOnPartialFrame(daemon.socket_path(), 1u << 20, 64 * 1024);
    if (fd >= 0) parked.push_back(fd);
  }
  EXPECT_EQ(parked.size(), static_cast<size_t>(kParked));

  const std::string json_path = dir + "/stress.json";
  // 16 chains of 64 blocks of 64 KiB-ish values: about 4x the arena.
  const CommandResult stress =
      RunCommand({KVTIER_TOOL_PATH, "stress", "--socket", daemon.socket_path(), "--clients", std::to_string(kClients),
                  "--seconds", "4", "--chains", "16", "--chain-blocks", "64", "--json", json_path});
  const std::string json = ReadFile(json_path);
  ASSERT_FALSE(json.empty()) << stress.output;
  EXPECT_EQ(stress.exit_code, 0) << stress.output << json;
  const size_t totals = json.find("\"operations\"");
  ASSERT_NE(totals, std::string::npos) << json;
  EXPECT_EQ(json.find("\"violations\": 0", totals) != std::string::npos, true) << json;

  for (int fd : parked) ::close(fd);
  int status = 0;
  ASSERT_EQ(::waitpid(daemon.pid(), &status, WNOHANG), 0) << "kvtierd died: " << ReadFile(daemon.log_path());
  const uint64_t peak = PeakResidentBytes(daemon.pid());
  EXPECT_EQ(cgroup->OomKills(), 0);
  EXPECT_LE(peak, bound) << "peak resident " << peak / kMiB << " MiB over the bound of " << bound / kMiB << " MiB";
  std::printf(
      "memory pressure: peak resident %.1f MiB of the %.1f MiB bound (arena %llu MiB, %llu connections); "
      "cgroup oom kills %lld\n",
      static_cast<double>(peak) / kMiB, static_cast<double>(bound) / kMiB,
      static_cast<unsigned long long>(kArena / kMiB), static_cast<unsigned long long>(connections),
      static_cast<long long>(cgroup->OomKills()));
  EXPECT_EQ(daemon.SignalAndWait(SIGTERM, 20000), 0) << ReadFile(daemon.log_path());
  RemoveTree(dir);
}

}  // namespace
}  // namespace kvtier::testing

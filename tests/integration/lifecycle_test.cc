// kvtierd's life cycle as a service, with the real binary as a child
// process: the systemd notifications (READY, WATCHDOG, RELOADING,
// STOPPING) on a notify socket the test binds, SIGHUP reloads, json logs,
// the socket's mode and group against a client under another uid, a warm
// restart of the NVMe tier after SIGTERM, and the one-line start-up
// failures. Root is needed for the other-uid, memlock and no-space cases.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <csignal>
#include <fcntl.h>
#include <grp.h>
#include <fstream>
#include <functional>
#include <poll.h>
#include <sstream>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

#include "common/logging.h"
#include "common/sanitizers.h"
#include "common/unix_socket.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/test_daemon.h"

namespace kvtier::testing {
namespace {

// Small arena, no locking, metrics on any free port: tests run side by side.
constexpr const char* kSmallDaemon = "[host]\ncapacity_bytes = \"64MiB\"\nlock_memory = \"off\"\n[metrics]\nport = 0\n";

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void WriteFile(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) lines.push_back(line);
  }
  return lines;
}

size_t Count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// The fake systemd end: a datagram socket kvtierd sends its notifications to.
class NotifySocket {
 public:
  explicit NotifySocket(const std::string& path) : path_(path) {
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::snprintf(address.sun_path, sizeof(address.sun_path), "%s", path.c_str());
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0) << std::strerror(errno);
  }
  ~NotifySocket() { ::close(fd_); }
  const std::string& path() const { return path_; }

  // The next datagram, or "" when none came within `timeout_ms`.
  std::string Receive(int timeout_ms) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) <= 0) return "";
    char buffer[4096];
    const ssize_t n = ::recv(fd_, buffer, sizeof(buffer), 0);
    return n > 0 ? std::string(buffer, static_cast<size_t>(n)) : "";
  }
  // Receives until a datagram contains `needle` (true) or `timeout_ms`
  // passes (false). Every datagram received is appended to `seen`.
  bool WaitFor(const std::string& needle, int timeout_ms, std::vector<std::string>* seen = nullptr) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (std::chrono::steady_clock::now() < deadline) {
      const int left = static_cast<int>(
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count());
      std::string message = Receive(std::max(left, 1));
      if (seen != nullptr && !message.empty()) seen->push_back(message);
      if (message.find(needle) != std::string::npos) return true;
    }
    return false;
  }

 private:
  std::string path_;
  int fd_ = -1;
};

// kvtierd (or a wrapper that execs it) as a child with stdout and stderr
// in separate files. `before_exec` runs in the child after fork.
class Child {
 public:
  Child(const std::string& dir, const std::vector<std::string>& argv, const std::vector<std::string>& env = {},
        const std::function<void()>& before_exec = {})
      : out_path_(dir + "/stdout." + std::to_string(++started_)),
        err_path_(dir + "/stderr." + std::to_string(started_)) {
    const int out = ::open(out_path_.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
    const int err = ::open(err_path_.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(out, STDOUT_FILENO);
      ::dup2(err, STDERR_FILENO);
      for (const auto& e : env) ::putenv(const_cast<char*>(e.c_str()));
      if (before_exec) before_exec();
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    ::close(out);
    ::close(err);
  }
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  pid_t pid() const { return pid_; }
  std::string out() const { return ReadAll(out_path_); }
  std::string err() const { return ReadAll(err_path_); }
  void Signal(int signal) const { ::kill(pid_, signal); }

  // The exit code, or -1 after `timeout_ms` (then it is killed) or on death by a signal.
  int Wait(int timeout_ms) {
    for (int waited = 0; pid_ > 0 && waited < timeout_ms; waited += 10) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return -1;
  }
  // True once `socket` accepts connections (within 10 s) while the child lives.
  bool WaitListening(const std::string& socket) {
    for (int i = 0; i < 200; ++i) {
      auto probe = ConnectUnix(socket);
      if (probe.ok()) {
        ::close(*probe);
        return true;
      }
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

 private:
  static inline int started_ = 0;
  std::string out_path_;
  std::string err_path_;
  pid_t pid_ = -1;
};

bool Accepts(const std::string& socket) {
  auto probe = ConnectUnix(socket);
  if (!probe.ok()) return false;
  ::close(*probe);
  return true;
}

// connect(2) to `socket` from a child running as uid `uid` and gid `gid`
// with no supplementary groups: 0 when it connects, else its errno.
int ConnectAs(const std::string& socket, uid_t uid, gid_t gid) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (::setgroups(0, nullptr) != 0 || ::setresgid(gid, gid, gid) != 0 || ::setresuid(uid, uid, uid) != 0) {
      ::_exit(255);
    }
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::snprintf(address.sun_path, sizeof(address.sun_path), "%s", socket.c_str());
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    ::_exit(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 ? 0 : errno);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 254;
}

// A client's lookup through `socket` succeeds (the daemon serves).
void ExpectServes(const std::string& socket) {
  ClientOptions options;
  options.socket_path = socket;
  options.namespaces = {TestNamespace()};
  auto client = Client::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto found = (*client)->Lookup(0, TestKeys(TestNamespace(), 4, 1));
  EXPECT_TRUE(found.ok()) << found.status().ToString();
}

TEST(Lifecycle, NotifiesReadyWatchdogReloadAndStopping) {
  const std::string dir = MakeTempDir();
  const std::string socket = dir + "/kvtierd.sock";
  const std::string config = dir + "/kvtierd.toml";
  WriteFile(config, "[server]\nsocket_path = \"" + socket + "\"\n" + kSmallDaemon);
  NotifySocket notify(dir + "/notify");
  {
    Child daemon(dir, {KVTIERD_PATH, "--config", config}, {"NOTIFY_SOCKET=" + notify.path(), "WATCHDOG_USEC=200000"});
    // Before READY=1: the host arena, its journal and the listening socket
    // go to the descriptor store (docs/OPERATIONS.md "Restarts").
    std::vector<std::string> before_ready;
    ASSERT_TRUE(notify.WaitFor("READY=1", 10000, &before_ready)) << daemon.out() << daemon.err();
    EXPECT_NE(before_ready.back().find("STATUS="), std::string::npos) << before_ready.back();
    EXPECT_TRUE(Accepts(socket)) << "READY=1 came before the socket listened";
    std::string stored;
    for (size_t i = 0; i + 1 < before_ready.size(); ++i) stored += before_ready[i] + "|";
    EXPECT_NE(stored.find("FDSTORE=1\nFDPOLL=0\nFDNAME=host-arena|"), std::string::npos) << stored;
    EXPECT_NE(stored.find("FDSTORE=1\nFDPOLL=0\nFDNAME=host-journal|"), std::string::npos) << stored;
    EXPECT_NE(stored.find("FDSTORE=1\nFDPOLL=0\nFDNAME=kvtierd-socket|"), std::string::npos) << stored;
    // Pings every 100 ms (half of WATCHDOG_USEC) while the io threads answer.
    std::vector<std::string> seen;
    EXPECT_TRUE(notify.WaitFor("WATCHDOG=1", 2000, &seen));
    EXPECT_TRUE(notify.WaitFor("WATCHDOG=1", 2000, &seen));
    daemon.Signal(SIGHUP);
    seen.clear();
    ASSERT_TRUE(notify.WaitFor("RELOADING=1", 5000, &seen));
    EXPECT_NE(seen.back().find("MONOTONIC_USEC="), std::string::npos) << seen.back();
    EXPECT_TRUE(notify.WaitFor("READY=1", 5000, &seen)) << "no READY=1 after the reload";
    daemon.Signal(SIGTERM);
    EXPECT_TRUE(notify.WaitFor("STOPPING=1", 5000));
    EXPECT_EQ(daemon.Wait(10000), 0) << daemon.out() << daemon.err();
  }
  {
    // WATCHDOG_PID names another process (pid 1): this one must not ping.
    Child daemon(dir, {KVTIERD_PATH, "--config", config},
                 {"NOTIFY_SOCKET=" + notify.path(), "WATCHDOG_USEC=100000", "WATCHDOG_PID=1"});
    ASSERT_TRUE(notify.WaitFor("READY=1", 10000));
    std::vector<std::string> seen;
    EXPECT_FALSE(notify.WaitFor("WATCHDOG=1", 500, &seen)) << "pinged for another pid";
    daemon.Signal(SIGTERM);
    EXPECT_EQ(daemon.Wait(10000), 0) << daemon.out() << daemon.err();
  }
  RemoveTree(dir);
}

// SIGHUP re-reads --config: log.level applies (observable: the info lines
// of the next reload vanish at "warn"), a changed immutable option is
// logged as needing a restart, and a broken file keeps the old config
// serving. READY=1 on the notify socket marks the end of each reload.
TEST(Lifecycle, SighupReloadsRunTimeOptionsOnly) {
  const std::string dir = MakeTempDir();
  const std::string socket = dir + "/kvtierd.sock";
  const std::string config = dir + "/kvtierd.toml";
  const std::string server = "[server]\nsocket_path = \"" + socket + "\"\n";
  WriteFile(config, server + "io_threads = 2\n" + kSmallDaemon + "[log]\nlevel = \"info\"\n");
  NotifySocket notify(dir + "/notify");
  Child daemon(dir, {KVTIERD_PATH, "--config", config}, {"NOTIFY_SOCKET=" + notify.path()});
  ASSERT_TRUE(notify.WaitFor("READY=1", 10000)) << daemon.out() << daemon.err();

  WriteFile(config, server + "io_threads = 3\n" + kSmallDaemon + "[log]\nlevel = \"warn\"\n");
  daemon.Signal(SIGHUP);
  ASSERT_TRUE(notify.WaitFor("READY=1", 5000));
  std::string log = daemon.out();
  EXPECT_NE(log.find("SIGHUP: log.level = \"warn\" (was \"info\")"), std::string::npos) << log;
  EXPECT_NE(log.find("server.io_threads changed to 3"), std::string::npos) << log;
  EXPECT_NE(log.find("needs a restart"), std::string::npos) << log;
  EXPECT_EQ(Count(log, "SIGHUP: reloaded"), 0u) << "an info line at level warn: " << log;
  // `kvtier config get` shows the running configuration: the applied
  // option changed, the one needing a restart did not.
  CommandResult level = RunCommand({KVTIER_TOOL_PATH, "config", "get", "log.level", "--socket", socket});
  EXPECT_EQ(level.output, "\"warn\"\n");
  CommandResult threads = RunCommand({KVTIER_TOOL_PATH, "config", "get", "server.io_threads", "--socket", socket});
  EXPECT_EQ(threads.output, "2\n");

  WriteFile(config, server + "[log\nlevel = ");  // not TOML
  daemon.Signal(SIGHUP);
  ASSERT_TRUE(notify.WaitFor("READY=1", 5000));
  log = daemon.out();
  EXPECT_NE(log.find("reload failed, the running configuration stays"), std::string::npos) << log;
  ExpectServes(socket);

  WriteFile(config, server + "io_threads = 2\n" + kSmallDaemon + "[log]\nlevel = \"info\"\n");
  daemon.Signal(SIGHUP);
  ASSERT_TRUE(notify.WaitFor("READY=1", 5000));
  log = daemon.out();
  EXPECT_EQ(Count(log, "SIGHUP: reloaded"), 1u) << "info is back: " << log;
  EXPECT_EQ(Count(log, "needs a restart"), 1u) << "io_threads is back to its running value: " << log;
  daemon.Signal(SIGTERM);
  EXPECT_EQ(daemon.Wait(10000), 0);
  RemoveTree(dir);
}

// A config file replaced by a FIFO (or anything not a regular file) must
// not block the signal thread: the SIGHUP reload refuses it at once with a
// clear error, the daemon keeps serving and a SIGTERM still stops it. The
// 20 s bound only tells a stuck daemon from a live one.
TEST(Lifecycle, AConfigReplacedByAFifoIsRefusedAndSigtermStillStops) {
  const std::string dir = MakeTempDir();
  const std::string socket = dir + "/kvtierd.sock";
  const std::string config = dir + "/kvtierd.toml";
  WriteFile(config, "[server]\nsocket_path = \"" + socket + "\"\n" + kSmallDaemon);
  NotifySocket notify(dir + "/notify");
  Child daemon(dir, {KVTIERD_PATH, "--config", config}, {"NOTIFY_SOCKET=" + notify.path()});
  ASSERT_TRUE(notify.WaitFor("READY=1", 10000)) << daemon.out() << daemon.err();

  ASSERT_EQ(::unlink(config.c_str()), 0);
  ASSERT_EQ(::mkfifo(config.c_str(), 0600), 0) << std::strerror(errno);
  daemon.Signal(SIGHUP);
  EXPECT_TRUE(notify.WaitFor("READY=1", 20000)) << "the reload never ended: " << daemon.out();
  const std::string log = daemon.out();
  EXPECT_NE(log.find("reload failed, the running configuration stays"), std::string::npos) << log;
  EXPECT_NE(log.find("not a regular file"), std::string::npos) << log;
  ExpectServes(socket);

  daemon.Signal(SIGTERM);
  EXPECT_EQ(daemon.Wait(20000), 0) << "SIGTERM did not stop kvtierd: " << daemon.out();
  RemoveTree(dir);
}

// Every line kvtierd writes with --log-format json parses as one JSON
// object with time, level and message, including a reload error that
// quotes a key made of a quote, a backslash and a control character (and
// JsonLogRecord itself: invalid UTF-8 becomes \ufffd).
TEST(Lifecycle, JsonLogFormatWritesOneObjectPerLine) {
  std::string record = JsonLogRecord(spdlog::level::warn,
                                     "a\"b\\c\nd\x01"
                                     "e\xff \xc3\xa9",
                                     std::chrono::system_clock::time_point(std::chrono::seconds(0)), 7);
  EXPECT_EQ(record,
            "{\"time\":\"1970-01-01T00:00:00.000000Z\",\"level\":\"warning\",\"thread\":7,"
            "\"message\":\"a\\\"b\\\\c\\nd\\u0001e\\ufffd \xc3\xa9\"}\n");

  const std::string dir = MakeTempDir();
  const std::string socket = dir + "/kvtierd.sock";
  const std::string config = dir + "/kvtierd.toml";
  WriteFile(config, "[server]\nsocket_path = \"" + socket + "\"\n" + kSmallDaemon);
  NotifySocket notify(dir + "/notify");
  Child daemon(dir, {KVTIERD_PATH, "--config", config, "--log-format", "json"}, {"NOTIFY_SOCKET=" + notify.path()});
  ASSERT_TRUE(notify.WaitFor("READY=1", 10000)) << daemon.out() << daemon.err();
  // An unknown key holding a quote, a backslash and a control character:
  // the reload error quotes it.
  WriteFile(config, "[server]\n\"q\\\"b\\\\c\\u0001d\" = 1\n");
  daemon.Signal(SIGHUP);
  ASSERT_TRUE(notify.WaitFor("READY=1", 5000));
  daemon.Signal(SIGTERM);
  ASSERT_EQ(daemon.Wait(10000), 0);

  const std::string all = daemon.out() + daemon.err();
  EXPECT_NE(all.find("reload failed"), std::string::npos) << all;
  EXPECT_GE(Lines(all).size(), 4u) << all;
  const std::string lines_path = dir + "/all.log";
  WriteFile(lines_path, all);
  // Python's json module is the judge; a line that does not parse fails.
  CommandResult check =
      RunCommand({"/usr/bin/python3", "-c",
                  "import json,sys\n"
                  "found = False\n"
                  "for n, line in enumerate(open(sys.argv[1], 'rb').read().split(b'\\n')):\n"
                  "    if not line: continue\n"
                  "    o = json.loads(line.decode('utf-8'))\n"
                  "    assert isinstance(o, dict) and {'time', 'level', 'message'} <= o.keys(), (n, line)\n"
                  "    assert o['time'].endswith('Z') and 'T' in o['time'], o['time']\n"
                  "    found = found or 'q\"b\\\\c\\x01d' in o['message']\n"
                  "assert found, 'the odd key did not come back intact'\n"
                  "print('ok')\n",
                  lines_path});
  EXPECT_EQ(check.exit_code, 0) << check.output << "\n" << all;
  EXPECT_NE(check.output.find("ok"), std::string::npos) << check.output;
  RemoveTree(dir);
}

// The socket is 0660 and belongs to server.socket_group; the directory
// kvtierd creates is 0750 and in that group. A client under another uid
// connects when it is in the group and is refused (EACCES) when not
// (a forked child that drops to uid 65534 with only that gid).
TEST(Lifecycle, SocketModeAndGroupDecideWhoConnects) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to connect as another uid";
  constexpr gid_t kGroup = 4242;  // numeric: no /etc/group entry needed
  const std::string dir = MakeTempDir();
  ASSERT_EQ(::chmod(dir.c_str(), 0755), 0);  // the other uid must reach run/
  const std::string socket = dir + "/run/kvtierd.sock";
  const std::string config = dir + "/kvtierd.toml";
  WriteFile(config, "[server]\nsocket_path = \"" + socket + "\"\nsocket_mode = \"0660\"\nsocket_group = \"" +
                        std::to_string(kGroup) + "\"\n" + kSmallDaemon);
  const mode_t umask_before = ::umask(0);  // the daemon must not rely on a friendly umask
  Child daemon(dir, {KVTIERD_PATH, "--config", config});
  ::umask(umask_before);
  ASSERT_TRUE(daemon.WaitListening(socket)) << daemon.out() << daemon.err();

  struct stat st {};
  ASSERT_EQ(::stat(socket.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0660u);
  EXPECT_EQ(st.st_gid, kGroup);
  ASSERT_EQ(::stat((dir + "/run").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0750u);
  EXPECT_EQ(st.st_gid, kGroup);

  constexpr uid_t kNobody = 65534;
  EXPECT_EQ(ConnectAs(socket, kNobody, kGroup), 0) << "a member of the socket's group must connect";
  EXPECT_EQ(ConnectAs(socket, kNobody, kNobody), EACCES) << "a stranger must be refused";
  ExpectServes(socket);
  daemon.Signal(SIGTERM);
  EXPECT_EQ(daemon.Wait(10000), 0);
  RemoveTree(dir);
}

// SIGTERM with an NVMe tier exits 0 after closing the tier and its index;
// a new kvtierd on the same files serves the demoted blocks byte-exact.
TEST(Lifecycle, SigtermThenRestartKeepsTheNvmeTier) {
  const std::string dir = MakeTempDir();
  const std::string socket = dir + "/kvtierd.sock";
  const std::string config = dir + "/kvtierd.toml";
  WriteFile(config, "[server]\nsocket_path = \"" + socket +
                        "\"\n[host]\ncapacity_bytes = \"4MiB\"\nlock_memory = \"off\"\n[metrics]\nport = 0\n"
                        "[nvme]\npath = \"" +
                        dir +
                        "/tier.dat\"\ncapacity_bytes = \"48MiB\"\n"
                        "region_bytes = \"4MiB\"\nstaging_bytes = \"16MiB\"\ndirect_io = false\nadmission = \"all\"\n");
  const auto keys = TestKeys(TestNamespace(), 200, 31);
  constexpr size_t kBlockBytes = 64 << 10;  // TestNamespace's whole block
  ClientOptions options;
  options.socket_path = socket;
  options.namespaces = {TestNamespace()};
  size_t on_nvme = 0;
  {
    Child daemon(dir, {KVTIERD_PATH, "--config", config});
    ASSERT_TRUE(daemon.WaitListening(socket)) << daemon.out() << daemon.err();
    auto client = Client::Connect(options);
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    std::vector<std::byte> block(kBlockBytes);
    for (const auto& k : keys) {
      FillBlockBytes(k, 9, block);
      ASSERT_TRUE((*client)->Put(0, k, block).ok());
    }
    // Demotions are asynchronous: wait until most of the 12.5 MiB left the 4 MiB arena.
    for (int i = 0; i < 500 && on_nvme < 100; ++i) {
      auto found = (*client)->Lookup(0, keys);
      ASSERT_TRUE(found.ok()) << found.status().ToString();
      on_nvme = static_cast<size_t>(std::count(found->tiers.begin(), found->tiers.end(), Tier::kNvme));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_GE(on_nvme, 100u);
    client->reset();
    daemon.Signal(SIGTERM);
    EXPECT_EQ(daemon.Wait(20000), 0) << daemon.out() << daemon.err();
    EXPECT_NE(daemon.out().find("kvtierd stopped"), std::string::npos) << daemon.out();
  }
  Child daemon(dir, {KVTIERD_PATH, "--config", config});
  ASSERT_TRUE(daemon.WaitListening(socket)) << daemon.out() << daemon.err();
  auto client = Client::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto found = (*client)->Lookup(0, keys);
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_GE(found->prefix_blocks, on_nvme) << "the demoted prefix is back";
  std::vector<std::byte> dst(kBlockBytes);
  for (size_t i = 0; i < found->prefix_blocks; ++i) {
    auto got = (*client)->Get(0, keys[i], dst);
    ASSERT_TRUE(got.ok()) << i << ": " << got.status().ToString();
    ASSERT_EQ(*got, kBlockBytes);
    ASSERT_TRUE(CheckBlockBytes(keys[i], 9, dst)) << "block " << i;
  }
  client->reset();
  daemon.Signal(SIGTERM);
  EXPECT_EQ(daemon.Wait(20000), 0) << daemon.out() << daemon.err();
  RemoveTree(dir);
}

// Each start-up failure: exit 1 and exactly one line on stderr saying why.
void ExpectOneLineFailure(Child& child, const std::string& why) {
  EXPECT_EQ(child.Wait(20000), 1) << child.out() << child.err();
  const auto lines = Lines(child.err());
  ASSERT_EQ(lines.size(), 1u) << "stderr: " << child.err();
  EXPECT_NE(lines[0].find("kvtierd: cannot start: "), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find(why), std::string::npos) << lines[0];
}

TEST(Lifecycle, StartUpFailuresSayWhyInOneLine) {
  const std::string dir = MakeTempDir();
  const std::string socket = dir + "/kvtierd.sock";
  const std::string config = dir + "/kvtierd.toml";
  WriteFile(config, "[server]\nsocket_path = \"" + socket + "\"\n" + kSmallDaemon);
  {
    Child first(dir, {KVTIERD_PATH, "--config", config});
    ASSERT_TRUE(first.WaitListening(socket)) << first.out() << first.err();
    Child second(dir, {KVTIERD_PATH, "--config", config});
    ExpectOneLineFailure(second, "another kvtierd is already listening at " + socket);
    EXPECT_TRUE(Accepts(socket)) << "the second daemon must leave the first one's socket alone";
  }
  {
    const std::string bad_group = dir + "/bad_group.toml";
    WriteFile(bad_group,
              "[server]\nsocket_path = \"" + dir + "/g.sock\"\nsocket_group = \"no-such-group-kvt\"\n" + kSmallDaemon);
    Child child(dir, {KVTIERD_PATH, "--config", bad_group});
    ExpectOneLineFailure(child, "no group named 'no-such-group-kvt'");
  }
  if (::geteuid() != 0) GTEST_SKIP() << "the memlock and no-space cases need root (capabilities, a tmpfs mount)";
#if !KVTIER_ASAN && !KVTIER_TSAN  // ASan's mlock interceptor ignores the call: the lock never fails there
  {
    // Without CAP_IPC_LOCK and with a 1 MiB RLIMIT_MEMLOCK, a required lock of 64 MiB fails.
    const std::string locked = dir + "/locked.toml";
    WriteFile(locked, "[server]\nsocket_path = \"" + dir +
                          "/l.sock\"\n[host]\ncapacity_bytes = \"64MiB\"\n"
                          "lock_memory = \"required\"\n[metrics]\nport = 0\n");
    Child child(
        dir, {"/usr/bin/setpriv", "--bounding-set=-ipc_lock", "--inh-caps=-ipc_lock", KVTIERD_PATH, "--config", locked},
        {}, [] {
          rlimit limit{1 << 20, 1 << 20};
          ::setrlimit(RLIMIT_MEMLOCK, &limit);
        });
    ExpectOneLineFailure(child, "RLIMIT_MEMLOCK");
  }
#endif
  {
    // The NVMe file on a 16 MiB tmpfs (in a private mount namespace) cannot be preallocated to 64 MiB.
    const std::string full = dir + "/full";
    ASSERT_EQ(::mkdir(full.c_str(), 0755), 0);
    const std::string no_space = dir + "/no_space.toml";
    WriteFile(no_space, "[server]\nsocket_path = \"" + dir + "/n.sock\"\n" + kSmallDaemon + "[nvme]\npath = \"" + full +
                            "/tier.dat\"\ncapacity_bytes = \"64MiB\"\nregion_bytes = \"4MiB\"\n"
                            "direct_io = false\nindex_path = \"" +
                            dir + "/index\"\n");
    CommandResult can_mount = RunCommand(
        {"/usr/bin/unshare", "--mount", "/bin/sh", "-c", "mount -t tmpfs -o size=16m,mode=0755 tmpfs " + full});
    if (can_mount.exit_code != 0) GTEST_SKIP() << "cannot mount a tmpfs here: " << can_mount.output;
    Child child(dir, {"/usr/bin/unshare", "--mount", "/bin/sh", "-c",
                      "mount -t tmpfs -o size=16m,mode=0755 tmpfs " + full + " && exec " + KVTIERD_PATH + " --config " +
                          no_space});
    ExpectOneLineFailure(child, "No space left on device");
  }
  RemoveTree(dir);
}

}  // namespace
}  // namespace kvtier::testing

#include "support/process.h"

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

extern char** environ;  // POSIX: the process's environment

#ifndef KVTIER_SUPPORT_BINDIR
#define KVTIER_SUPPORT_BINDIR "../../bin"
#endif

namespace kvtier::support {
namespace {

std::string Errno(const char* what, int err) { return std::string(what) + ": " + std::strerror(err); }

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
  return "wait status " + std::to_string(status);
}

std::vector<char*> ArgvPointers(const std::vector<std::string>& argv) {
  std::vector<char*> out;
  for (const auto& a : argv) out.push_back(const_cast<char*>(a.c_str()));
  out.push_back(nullptr);
  return out;
}

// "LISTEN_PID=" and room for any pid; the child writes the digits and a NUL.
constexpr char kListenPidPrefix[] = "LISTEN_PID=";
constexpr size_t kPidDigits = 20;

// Applies one SpawnOptions::env entry ("KEY=VALUE" sets, "KEY" removes).
void SetEnvEntry(std::vector<std::string>& env, const std::string& entry) {
  const std::string key = entry.substr(0, entry.find('=')) + "=";
  std::erase_if(env, [&key](const std::string& e) { return e.compare(0, key.size(), key) == 0; });
  if (entry.find('=') != std::string::npos) env.push_back(entry);
}

// Writes `pid` in decimal at `out` followed by a NUL (at most kPidDigits + 1
// bytes). Async-signal-safe.
void WritePid(char* out, pid_t pid) {
  char digits[kPidDigits];
  size_t n = 0;
  unsigned long long v = static_cast<unsigned long long>(pid);
  do {
    digits[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v != 0 && n < kPidDigits);
  for (size_t i = 0; i < n; ++i) out[i] = digits[n - 1 - i];
  out[n] = '\0';
}

}  // namespace

Result<pid_t> Spawn(const std::vector<std::string>& argv, int out_fd, const SpawnOptions& options) {
  if (argv.empty()) return InvalidArgument("empty command");
  std::vector<char*> args = ArgvPointers(argv);
  // With env or listen_pid the child runs execve on an environment and a path
  // built here: nothing that allocates happens after fork.
  const bool own_env = !options.env.empty() || options.listen_pid;
  std::string program = argv[0];
  std::vector<std::string> env;
  size_t listen_pid_index = 0;
  if (own_env) {
    if (options.search_path && program.find('/') == std::string::npos) {
      program = FindProgram(program);
      if (program.empty()) return NotFound("cannot run " + argv[0] + ": not found in PATH");
    }
    for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
    for (const std::string& entry : options.env) SetEnvEntry(env, entry);
    if (options.listen_pid) {
      SetEnvEntry(env, "LISTEN_PID");
      listen_pid_index = env.size();
      env.push_back(std::string(kListenPidPrefix) + std::string(kPidDigits, '0'));
    }
  }
  std::vector<char*> envp = ArgvPointers(env);
  const int n_pass = static_cast<int>(options.pass_fds.size());
  std::vector<int> moved(options.pass_fds.size(), -1);  // the sources above 3..3+n_pass-1, in the child
  const pid_t parent = ::getpid();
  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0) return IoError(Errno("pipe2", errno));
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    ::close(report[0]);
    ::close(report[1]);
    return IoError(Errno("fork", err));
  }
  if (pid == 0) {
    // What failed (0: exec, 1: setrlimit, 2: placing pass_fds) and its errno.
    int failure[2] = {0, 0};
    int report_fd = report[1];
    auto fail = [&](int what) {
      failure[0] = what;
      failure[1] = errno;
      [[maybe_unused]] ssize_t n = ::write(report_fd, failure, sizeof(failure));
      ::_exit(what == 0 ? 127 : 126);
    };
    if (options.parent_death_signal != 0) {
      ::prctl(PR_SET_PDEATHSIG, options.parent_death_signal);
      if (::getppid() != parent) ::_exit(127);
    }
    if (options.reset_signal_mask) {
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
    }
    if (n_pass > 0) {
      // Out of the target range first (the report pipe too, or a failed exec
      // would write into a passed fd), then down onto 3, 4, ...
      if (report_fd < 3 + n_pass) {
        const int high = ::fcntl(report[1], F_DUPFD_CLOEXEC, 3 + n_pass);
        if (high < 0) fail(2);
        report_fd = high;
      }
      for (int i = 0; i < n_pass; ++i) {
        moved[i] = ::fcntl(options.pass_fds[i], F_DUPFD_CLOEXEC, 3 + n_pass);
        if (moved[i] < 0) fail(2);
      }
    }
    ::dup2(out_fd, STDOUT_FILENO);
    ::dup2(out_fd, STDERR_FILENO);
    if (options.stdin_null) {
      int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
      if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
    }
    for (int i = 0; i < n_pass; ++i) {
      if (::dup2(moved[i], 3 + i) < 0) fail(2);  // dup2 leaves close-on-exec clear
    }
    if (options.max_open_files > 0) {
      const struct rlimit limit { options.max_open_files, options.max_open_files };
      if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) fail(1);
    }
    if (own_env) {
      if (options.listen_pid) WritePid(env[listen_pid_index].data() + sizeof(kListenPidPrefix) - 1, ::getpid());
      ::execve(program.c_str(), args.data(), envp.data());
    } else if (options.search_path) {
      ::execvp(args[0], args.data());
    } else {
      ::execv(args[0], args.data());
    }
    fail(0);
  }
  ::close(report[1]);
  int failure[2] = {0, 0};
  ssize_t n;
  do {
    n = ::read(report[0], failure, sizeof(failure));
  } while (n < 0 && errno == EINTR);
  ::close(report[0]);
  if (n == sizeof(failure)) {
    ::waitpid(pid, nullptr, 0);
    if (failure[0] == 1) return IoError(Errno("setrlimit RLIMIT_NOFILE", failure[1]));
    if (failure[0] == 2) return IoError(Errno("placing pass_fds in the child", failure[1]));
    return NotFound("cannot run " + argv[0] + ": " + std::strerror(failure[1]));
  }
  return pid;
}

Result<ChildProcess> ChildProcess::Spawn(const std::vector<std::string>& argv, const std::string& log_path,
                                         const SpawnOptions& options) {
  int log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) return IoError(Errno(("open " + log_path).c_str(), errno));
  auto pid = support::Spawn(argv, log_fd, options);
  ::close(log_fd);
  if (!pid.ok()) return pid.status();
  ChildProcess child;
  child.pid_ = *pid;
  return child;
}

ChildProcess::ChildProcess(ChildProcess&& other) noexcept : pid_(other.pid_) { other.pid_ = -1; }

ChildProcess& ChildProcess::operator=(ChildProcess&& other) noexcept {
  if (this != &other) {
    Stop();
    pid_ = other.pid_;
    other.pid_ = -1;
  }
  return *this;
}

ChildProcess::~ChildProcess() { Stop(); }

bool ChildProcess::Exited(std::string* how) {
  if (pid_ <= 0) return true;
  int status = 0;
  const pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == 0) return false;
  if (how != nullptr) *how = r == pid_ ? DescribeWaitStatus(status) : Errno("waitpid", errno);
  pid_ = -1;
  return true;
}

std::string ChildProcess::Stop(std::chrono::milliseconds grace) {
  if (pid_ <= 0) return "";
  std::string how;
  if (Exited(&how)) return how;
  ::kill(pid_, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + grace;
  while (std::chrono::steady_clock::now() < deadline) {
    if (Exited(&how)) return how;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid_, SIGKILL);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
  return DescribeWaitStatus(status) + " (did not stop within the grace period)";
}

std::string ChildProcess::Kill() {
  if (pid_ <= 0) return "";
  std::string how;
  if (Exited(&how)) return how;
  ::kill(pid_, SIGKILL);
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
  return DescribeWaitStatus(status);
}

Result<CommandOutput> RunCommand(const std::vector<std::string>& argv) {
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return IoError(Errno("pipe2", errno));
  auto pid = Spawn(argv, out[1]);
  ::close(out[1]);
  if (!pid.ok()) {
    ::close(out[0]);
    return pid.status();
  }
  CommandOutput result;
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::read(out[0], buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    result.output.append(buffer, static_cast<size_t>(n));
  }
  ::close(out[0]);
  int status = 0;
  while (::waitpid(*pid, &status, 0) < 0 && errno == EINTR) {
  }
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

std::string FindProgram(const std::string& program) {
  if (program.find('/') != std::string::npos) return ::access(program.c_str(), X_OK) == 0 ? program : "";
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    if (dir.empty()) continue;
    std::string candidate = dir + "/" + program;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

std::string DefaultKvtierdPath() {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "kvtierd";
  for (const std::filesystem::path& candidate :
       {self.parent_path() / ".." / "daemon" / "kvtierd", self.parent_path() / KVTIER_SUPPORT_BINDIR / "kvtierd"}) {
    const std::string path = candidate.lexically_normal().string();
    if (::access(path.c_str(), X_OK) == 0) return path;
  }
  return "kvtierd";
}

std::string FileTail(const std::string& path, size_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string text = buffer.str();
  if (text.size() > max_bytes) text = "..." + text.substr(text.size() - max_bytes);
  return text;
}

}  // namespace kvtier::support

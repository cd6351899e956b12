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

}  // namespace

Result<pid_t> Spawn(const std::vector<std::string>& argv, int out_fd, const SpawnOptions& options) {
  if (argv.empty()) return InvalidArgument("empty command");
  std::vector<char*> args = ArgvPointers(argv);
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
    // What failed (0: exec, 1: setrlimit) and its errno, for the parent.
    int failure[2] = {0, 0};
    if (options.parent_death_signal != 0) {
      ::prctl(PR_SET_PDEATHSIG, options.parent_death_signal);
      if (::getppid() != parent) ::_exit(127);
    }
    if (options.reset_signal_mask) {
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
    }
    ::dup2(out_fd, STDOUT_FILENO);
    ::dup2(out_fd, STDERR_FILENO);
    if (options.stdin_null) {
      int devnull = ::open("/dev/null", O_RDONLY);
      if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
    }
    if (options.max_open_files > 0) {
      const struct rlimit limit { options.max_open_files, options.max_open_files };
      if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) {
        failure[0] = 1;
        failure[1] = errno;
        [[maybe_unused]] ssize_t n = ::write(report[1], failure, sizeof(failure));
        ::_exit(126);
      }
    }
    if (options.search_path)
      ::execvp(args[0], args.data());
    else
      ::execv(args[0], args.data());
    failure[1] = errno;
    [[maybe_unused]] ssize_t n = ::write(report[1], failure, sizeof(failure));
    ::_exit(127);
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

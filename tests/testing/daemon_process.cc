#include "tests/testing/daemon_process.h"

#include <chrono>
#include <csignal>
#include <fcntl.h>
#include <fstream>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

#include "common/unix_socket.h"
#include "support/process.h"
#include "tests/testing/test_daemon.h"

namespace kvtier::testing {
namespace {

// Forks and execs `argv` (no PATH lookup) with stdout and stderr on `out_fd`,
// the test's stdin and signal mask inherited; support::Spawn's errors.
Result<pid_t> Spawn(const std::vector<std::string>& argv, int out_fd, uint64_t max_open_files = 0) {
  support::SpawnOptions options;
  options.search_path = false;
  options.parent_death_signal = 0;
  options.stdin_null = false;
  options.reset_signal_mask = false;
  options.max_open_files = max_open_files;
  return support::Spawn(argv, out_fd, options);
}

int ExitCode(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : -1; }

}  // namespace

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

int64_t JsonInt(const std::string& json, const std::string& name, size_t from) {
  const std::string needle = "\"" + name + "\": ";
  const size_t at = json.find(needle, from);
  if (at == std::string::npos) return -1;
  return std::stoll(json.substr(at + needle.size(), 24));
}

CommandResult RunCommand(const std::vector<std::string>& argv) {
  std::string dir = MakeTempDir();
  std::string out_path = dir + "/out";
  int fd = ::open(out_path.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0600);
  Result<pid_t> pid = Spawn(argv, fd);
  ::close(fd);
  CommandResult result;
  int status = 0;
  if (!pid.ok() && pid.status().code() == StatusCode::kNotFound)
    result.exit_code = 127;  // as a shell says
  else if (pid.ok() && ::waitpid(*pid, &status, 0) == *pid)
    result.exit_code = ExitCode(status);
  else
    ADD_FAILURE() << "cannot run " << argv[0] << ": " << pid.status().ToString();
  result.output = ReadFile(out_path);
  RemoveTree(dir);
  return result;
}

DaemonProcess::DaemonProcess(const std::string& kvtierd_path, const std::string& server_keys,
                             const std::string& extra_toml, uint64_t max_open_files) {
  dir_ = MakeTempDir();
  socket_path_ = dir_ + "/kvtierd.sock";
  log_path_ = dir_ + "/kvtierd.log";
  const std::string config_path = dir_ + "/kvtierd.toml";
  // Any free port for the metrics endpoint unless the test says otherwise:
  // tests run side by side.
  const bool metrics = extra_toml.find("[metrics]") != std::string::npos;
  std::ofstream(config_path) << "[server]\nsocket_path = \"" << socket_path_ << "\"\n"
                             << server_keys << "\n"
                             << extra_toml << "\n"
                             << (metrics ? "" : "[metrics]\nport = 0\n");
  int fd = ::open(log_path_.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0600);
  Result<pid_t> pid = Spawn({kvtierd_path, "--config", config_path}, fd, max_open_files);
  ::close(fd);
  if (!pid.ok()) {
    ADD_FAILURE() << "cannot start kvtierd: " << pid.status().ToString();
    return;
  }
  pid_ = *pid;
  for (int i = 0; i < 200; ++i) {
    auto probe = ConnectUnix(socket_path_);
    if (probe.ok()) {
      ::close(*probe);
      return;
    }
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      ADD_FAILURE() << "kvtierd exited early: " << ReadFile(log_path_);
      pid_ = -1;
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ADD_FAILURE() << "kvtierd did not start listening: " << ReadFile(log_path_);
}

DaemonProcess::~DaemonProcess() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  RemoveTree(dir_);
}

int DaemonProcess::SignalAndWait(int signal, int timeout_ms) {
  if (pid_ <= 0) return -1;
  ::kill(pid_, signal);
  for (int waited = 0; waited < timeout_ms; waited += 10) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return ExitCode(status);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
  return -1;
}

}  // namespace kvtier::testing

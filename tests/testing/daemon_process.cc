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
#include "tests/testing/test_daemon.h"

namespace kvtier::testing {
namespace {

pid_t Spawn(const std::vector<std::string>& argv, int out_fd, uint64_t max_open_files = 0) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out_fd, STDOUT_FILENO);
    ::dup2(out_fd, STDERR_FILENO);
    if (max_open_files > 0) {
      const struct rlimit limit{max_open_files, max_open_files};
      if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) ::_exit(126);
    }
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  return pid;
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
  pid_t pid = Spawn(argv, fd);
  ::close(fd);
  CommandResult result;
  int status = 0;
  if (pid > 0 && ::waitpid(pid, &status, 0) == pid) result.exit_code = ExitCode(status);
  else ADD_FAILURE() << "cannot run " << argv[0];
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
                             << server_keys << "\n" << extra_toml << "\n"
                             << (metrics ? "" : "[metrics]\nport = 0\n");
  int fd = ::open(log_path_.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0600);
  pid_ = Spawn({kvtierd_path, "--config", config_path}, fd, max_open_files);
  ::close(fd);
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

// DaemonProcess: the real kvtierd binary as a child process, for tests of
// what only a process shows (signals, exit codes, command line, config files).
#pragma once

#include <cstdint>
#include <string>
#include <sys/types.h>
#include <vector>

namespace kvtier::testing {

struct CommandResult {
  int exit_code = -1;  // -1 if killed by a signal
  std::string output;  // stdout and stderr together
};

// The whole file at `path`; empty if unreadable.
std::string ReadFile(const std::string& path);
// The integer after `"name": ` at or after `from` in `json` (the reports of
// `kvtier stress --json` and the like); -1 if absent.
int64_t JsonInt(const std::string& json, const std::string& name, size_t from = 0);

// Runs `argv` to completion, capturing its output. Fails the test on spawn errors.
CommandResult RunCommand(const std::vector<std::string>& argv);

class DaemonProcess {
 public:
  // Writes `extra_toml` below a [server] socket_path in a fresh temp dir and
  // starts `kvtierd_path --config FILE`; waits (up to 10 s) until the socket
  // accepts connections. `extra_toml` must not contain a [server] section
  // header of its own (append server keys via `server_keys`).
  // `max_open_files` > 0: the daemon's RLIMIT_NOFILE, soft and hard (so it
  // cannot raise it); 0: the test's own.
  DaemonProcess(const std::string& kvtierd_path, const std::string& server_keys, const std::string& extra_toml,
                uint64_t max_open_files = 0);
  ~DaemonProcess();  // SIGKILLs if still running, removes the temp dir

  bool running() const { return pid_ > 0; }
  const std::string& socket_path() const { return socket_path_; }
  const std::string& log_path() const { return log_path_; }
  pid_t pid() const { return pid_; }

  // Sends `signal` and waits up to `timeout_ms` for the exit. Returns the exit
  // code, or -1 on timeout (then SIGKILLs) or death by signal.
  int SignalAndWait(int signal, int timeout_ms);

 private:
  std::string dir_;
  std::string socket_path_;
  std::string log_path_;
  pid_t pid_ = -1;
};

}  // namespace kvtier::testing

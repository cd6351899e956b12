// Child processes for the benches: the private kvtierd and redis-server they
// start, and one-shot commands (redis-benchmark) whose output they parse.
// POSIX fork + exec only; no daemon/ code.
#pragma once

#include <chrono>
#include <string>
#include <sys/types.h>
#include <vector>

#include "kvtier/result.h"

namespace kvtier::tools {

// A started child process. Move-only; the destructor stops it (Stop) if it
// still runs. Thread-compatible.
class ChildProcess {
 public:
  // Starts argv[0] (looked up in PATH unless it contains a '/') with stdout
  // and stderr appended to `log_path`. The child gets SIGTERM if this process
  // dies first. NotFound if the program does not exist or cannot be run,
  // IoError if fork or the log file fails.
  static Result<ChildProcess> Spawn(const std::vector<std::string>& argv, const std::string& log_path);

  ChildProcess() = default;
  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&& other) noexcept;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess();

  bool running() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }

  // Non-blocking: true (and reaps it) if the child has exited; `how` then
  // says how ("exit status 1", "killed by signal 9").
  bool Exited(std::string* how);

  // SIGTERM, then waits up to `grace` and SIGKILLs. Returns how it ended (as
  // Exited), or "" if it was not running.
  std::string Stop(std::chrono::milliseconds grace = std::chrono::seconds(10));

  // SIGKILL (a crash: no handler runs) and reap. Returns how it ended, or
  // "" if it was not running.
  std::string Kill();

 private:
  pid_t pid_ = -1;
};

struct CommandOutput {
  int exit_code = -1;  // -1: killed by a signal
  std::string output;  // stdout and stderr together
};

// Runs argv to completion and captures its output. NotFound if the program
// cannot be run, IoError if fork/pipe fails.
Result<CommandOutput> RunCommand(const std::vector<std::string>& argv);

// The absolute path of `program` in PATH (or itself if it contains '/' and is
// executable); empty if not found.
std::string FindProgram(const std::string& program);

// `<directory of /proc/self/exe>/../daemon/kvtierd`, normalized.
std::string DefaultKvtierdPath();

// A fresh directory under $TMPDIR (or /tmp) named `prefix`XXXXXX.
Result<std::string> MakeTempDir(const std::string& prefix);
void RemoveTree(const std::string& path);

// The last `max_bytes` of a file (for error messages quoting a child's log).
std::string FileTail(const std::string& path, size_t max_bytes = 2000);

}  // namespace kvtier::tools

// Child processes for the tools and the tests: servers they start (a private
// kvtierd, redis-server nodes), and one-shot commands whose output they read.
// POSIX fork + exec only; no daemon/ code. Part of kvtier_support, which only
// tools/ and tests/ link (never kvtierd or the client library).
#pragma once

#include <chrono>
#include <csignal>
#include <cstdint>
#include <string>
#include <sys/types.h>
#include <vector>

#include "kvtier/result.h"

namespace kvtier::support {

// How Spawn starts a child.
struct SpawnOptions {
  // execvp: argv[0] is looked up in PATH unless it contains a '/'; false:
  // execv, argv[0] taken as it is.
  bool search_path = true;
  // Sent to the child when the thread that spawned it dies (PR_SET_PDEATHSIG;
  // if the parent is already gone the child exits at once); 0: none.
  int parent_death_signal = SIGTERM;
  bool stdin_null = true;         // stdin from /dev/null; false: inherited
  bool reset_signal_mask = true;  // the child starts with no signal blocked; false: inherited
  uint64_t max_open_files = 0;    // > 0: the child's RLIMIT_NOFILE, soft and hard
  // Placed at 3, 4, ... in the child, in this order, close-on-exec cleared
  // (the way systemd passes fds); the caller keeps and closes its own. A
  // source may itself be one of 3..3+n-1: every source is moved above that
  // range first. Which other fds the child inherits is not changed.
  std::vector<int> pass_fds;
  // "KEY=VALUE": set KEY in the child's environment (replacing an inherited
  // KEY); "KEY" without '=': remove it. Applied in order, over this
  // process's environment. With env or listen_pid, the PATH lookup of
  // search_path is done in the parent (FindProgram, this process's PATH).
  std::vector<std::string> env;
  // Sets LISTEN_PID to the child's own pid (sd_listen_fds checks it), after
  // env; the digits are written in the child.
  bool listen_pid = false;
};

// Forks and execs `argv` with stdout and stderr on `out_fd` (which the caller
// keeps and closes). Returns the child's pid; the caller reaps it. A failed
// exec or setrlimit is reported at once, through a close-on-exec pipe:
// NotFound if the program cannot be run, IoError if setrlimit, pipe or fork
// fails, InvalidArgument for an empty argv, IoError if the pass_fds cannot
// be placed (an fd not open, or over the fd limit). Only async-signal-safe
// calls happen in the child (its environment is built before fork).
// Thread-safe, as long as no thread changes the environment (setenv) meanwhile.
Result<pid_t> Spawn(const std::vector<std::string>& argv, int out_fd, const SpawnOptions& options = {});

// A started child process. Move-only; the destructor stops it (Stop) if it
// still runs. Thread-compatible.
class ChildProcess {
 public:
  // Starts `argv` as Spawn does (by default: looked up in PATH, SIGTERM if
  // this process dies first) with stdout and stderr appended to `log_path`
  // (created 0644). Spawn's errors, or IoError if the log cannot be opened.
  static Result<ChildProcess> Spawn(const std::vector<std::string>& argv, const std::string& log_path,
                                    const SpawnOptions& options = {});

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

// The kvtierd of the running tool's build or install: `<directory of
// /proc/self/exe>/../daemon/kvtierd` (normalized) when it exists (the build
// tree, where every tool sits in build/tools/); else the installed one,
// `<that directory>/KVTIER_SUPPORT_BINDIR/kvtierd` (bindir relative to
// libexec/kvtier, where the installed tools sit) when it exists; else
// "kvtierd", for Spawn to look up in PATH.
std::string DefaultKvtierdPath();

// The last `max_bytes` of a file (for error messages quoting a child's log).
std::string FileTail(const std::string& path, size_t max_bytes = 2000);

}  // namespace kvtier::support

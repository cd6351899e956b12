#include "tools/supervise/supervise.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <memory>

#include "support/fd_store.h"
#include "support/process.h"
#include "support/temp_dir.h"

namespace kvtier::tools {
namespace {

using Clock = std::chrono::steady_clock;

constexpr auto kShortLife = std::chrono::seconds(10);  // a child that died sooner doubles the delay
constexpr uint32_t kMaxDelayMs = 30'000;
constexpr long kPollNs = 100'000'000;  // the store is drained at least this often

void Say(const std::string& line) { std::fprintf(stderr, "kvtier supervise: %s\n", line.c_str()); }

std::string How(int status) {
  if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("killed by signal ") + std::to_string(WTERMSIG(status));
  return "status " + std::to_string(status);
}

class Supervisor {
 public:
  Supervisor(const SuperviseOptions& o, std::unique_ptr<support::FdStore> store)
      : o_(o), store_(std::move(store)), delay_ms_(o.restart_delay_ms) {
    sigemptyset(&signals_);
    for (int s : {SIGTERM, SIGINT, SIGHUP, SIGCHLD}) sigaddset(&signals_, s);
    sigprocmask(SIG_BLOCK, &signals_, nullptr);  // taken by sigtimedwait; the child starts with none blocked
  }

  int Run() {
    for (;;) {
      const auto started = Clock::now();
      support::SpawnOptions spawn;
      spawn.parent_death_signal = SIGTERM;  // supervise gone: so is what it kept
      spawn.stdin_null = false;
      store_->PrepareSpawn(&spawn);
      auto child = support::Spawn(o_.command, STDOUT_FILENO, spawn);
      if (!child.ok()) {
        Say("cannot start " + o_.command[0] + ": " + child.status().ToString());
        return 1;
      }
      if (store_->size() > 0)
        Say("started " + o_.command[0] + " with " + std::to_string(store_->size()) + " kept descriptors");
      const int status = Wait(*child);
      Drain();
      if (stopping_) return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
      if (WIFEXITED(status) && (WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == 2)) {
        Say(o_.command[0] + " ended with " + How(status) + "; not starting it again");
        return WEXITSTATUS(status);
      }
      const bool short_life = Clock::now() - started < kShortLife;
      delay_ms_ = short_life ? std::min(delay_ms_ * 2, kMaxDelayMs) : o_.restart_delay_ms;
      Say(o_.command[0] + " ended with " + How(status) + "; starting it again in " + std::to_string(delay_ms_) +
          " ms with " + std::to_string(store_->size()) + " kept descriptors");
      if (!Sleep(delay_ms_)) return 0;  // stopped while waiting
    }
  }

 private:
  void Drain() {
    if (Status s = store_->Drain(); !s.ok()) Say("descriptor store: " + s.ToString());
  }

  // Waits for the child, passing signals on and draining the store. Its status.
  int Wait(pid_t pid) {
    for (;;) {
      const timespec timeout{0, kPollNs};
      const int signal = sigtimedwait(&signals_, nullptr, &timeout);
      Drain();
      if (signal == SIGTERM || signal == SIGINT || signal == SIGHUP) {
        if (signal != SIGHUP) stopping_ = true;
        ::kill(pid, signal);
      }
      int status = 0;
      const pid_t reaped = ::waitpid(pid, &status, WNOHANG);
      if (reaped == pid) return status;
      if (reaped < 0 && errno != EINTR) return 0;  // not ours any more: treat as stopped
    }
  }

  // Sleeps `ms`, draining; false when a stop signal came meanwhile.
  bool Sleep(uint32_t ms) {
    const auto until = Clock::now() + std::chrono::milliseconds(ms);
    while (Clock::now() < until) {
      const timespec timeout{0, kPollNs};
      const int signal = sigtimedwait(&signals_, nullptr, &timeout);
      Drain();
      if (signal == SIGTERM || signal == SIGINT) return false;
    }
    return true;
  }

  const SuperviseOptions& o_;
  std::unique_ptr<support::FdStore> store_;
  uint32_t delay_ms_;
  sigset_t signals_{};
  bool stopping_ = false;
};

}  // namespace

int RunSupervise(const SuperviseOptions& o) {
  if (o.command.empty()) {
    Say("no command: kvtier supervise -- kvtierd --config FILE");
    return 2;
  }
  std::string socket_path = o.notify_socket;
  std::string dir;
  if (socket_path.empty()) {
    auto made = support::MakeTempDir("kvtier-supervise-");
    if (!made.ok()) {
      Say(made.status().ToString());
      return 1;
    }
    dir = *made;
    socket_path = dir + "/notify.sock";
  }
  auto store = support::FdStore::Open(socket_path);
  if (!store.ok()) {
    Say("cannot open the descriptor store at " + socket_path + ": " + store.status().ToString());
    return 1;
  }
  int code = 0;
  {
    Supervisor supervisor(o, std::move(*store));
    code = supervisor.Run();
  }
  if (!dir.empty()) support::RemoveTree(dir);
  return code;
}

}  // namespace kvtier::tools

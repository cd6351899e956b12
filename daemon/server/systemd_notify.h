// The systemd service notification protocol (sd_notify(3)), without
// libsystemd: one datagram of "KEY=VALUE\n" lines to the unix socket named
// by $NOTIFY_SOCKET (a path, or an abstract name when it starts with '@').
//
// kvtierd sends READY=1 once its socket listens, RELOADING=1 / READY=1
// around a SIGHUP reload, STOPPING=1 when a stop signal arrives, and
// WATCHDOG=1 from a WatchdogPinger while the daemon is healthy.
//
// The file descriptor store (FDSTORE=1): kvtierd hands systemd the fds of
// what should outlive it (the host arenas and their journals, the
// listening socket), and gets them back at its next start as passed fds
// (LISTEN_FDS, TakePassedFds).
//
// Without $NOTIFY_SOCKET (not started by systemd with Type=notify) every
// call is a no-op that returns Ok. Errors are returned, never thrown; a
// failed notification is worth a log line, not a stop.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "kvtier/status.h"

namespace kvtier {

// Thread-safe: Notify may be called from any thread (each call opens,
// sends on and closes its own socket).
// One fd systemd passed at start (sd_listen_fds_with_names(3)).
struct PassedFd {
  int fd = -1;
  std::string name;  // its FDNAME; empty when none was given
};
inline constexpr int kFirstPassedFd = 3;
inline constexpr uint64_t kMaxListenFds = 4096;
// The fds passed to this process (LISTEN_FDS, fd 3 on, when LISTEN_PID is
// this process; at most kMaxListenFds), each made close-on-exec and now the
// caller's; the three
// variables are unset so that no child sees them. Empty when none.
// Call once, early, from one thread.
std::vector<PassedFd> TakePassedFds();

class SystemdNotifier {
 public:
  // Reads NOTIFY_SOCKET, WATCHDOG_USEC and WATCHDOG_PID once. The watchdog
  // is requested only when WATCHDOG_USEC is a positive number and
  // WATCHDOG_PID is unset or names this process.
  static SystemdNotifier FromEnvironment();
  // A notifier sending to `socket_path` (same syntax as $NOTIFY_SOCKET;
  // empty: disabled) with the given watchdog interval (0: none).
  SystemdNotifier(std::string socket_path, uint64_t watchdog_usec)
      : socket_path_(std::move(socket_path)), watchdog_usec_(watchdog_usec) {}

  bool enabled() const { return !socket_path_.empty(); }
  // The interval systemd expects a WATCHDOG=1 within; 0: no watchdog.
  uint64_t watchdog_usec() const { return enabled() ? watchdog_usec_ : 0; }

  // Sends `state`, e.g. "READY=1\nSTATUS=listening on /run/kvtier/kvtierd.sock".
  // Ok when disabled. InvalidArgument for a socket path that does not fit
  // sockaddr_un; IoError when the socket cannot be created or the send fails.
  Status Notify(std::string_view state) const;
  // Notify with `fds` attached (SCM_RIGHTS, at most kMaxPassedFds):
  // "FDSTORE=1\nFDNAME=..." stores them. The fds stay the caller's. Ok when
  // disabled.
  Status NotifyWithFds(std::string_view state, std::span<const int> fds) const;

 private:
  std::string socket_path_;
  uint64_t watchdog_usec_ = 0;
};

// Sends WATCHDOG=1 every half watchdog interval from its own thread, but
// only when `healthy()` returns true at that moment, so that a wedged
// daemon misses its pings and systemd restarts it. `healthy` runs on the
// pinger's thread and should return promptly (Stop waits for a probe in
// progress). With a
// notifier whose watchdog_usec() is 0 it starts no thread.
// `notifier` is borrowed and must outlive the pinger.
//
// Thread-safe: Stop may be called from any thread; the destructor stops.
class WatchdogPinger {
 public:
  WatchdogPinger(const SystemdNotifier& notifier, std::function<bool()> healthy);
  ~WatchdogPinger();
  WatchdogPinger(const WatchdogPinger&) = delete;
  WatchdogPinger& operator=(const WatchdogPinger&) = delete;

  // Ends the pinging and joins the thread. Idempotent.
  void Stop() EXCLUDES(mu_);

 private:
  void Run(uint64_t interval_us) EXCLUDES(mu_);

  const SystemdNotifier& notifier_;
  std::function<bool()> healthy_;
  Mutex mu_;
  CondVar stop_cv_;
  bool stopping_ GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace kvtier

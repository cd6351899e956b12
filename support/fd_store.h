// FdStore: what systemd's file descriptor store does for a service, for the
// tools and tests that start kvtierd without systemd (a crash-loop stress run,
// `kvtier supervise`). It owns an AF_UNIX datagram socket, the one a child
// finds in $NOTIFY_SOCKET, and reads the sd_notify messages sent there:
//   FDSTORE=1 [FDNAME=<name>]   keep the fds attached (SCM_RIGHTS) under
//                               <name> ("stored" if none);
//   FDSTOREREMOVE=1 FDNAME=<n>  close and drop every held fd named <n> (no
//                               FDNAME: nothing dropped);
//   READY=1, STATUS=<text>      counted / remembered;
// any other line (WATCHDOG=1, STOPPING=1, FDPOLL=0, ...) is ignored. The fds
// it holds outlive the process that sent them; PrepareSpawn hands them to the
// next one at 3, 4, ... with LISTEN_FDS, LISTEN_FDNAMES and LISTEN_PID, as
// systemd does on a restart.
//
// Rules, after systemd's: an fd that refers to the same file as one already
// held (same st_dev and st_ino) is closed and the first one kept; at most
// max_fds are held, the rest closed and counted in refused(); the fds of an
// FDSTORE=1 message whose FDNAME is not 1..255 printable ASCII characters
// other than ':' are closed and refused; fds attached to a message without
// FDSTORE=1 are closed. Nothing received is leaked. Anyone who can write to
// the socket path (mode 0600: this user) can send.
// Part of kvtier_support (tools and tests only). Thread-compatible: one
// thread at a time uses a store.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <sys/types.h>
#include <vector>

#include "kvtier/result.h"
#include "support/process.h"

namespace kvtier::support {

class FdStore {
 public:
  // The default cap on held fds (systemd's FileDescriptorStoreMax= plays
  // that role; it is set per service there).
  static constexpr size_t kDefaultMaxFds = 256;

  // Binds a datagram socket at `socket_path` (a stale file there is unlinked
  // first; close-on-exec, non-blocking, mode 0600). InvalidArgument if the
  // path is empty or does not fit sockaddr_un; IoError if socket, bind or
  // chmod fails.
  static Result<std::unique_ptr<FdStore>> Open(const std::string& socket_path, size_t max_fds = kDefaultMaxFds);

  FdStore(const FdStore&) = delete;
  FdStore& operator=(const FdStore&) = delete;
  // Closes the socket and every held fd, and unlinks the socket path.
  ~FdStore();

  // Reads every message waiting on the socket, without blocking, and applies
  // it (see the header comment). A truncated message (over 8 KiB, or over 64
  // fds) is ignored and its fds closed and refused. IoError if recvmsg fails
  // other than with EAGAIN; the messages read before it are applied.
  Status Drain();

  // Closes and drops every held fd.
  void Clear();

  // Adds to `options` what a child started under this store gets from
  // systemd: NOTIFY_SOCKET=socket_path(); with held fds, pass_fds = fds()
  // (replacing any), LISTEN_FDS, LISTEN_FDNAMES and listen_pid; without,
  // LISTEN_FDS, LISTEN_FDNAMES and LISTEN_PID removed from its environment.
  void PrepareSpawn(SpawnOptions* options) const;

  const std::string& socket_path() const { return socket_path_; }
  // One entry per held fd, in arrival order: its name, and the fd (still
  // owned by the store; valid until Clear, FDSTOREREMOVE or destruction).
  std::vector<std::string> names() const;
  std::vector<int> fds() const;
  size_t size() const { return held_.size(); }
  int ready_count() const { return ready_count_; }            // READY=1 messages seen
  const std::string& last_status() const { return status_; }  // last STATUS= value, "" if none
  // FDSTORE fds closed instead of held: over max_fds, a bad FDNAME, fstat
  // failed; and every fd of a truncated message.
  size_t refused() const { return refused_; }

 private:
  struct Held {
    std::string name;
    int fd;
    dev_t dev;
    ino_t ino;
  };

  FdStore(int socket_fd, std::string socket_path, size_t max_fds);
  // Applies one message's text to the fds that came with it (taking them).
  void Apply(const std::string& text, std::vector<int>& fds);
  // Holds `fd` under `name` unless a duplicate or over max_fds (then closed).
  void Hold(const std::string& name, int fd);

  int socket_fd_;
  std::string socket_path_;
  size_t max_fds_;
  std::vector<Held> held_;
  int ready_count_ = 0;
  std::string status_;
  size_t refused_ = 0;
};

}  // namespace kvtier::support

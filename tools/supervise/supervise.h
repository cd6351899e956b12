// `kvtier supervise [options] -- kvtierd ARGS...`: what systemd does for
// kvtierd's host tier (docs/OPERATIONS.md "Restarts"), for machines and
// containers without it. It runs the command as its child under a file
// descriptor store (support/fd_store.h: the child finds it in
// $NOTIFY_SOCKET and stores its host arena and journal there), and when
// the child ends other than by a stop (killed by a signal, the OOM
// killer, a non-zero exit) starts it again with the stored descriptors
// (LISTEN_FDS), so the new kvtierd adopts the host tier.
//
// - SIGTERM / SIGINT: passed to the child; supervise exits with its exit
//   status once it ends (the store, and the host tier with it, goes).
//   SIGHUP is passed on (a reload).
// - Exit status 0 of the child (it stopped by itself) ends supervise with 0;
//   2 (a bad command line or configuration: starting again would fail the
//   same way) ends it with 2.
// - Restarts wait --restart-delay-ms (default 1000), doubled after each
//   child that lived under 10 s, up to 30 s.
// Single-threaded; the child's stdout and stderr are supervise's stdout.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvtier::tools {

struct SuperviseOptions {
  std::vector<std::string> command;  // the child's argv (looked up in PATH)
  uint32_t restart_delay_ms = 1000;
  std::string notify_socket;  // empty: notify.sock in a new directory under $TMPDIR or /tmp
};

// Runs until the child is stopped (above). Returns the exit status.
int RunSupervise(const SuperviseOptions& options);

}  // namespace kvtier::tools

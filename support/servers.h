// The servers a bench or `kvtier stress` runs against, each started privately in a temporary
// directory and stopped (SIGTERM + waitpid) when its handle is destroyed:
// a kvtierd (fork + exec of the binary, never daemon/ code) and a
// redis-server on a unix socket for redis-benchmark.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "kvtier/result.h"
#include "support/fd_store.h"
#include "support/process.h"

namespace kvtier::support {

struct StartedServer {
  ChildProcess process;     // stopped by its destructor
  std::string socket_path;  // accepting connections when Start* returns
  std::string log_path;     // the server's stdout + stderr
};

// `s` as a TOML basic string, quotes and backslashes escaped (for the
// config tables a bench writes).
std::string TomlString(const std::string& s);

// Writes `dir`/kvtierd.toml (server.socket_path in `dir`,
// host.capacity_bytes = arena_bytes, host.lock_memory = "best_effort") and
// starts `kvtierd_path --config` on it; returns once a Client connects
// (Hello answered). `extra_toml` is appended to the config: more tables
// ([nvme], [engine]), never [server], [host] or [log] again. NotFound if
// the binary cannot be run; Unavailable (with the tail of the daemon's log)
// if it exits or does not answer in `timeout`.
//
// With `fd_store` (not owned; used only during the call), kvtierd is
// started as under systemd with a file descriptor store: the store is
// drained first (what an earlier kvtierd sent counts), NOTIFY_SOCKET names
// its socket and the fds it holds are passed at 3, 4, ... with LISTEN_FDS,
// LISTEN_FDNAMES and LISTEN_PID (FdStore::PrepareSpawn). Ready then also
// means, as for a Type=notify service, that a READY=1 reached the store
// (kvtierd sends it once it serves). The store is drained while waiting and
// once more after, so it holds what kvtierd sent until then; a failed Drain
// is returned (IoError), the daemon stopped. Drain the store again later to
// see what kvtierd sent after.
// `host_toml`: more keys of its [host] table ("key = value" lines).
Result<StartedServer> StartKvtierd(const std::string& kvtierd_path, const std::string& dir, uint64_t arena_bytes,
                                   std::chrono::milliseconds timeout = std::chrono::seconds(60),
                                   const std::string& extra_toml = "", FdStore* fd_store = nullptr,
                                   const std::string& host_toml = "");

// Starts `redis_server_path --port 0 --unixsocket <dir>/redis.sock --save ""
// --appendonly no --daemonize no` and returns once the socket accepts.
// Errors as StartKvtierd.
Result<StartedServer> StartRedis(const std::string& redis_server_path, const std::string& dir,
                                 std::chrono::milliseconds timeout = std::chrono::seconds(20));

}  // namespace kvtier::support

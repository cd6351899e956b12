// The servers a bench or `kvtier stress` runs against, each started privately in a temporary
// directory and stopped (SIGTERM + waitpid) when its handle is destroyed:
// a kvtierd (fork + exec of the binary, never daemon/ code) and a
// redis-server on a unix socket for redis-benchmark.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "kvtier/result.h"
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
Result<StartedServer> StartKvtierd(const std::string& kvtierd_path, const std::string& dir, uint64_t arena_bytes,
                                   std::chrono::milliseconds timeout = std::chrono::seconds(60),
                                   const std::string& extra_toml = "");

// Starts `redis_server_path --port 0 --unixsocket <dir>/redis.sock --save ""
// --appendonly no --daemonize no` and returns once the socket accepts.
// Errors as StartKvtierd.
Result<StartedServer> StartRedis(const std::string& redis_server_path, const std::string& dir,
                                 std::chrono::milliseconds timeout = std::chrono::seconds(20));

}  // namespace kvtier::support

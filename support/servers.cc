#include "support/servers.h"

#include <fstream>
#include <functional>
#include <thread>
#include <unistd.h>

#include "common/unix_socket.h"
#include "kvtier/client.h"

namespace kvtier::support {
namespace {

// Polls `ready` every 20 ms until it holds, the child exits or `timeout`
// passes.
Status WaitUntilReady(StartedServer& server, const std::string& what, const std::function<bool()>& ready,
                      std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (ready()) return Status::Ok();
    std::string how;
    if (server.process.Exited(&how)) {
      return Unavailable(what + " exited (" + how + ") before accepting connections; its log:\n" +
                         FileTail(server.log_path));
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      server.process.Stop();
      return Unavailable(what + " did not accept connections on " + server.socket_path + " within " +
                         std::to_string(timeout.count()) + " ms; its log:\n" + FileTail(server.log_path));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

bool SocketAccepts(const std::string& path) {
  auto fd = ConnectUnix(path);
  if (!fd.ok()) return false;
  ::close(*fd);
  return true;
}

}  // namespace

std::string TomlString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

Result<StartedServer> StartKvtierd(const std::string& kvtierd_path, const std::string& dir, uint64_t arena_bytes,
                                   std::chrono::milliseconds timeout, const std::string& extra_toml, FdStore* fd_store,
                                   const std::string& host_toml) {
  StartedServer server;
  server.socket_path = dir + "/kvtierd.sock";
  server.log_path = dir + "/kvtierd.log";
  const std::string config_path = dir + "/kvtierd.toml";
  {
    std::ofstream config(config_path);
    config << "# written by kvtier bench\n"
           << "[server]\nsocket_path = " << TomlString(server.socket_path) << "\n"
           << "[host]\ncapacity_bytes = " << arena_bytes << "\nlock_memory = \"best_effort\"\n"
           << host_toml << "[log]\nlevel = \"warn\"\n"
           << "[metrics]\nport = 0\n"  // any free port: never collides with a serving daemon
           << extra_toml;
    if (!config) return IoError("cannot write " + config_path);
  }
  SpawnOptions options;
  if (fd_store != nullptr) {
    // What an earlier kvtierd sent before it ended goes to this one.
    Status drained = fd_store->Drain();
    if (!drained.ok()) return drained;
    fd_store->PrepareSpawn(&options);
  }
  auto child = ChildProcess::Spawn({kvtierd_path, "--config", config_path}, server.log_path, options);
  if (!child.ok()) return child.status();
  server.process = std::move(*child);
  Status drained = Status::Ok();
  // Draining as it goes keeps the store's socket queue short (a full one
  // would block the daemon's sd_notify); a failed Drain ends the wait.
  auto drain = [&] {
    if (fd_store != nullptr && drained.ok()) drained = fd_store->Drain();
    return drained.ok();
  };
  const int readies_before = fd_store != nullptr ? fd_store->ready_count() : 0;
  auto ready = [&server, &drain, fd_store, readies_before] {
    if (!drain()) return true;
    if (fd_store != nullptr && fd_store->ready_count() == readies_before) return false;  // no READY=1 yet
    if (!SocketAccepts(server.socket_path)) return false;
    ClientOptions options;
    options.socket_path = server.socket_path;
    options.client_name = "kvtier-bench-probe";
    options.prefault_arena = false;  // a probe: the arena is not its to touch
    return Client::Connect(options).ok();
  };
  Status s = WaitUntilReady(server, "kvtierd (" + kvtierd_path + ")", ready, timeout);
  if (!s.ok()) return s;
  if (!drain()) {
    server.process.Stop();
    return drained;
  }
  return server;
}

Result<StartedServer> StartRedis(const std::string& redis_server_path, const std::string& dir,
                                 std::chrono::milliseconds timeout) {
  StartedServer server;
  server.socket_path = dir + "/redis.sock";
  server.log_path = dir + "/redis.log";
  auto child = ChildProcess::Spawn({redis_server_path, "--port", "0", "--unixsocket", server.socket_path, "--save", "",
                                    "--appendonly", "no", "--daemonize", "no"},
                                   server.log_path);
  if (!child.ok()) return child.status();
  server.process = std::move(*child);
  Status s = WaitUntilReady(
      server, "redis-server (" + redis_server_path + ")", [&server] { return SocketAccepts(server.socket_path); },
      timeout);
  if (!s.ok()) return s;
  return server;
}

}  // namespace kvtier::support

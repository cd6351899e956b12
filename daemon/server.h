// Server: the Unix-socket listener of kvtierd. Accepts connections, runs one
// Session per connection on a pool of io threads, and drains on Shutdown.
//
// Thread-safe: Shutdown and VisitCounters may be called from any thread.
#pragma once

#include <asio/io_context.hpp>
#include <asio/local/stream_protocol.hpp>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "daemon/session.h"

namespace kvtier {

struct ServerOptions {
  std::string socket_path;
  uint32_t io_threads = 2;
  uint32_t max_frame_bytes = 1u << 20;
  uint32_t drain_timeout_ms = 5000;
};

class Server {
 public:
  // Binds the socket (creating its directory; replacing a stale socket file
  // nobody listens on) and starts the io threads. `engine` and `host` are
  // borrowed and must outlive the Server. Errors: InvalidArgument (path),
  // Busy (another daemon listens there), IoError.
  static Result<std::unique_ptr<Server>> Start(const ServerOptions& options, Engine& engine,
                                               HostTier& host);
  ~Server();  // Shutdown() + Wait()

  // Stops accepting and stops reading new requests; requests already read
  // are answered. Idempotent.
  void Shutdown();
  // Blocks until every session ended, or the drain timeout after Shutdown
  // passed (then remaining connections are cut). Removes the socket file.
  void Wait();

  const std::string& socket_path() const { return options_.socket_path; }
  void VisitCounters(CounterVisitor& v) const;

 private:
  Server(const ServerOptions& options, Engine& engine, HostTier& host);
  asio::awaitable<void> AcceptLoop();
  void Forget(SessionId id);

  const ServerOptions options_;
  HostTier& host_;
  HandlerContext context_;
  SessionCounters session_counters_;
  asio::io_context io_;
  asio::local::stream_protocol::acceptor acceptor_;
  std::vector<std::thread> threads_;

  mutable std::mutex mu_;
  std::unordered_map<SessionId, std::weak_ptr<Session>> sessions_;  // guarded by mu_
  bool shutting_down_ = false;                                       // guarded by mu_
  bool waited_ = false;                                              // guarded by mu_
  SessionId next_session_ = 1;                                       // guarded by mu_
  std::atomic<int64_t> accepted_{0};
};

}  // namespace kvtier

// Server: the Unix-socket listener of kvtierd. Accepts connections and runs
// one ServerConnection per connection. Each io thread runs its own single-threaded
// io_context; connections are spread over them round robin, so a connection's
// work never hops threads (no strands, no cross-thread wake-ups).
// Drains on Shutdown.
//
// Thread-safe: Shutdown and VisitCounters may be called from any thread.
#pragma once

#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/local/stream_protocol.hpp>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "common/mutex.h"
#include "common/retry_scheduler.h"
#include "daemon/server/client_memory.h"
#include "daemon/server/parted_budget.h"
#include "daemon/server/server_connection.h"
#include "daemon/tenants/tenants.h"

namespace kvtier {

// One tenant as the server serves it: its engine and arena (and HBM pool).
// Without [[tenant]] tables the whole daemon is one, unnamed.
struct ServedTenant {
  std::string name;                    // empty without tenants
  Engine* engine = nullptr;            // borrowed; outlives the Server
  HostTier* host = nullptr;            // borrowed; outlives the Server
  const TenantScope* scope = nullptr;  // borrowed; null without tenants
  std::vector<std::string> models;     // model ids it may register; empty: any
  DevicePoolOffer device_pool;         // its HBM pool, offered at Hello (empty: none)
  // Its KV-events endpoints, told at Hello (empty: events off).
  std::string events_endpoint, events_replay_endpoint;
};

struct ServerOptions {
  std::string socket_path;
  uint32_t io_threads = 2;
  uint32_t max_frame_bytes = 1u << 20;
  uint32_t drain_timeout_ms = 5000;
  uint32_t spin_wait_us = 50;  // see RunPolling in server.cc
  // Per-connection limits and timeouts; max_connections caps the open
  // connections (one past it is answered Busy and closed at once), with
  // tenants shared among them by reserved_connections_percent
  // (PartedBudget: a tenant at its limit is refused, the others not).
  ConnectionLimits limits;
  DevicePoolOffer device_pool;
  // The running configuration as TOML, for `kvtier config get`, as the
  // tenant named sees it (empty: all of it, for the operator or a daemon
  // without tenants); may be empty.
  std::function<std::string(const std::string& tenant)> running_config;
  uint32_t socket_mode = 0660;  // permission bits of the socket file
  std::string socket_group;     // group name or numeric gid; empty: the daemon's egid
  // The clock of the accept backoff, borrowed (outlives the Server); null:
  // the process's steady clock.
  const Clock* clock = nullptr;
  // With tenants: the counters of the tiers they share, visited once by an
  // operator's Stats (each tenant's engine reports its own use of them).
  std::function<void(CounterVisitor&)> visit_shared_counters;
  // Counters of the daemon's other services (the peer server), added to
  // the server's own wherever they are visited (every Stats answer,
  // Prometheus); may be empty. Callable from any thread while the Server
  // runs.
  std::function<void(CounterVisitor&)> visit_daemon_counters;
  // A listening socket to serve on instead of binding one: a takeover's or
  // systemd's file descriptor store's (takeover.h). Start takes it: it is
  // used when it is a listening Unix stream socket bound to socket_path
  // (connections queued on it meanwhile are served), else closed, and a
  // fresh socket bound. -1: none.
  int listen_fd = -1;
};

class Server {
 public:
  // Binds the socket (creating its directory; replacing a stale socket file
  // nobody listens on) and starts the io threads. `engine` and `host` are
  // borrowed and must outlive the Server. Errors: InvalidArgument (path,
  // unknown socket_group), Busy (another daemon listens there), IoError.
  //
  // Permissions: a missing socket directory is created with mode 0750 and
  // given to socket_group; the socket is bound under a umask that leaves at
  // most socket_mode (the process umask is changed only around bind(2), so
  // there is no moment the socket is more open than configured), then given
  // to socket_group before it listens.
  static Result<std::unique_ptr<Server>> Start(const ServerOptions& options, Engine& engine, HostTier& host);
  // The same for a daemon with tenants: `table` maps each caller (its
  // SO_PEERCRED credentials, read at accept) to one of `tenants` (in the
  // table's order) or to the operator's view; a caller it refuses is
  // answered with that refusal (PermissionDenied) in one frame and closed
  // at accept, before it holds a connection slot
  // (server.connections_refused). An operator's connection may run
  // admin requests only, over every tenant. With an empty table there must
  // be exactly one tenant, serving every caller the socket admits.
  static Result<std::unique_ptr<Server>> Start(const ServerOptions& options, std::vector<ServedTenant> tenants,
                                               TenantTable table);
  ~Server();  // Shutdown() + Wait()

  // Stops accepting and stops reading new requests; requests already read
  // are answered. Idempotent.
  void Shutdown() EXCLUDES(mu_);
  // Blocks until every connection ended, or the drain timeout after Shutdown
  // passed (then remaining connections are cut). Removes the socket file
  // (but see KeepSocketFile).
  void Wait() EXCLUDES(mu_);

  // A duplicate of the listening socket, the caller's (for a takeover or
  // systemd's file descriptor store); -1 (errno set) when dup fails. Call
  // before Shutdown.
  int DupListener();
  // Whether Wait leaves the socket file in place: true while another
  // process serves, or will serve, the socket (a takeover, a socket kept in
  // a file descriptor store) or serves it still (a passed listener until
  // this daemon took it over for good); then false. Initially: a bound
  // socket false, a passed one true.
  void KeepSocketFile(bool keep) EXCLUDES(mu_);

  // The watchdog's health probe. True when every io thread has run the
  // probe posted by the previous call (the first call: true); then posts a
  // new one to each. Never blocks. An io thread stuck in a request (a
  // wedged engine lock, a blocking call) fails the next call. Call from one
  // thread at a time, before Shutdown.
  bool IoThreadsAnswered();

  const std::string& socket_path() const { return options_.socket_path; }
  void VisitCounters(CounterVisitor& v) const;

 private:
  Server(const ServerOptions& options, std::vector<ServedTenant> tenants, TenantTable table);
  asio::awaitable<void> AcceptLoop();
  // After a failed accept: logs it (rate-limited) and waits, doubling the
  // wait per consecutive failure from 1 ms to 1 s, so running out of
  // descriptors (EMFILE, ENFILE) does not spin a core while connections
  // already open keep being served. The wait is a job on accept_backoff_
  // (the injected clock) that wakes the loop; Shutdown ends it at once.
  asio::awaitable<void> BackOffAfter(const asio::error_code& error, uint32_t consecutive_failures);
  // Who a new connection is: the context it is served with, and the party
  // (PartedBudget) whose slot it takes: the tenant's index, the
  // operator's tenants_.size(); 0 without tenants.
  struct Admission {
    const HandlerContext* context;
    size_t party;
  };
  struct OpenConnection {
    std::weak_ptr<ServerConnection> connection;
    size_t party;
  };
  // Answers a connection `party` has no slot for with Busy and closes it.
  void RefuseOverLimit(asio::local::stream_protocol::socket socket, size_t party) EXCLUDES(mu_);
  // Sends `why` as one error frame (best effort: never blocks, a full
  // buffer drops it) and closes `socket`.
  void Refuse(asio::local::stream_protocol::socket socket, const Status& why);
  // Logs a line a peer can trigger (a refusal), rate-limited.
  void LogPeerTriggered(const std::string& line);
  // Who the caller of a new connection on `fd` is; PermissionDenied (or
  // IoError without peer credentials) for a caller that is no one's.
  Result<Admission> ContextFor(int fd);
  void Forget(ConnectionId id) EXCLUDES(mu_);

  const ServerOptions options_;
  const std::vector<ServedTenant> tenants_;
  const TenantTable table_;
  // One per tenant (by index), and the operator's (no engine, every tenant).
  // Connections borrow them.
  std::vector<std::unique_ptr<HandlerContext>> tenant_contexts_;
  HandlerContext operator_context_;
  FrameBudget frame_budget_;
  // What connections' state holds, per tenant and in total (parties as
  // in slots_).
  ClientMemory client_memory_;
  ConnectionCounters connection_counters_;
  // One io_context per io thread; contexts_[0] also runs the acceptor.
  std::vector<std::unique_ptr<asio::io_context>> contexts_;
  asio::local::stream_protocol::acceptor acceptor_;
  const SystemClock system_clock_;  // options_.clock when that is null
  // The accept loop's one wait at a time: stopped by Shutdown, gone before contexts_.
  std::unique_ptr<RetryScheduler> accept_backoff_;
  // One per context; each is reset on its own context at Shutdown.
  std::vector<asio::executor_work_guard<asio::io_context::executor_type>> guards_;
  std::vector<std::thread> threads_;
  size_t next_context_ = 0;  // only touched by the accept loop

  mutable Mutex mu_;
  std::unordered_map<ConnectionId, OpenConnection> connections_ GUARDED_BY(mu_);
  PartedBudget slots_ GUARDED_BY(mu_);  // connections
  bool shutting_down_ GUARDED_BY(mu_) = false;
  bool waited_ GUARDED_BY(mu_) = false;
  bool keep_socket_file_ GUARDED_BY(mu_) = false;  // KeepSocketFile
  ConnectionId next_connection_ GUARDED_BY(mu_) = 1;
  std::atomic<int64_t> accepted_{0};
  std::atomic<int64_t> refused_{0};
  std::atomic<int64_t> over_limit_{0};     // refused: server.max_connections open
  std::atomic<int64_t> accept_errors_{0};  // accept(2) failures (EMFILE, ENFILE, ...)
  LogRateLimiter accept_log_limiter_{5, std::chrono::seconds(10)};
  // IoThreadsAnswered: the last probe each context ran, and the last posted.
  std::vector<std::atomic<uint64_t>> probe_answered_;
  uint64_t probe_posted_ = 0;  // only touched by IoThreadsAnswered's caller
};

}  // namespace kvtier

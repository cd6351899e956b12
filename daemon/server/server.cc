#include "daemon/server/server.h"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/post.hpp>
#include <asio/redirect_error.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <cerrno>
#include <cstddef>
#include <fcntl.h>
#include <charconv>
#include <cstdio>
#include <sched.h>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <future>
#include <grp.h>
#include <string>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <system_error>
#include <vector>
#include <unistd.h>

#include "common/framing.h"
#include "common/logging.h"
#include "common/unix_socket.h"
#include "proto/wire.h"

namespace kvtier {
namespace {

// The gid named by server.socket_group: a group name or a number; empty:
// the daemon's effective gid. InvalidArgument for an unknown name.
Result<gid_t> ResolveGroup(const std::string& group) {
  if (group.empty()) return ::getegid();
  gid_t gid = 0;
  auto [end, ec] = std::from_chars(group.data(), group.data() + group.size(), gid);
  if (ec == std::errc() && end == group.data() + group.size()) return gid;
  std::vector<char> buffer(16384);
  struct group entry {};
  struct group* found = nullptr;
  const int error = ::getgrnam_r(group.c_str(), &entry, buffer.data(), buffer.size(), &found);
  if (found == nullptr) {
    return InvalidArgument("server.socket_group: no group named '" + group + "'" +
                           (error != 0 ? std::string(" (") + std::strerror(error) + ")" : std::string()));
  }
  return found->gr_gid;
}

// Creates the socket's directory when missing: its parents as usual, the
// directory itself with mode 0750 and group `gid`, so only the group can
// reach the socket. An existing directory is left as it is (systemd's
// RuntimeDirectory= sets its mode and owner).
Status PrepareSocketDirectory(const std::filesystem::path& dir, gid_t gid) {
  if (dir.empty()) return Status::Ok();
  std::error_code ec;
  if (std::filesystem::exists(dir, ec)) return Status::Ok();
  if (dir.has_parent_path()) std::filesystem::create_directories(dir.parent_path(), ec);
  if (ec || (::mkdir(dir.c_str(), 0750) != 0 && errno != EEXIST)) {
    return IoError("cannot create " + dir.string() + ": " + (ec ? ec.message() : std::strerror(errno)) +
                   " (set server.socket_path to a writable place)");
  }
  // mkdir's mode passed through the umask: set it exactly.
  if (::chmod(dir.c_str(), 0750) != 0 || ::chown(dir.c_str(), static_cast<uid_t>(-1), gid) != 0) {
    return IoError("cannot set mode 0750 and group " + std::to_string(gid) + " on " + dir.string() + ": " +
                   std::strerror(errno));
  }
  return Status::Ok();
}

// Prepares `path` for bind: creates the directory, removes a stale socket.
// True when `fd` is a listening Unix stream socket bound to `path`, and a
// socket file is there (systemd may have removed the runtime directory).
bool ListensAt(int fd, const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) return false;
  int value = 0;
  socklen_t length = sizeof(value);
  if (::getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &value, &length) != 0 || value != AF_UNIX) return false;
  length = sizeof(value);
  if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &value, &length) != 0 || value != SOCK_STREAM) return false;
  length = sizeof(value);
  if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &value, &length) != 0 || value != 1) return false;
  sockaddr_un address{};
  length = sizeof(address);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) return false;
  const size_t offset = offsetof(sockaddr_un, sun_path);
  if (length <= offset) return false;
  return std::string(address.sun_path, strnlen(address.sun_path, length - offset)) == path;
}

Status PrepareSocketPath(const std::string& path, gid_t gid) {
  Status dir = PrepareSocketDirectory(std::filesystem::path(path).parent_path(), gid);
  if (!dir.ok()) return dir;
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return Status::Ok();
  if (!S_ISSOCK(st.st_mode)) return InvalidArgument(path + " exists and is not a socket");
  Result<int> probe = ConnectUnix(path);
  if (probe.ok()) {
    ::close(*probe);
    return Busy("another kvtierd is already listening at " + path);
  }
  if (::unlink(path.c_str()) != 0) return IoError("cannot remove stale socket " + path + ": " + std::strerror(errno));
  return Status::Ok();
}

}  // namespace

namespace {

std::string ToOctal(uint32_t mode) {
  char buffer[16];
  std::snprintf(buffer, sizeof(buffer), "%o", mode);
  return buffer;
}

std::vector<std::unique_ptr<asio::io_context>> MakeContexts(uint32_t count) {
  std::vector<std::unique_ptr<asio::io_context>> contexts;
  for (uint32_t i = 0; i < std::max<uint32_t>(count, 1); ++i) {
    contexts.push_back(std::make_unique<asio::io_context>(1));  // one thread each
    // The context makes its reactor's descriptors (epoll, eventfd, timerfd)
    // now. asio would make them for the first socket on the context, which
    // for every context but the acceptor's is a connection being accepted:
    // a descriptor limit reached then threw from the io thread and ended
    // the daemon. Made here, it is an error of Start. A socket object,
    // never opened, is what makes them.
    asio::local::stream_protocol::socket reactor_maker(*contexts.back());
  }
  return contexts;
}

// Runs `io` until it stops. When it runs out of handlers it may keep
// polling for up to `spin_us` (yielding the core between polls) before it
// blocks in epoll, so a request that arrives meanwhile is served without
// the sleep and wake-up of this thread, most of a small request's latency
// on a VM. It polls only while requests have recently come back within the
// budget (moving average of idle gaps): for sparse or slow clients (a
// client copying megabytes between requests) spinning buys nothing and
// takes the memory bandwidth and core the client needs.
void RunPolling(asio::io_context& io, uint32_t spin_us) {
  using Clock = std::chrono::steady_clock;
  double gap_ewma_us = 0;
  while (!io.stopped()) {
    if (io.poll() > 0) continue;
    const auto idle_since = Clock::now();
    const bool spin = spin_us > 0 && gap_ewma_us < static_cast<double>(spin_us);
    size_t ran = 0;
    while (spin && Clock::now() - idle_since < std::chrono::microseconds(spin_us)) {
      if ((ran = io.poll()) > 0) break;
      sched_yield();
    }
    if (ran == 0 && io.run_one() == 0) break;  // stopped: no work left
    const double gap_us = std::chrono::duration<double, std::micro>(Clock::now() - idle_since).count();
    gap_ewma_us = 0.875 * gap_ewma_us + 0.125 * gap_us;
  }
}

}  // namespace

Server::Server(const ServerOptions& options, std::vector<ServedTenant> tenants, TenantTable table)
    : options_(options),
      tenants_(std::move(tenants)),
      table_(std::move(table)),
      frame_budget_(options.limits.partial_frame_bytes),
      client_memory_(options.limits.client_memory_bytes, table_.empty() ? 1 : tenants_.size() + 1,
                     options.limits.reserved_client_memory_percent),

      contexts_(MakeContexts(options.io_threads)),
      acceptor_(*contexts_[0]),
      accept_backoff_(std::make_unique<RetryScheduler>("server.accept_backoff",
                                                       options.clock != nullptr ? *options.clock : system_clock_, 1)),
      slots_(options.limits.max_connections, table_.empty() ? 1 : tenants_.size() + 1,
             options.limits.reserved_connections_percent),
      probe_answered_(contexts_.size()) {
  connection_counters_.frame_budget = &frame_budget_;
  connection_counters_.client_memory = &client_memory_;
  const auto common = [this](HandlerContext& context) {
    context.max_frame_bytes = options_.max_frame_bytes;
    context.limits = options_.limits;
    context.visit_server_counters = [this](CounterVisitor& v) { VisitCounters(v); };
    context.running_config = options_.running_config;
  };
  for (const ServedTenant& tenant : tenants_) {
    auto context = std::make_unique<HandlerContext>();
    common(*context);
    context->engine = tenant.engine;
    context->tenant = tenant.name;
    context->scope = tenant.scope;
    context->models = tenant.models;
    context->arena_bytes = tenant.host->capacity_bytes();
    context->arena_allocated_bytes = [host = tenant.host] { return host->allocated_bytes(); };
    if (context->limits.max_reserved_bytes == 0) {
      context->limits.max_reserved_bytes = AutoMaxReservedBytes(context->arena_bytes);
    }
    context->arena_fd = tenant.host->memfd();
    if (tenant.host->directory() != nullptr) {
      context->directory_fd = tenant.host->directory()->fd();
      context->directory_bytes = tenant.host->directory()->bytes();
    }
    context->device_pool = tenant.device_pool;
    context->events_endpoint = tenant.events_endpoint;
    context->events_replay_endpoint = tenant.events_replay_endpoint;
    tenant_contexts_.push_back(std::move(context));
    operator_context_.operator_view.push_back(TenantView{tenant.name, tenant.engine, tenant.scope});
  }
  common(operator_context_);
  operator_context_.visit_shared_counters = options_.visit_shared_counters;
}

Result<std::unique_ptr<Server>> Server::Start(const ServerOptions& options, Engine& engine, HostTier& host) {
  ServedTenant whole{"", &engine, &host, nullptr, {}, options.device_pool};
  return Start(options, {whole}, TenantTable({}, ::geteuid()));
}

Result<std::unique_ptr<Server>> Server::Start(const ServerOptions& options, std::vector<ServedTenant> tenants,
                                              TenantTable table) {
  if (options.io_threads == 0) return InvalidArgument("server.io_threads must be at least 1");
  if (tenants.empty() || (table.empty() && tenants.size() != 1) ||
      (!table.empty() && tenants.size() != table.tenants().size())) {
    return InvalidArgument("the server needs one engine per tenant (or one without tenants)");
  }
  // The passed listener, when there is one: ours from here on.
  int passed = options.listen_fd;
  if (passed >= 0 && !ListensAt(passed, options.socket_path)) {
    spdlog::warn("the passed listening socket is not one listening at {}; binding a fresh one", options.socket_path);
    ::close(std::exchange(passed, -1));
  }
  auto gid = ResolveGroup(options.socket_group);
  Status prepared = gid.ok() ? Status::Ok() : gid.status();
  if (prepared.ok() && passed < 0) prepared = PrepareSocketPath(options.socket_path, *gid);
  if (!prepared.ok()) {
    if (passed >= 0) ::close(passed);
    return prepared;
  }
  std::unique_ptr<Server> server;
  try {
    server.reset(new Server(options, std::move(tenants), std::move(table)));
  } catch (const std::system_error& e) {  // an io context's descriptors (MakeContexts)
    if (passed >= 0) ::close(passed);
    return IoError(std::string("cannot start the server's io threads: ") + e.what());
  }
  asio::error_code ec;
  asio::local::stream_protocol::endpoint endpoint(options.socket_path);
  if (passed >= 0) {
    server->acceptor_.assign(endpoint.protocol(), passed, ec);
    if (ec) {
      ::close(passed);
      return IoError("cannot serve on the passed listening socket: " + ec.message());
    }
    spdlog::info("serving on the passed listening socket at {}", options.socket_path);
    MutexLock lock(server->mu_);
    server->keep_socket_file_ = true;  // another process may serve it still
  } else {
    server->acceptor_.open(endpoint.protocol(), ec);
  }
  if (!ec && passed < 0) {
    // bind(2) creates the socket file with 0777 less the umask: with this
    // umask it is born with at most socket_mode. The umask is per process,
    // so files other threads create meanwhile are at most as open, never more.
    const mode_t previous_umask = ::umask(static_cast<mode_t>(~options.socket_mode & 0777));
    server->acceptor_.bind(endpoint, ec);
    ::umask(previous_umask);
  }
  if (ec) return IoError("cannot listen on " + options.socket_path + ": " + ec.message());
  if (::chown(options.socket_path.c_str(), static_cast<uid_t>(-1), *gid) != 0 ||
      ::chmod(options.socket_path.c_str(), static_cast<mode_t>(options.socket_mode)) != 0) {
    const int error = errno;
    if (passed < 0) ::unlink(options.socket_path.c_str());  // a passed one's file is not ours to remove
    return IoError("cannot give " + options.socket_path + " group " + std::to_string(*gid) + " and mode 0" +
                   ToOctal(options.socket_mode) + ": " + std::strerror(error));
  }
  server->acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return IoError("cannot listen on " + options.socket_path + ": " + ec.message());
  asio::co_spawn(*server->contexts_[0], server->AcceptLoop(), asio::detached);
  for (auto& context : server->contexts_) {
    // The guard keeps an idle context running until Shutdown releases it.
    server->guards_.emplace_back(context->get_executor());
    server->threads_.emplace_back([io = context.get(), spin_us = options.spin_wait_us] { RunPolling(*io, spin_us); });
  }
  return server;
}

Server::~Server() {
  Shutdown();
  Wait();
}

asio::awaitable<void> Server::AcceptLoop() {
  uint32_t failures = 0;
  for (;;) {
    asio::error_code ec;
    asio::io_context& target = *contexts_[next_context_++ % contexts_.size()];
    auto socket = co_await acceptor_.async_accept(target, asio::redirect_error(asio::use_awaitable, ec));
    if (ec) {
      if (ec == asio::error::operation_aborted || !acceptor_.is_open()) co_return;
      co_await BackOffAfter(ec, ++failures);
      continue;
    }
    failures = 0;
    Result<Admission> admission = ContextFor(socket.native_handle());
    if (!admission.ok()) {  // no one's: answered and closed before it holds a slot
      refused_.fetch_add(1, std::memory_order_relaxed);
      LogPeerTriggered("refused a connection: " + admission.status().message());
      Refuse(std::move(socket), admission.status());
      continue;
    }
    std::shared_ptr<ServerConnection> connection;
    {
      MutexLock lock(mu_);
      if (shutting_down_) co_return;
      if (slots_.TryTake(admission->party, 1)) {
        ConnectionId id = next_connection_++;
        connection = std::make_shared<ServerConnection>(std::move(socket), id, *admission->context,
                                                        connection_counters_, admission->party);
        connections_.emplace(id, OpenConnection{connection, admission->party});
      }
    }
    if (connection == nullptr) {  // no slot for its caller: refused after the lock (a send and a close)
      RefuseOverLimit(std::move(socket), admission->party);
      continue;
    }
    accepted_.fetch_add(1, std::memory_order_relaxed);
    asio::co_spawn(
        connection->executor(),
        [this, connection]() -> asio::awaitable<void> {
          co_await connection->Run();
          Forget(connection->id());
        },
        asio::detached);
  }
}

asio::awaitable<void> Server::BackOffAfter(const asio::error_code& error, uint32_t consecutive_failures) {
  accept_errors_.fetch_add(1, std::memory_order_relaxed);
  const auto wait = std::chrono::milliseconds(int64_t{1} << std::min<uint32_t>(consecutive_failures - 1, 10));
  uint64_t suppressed = 0;
  if (accept_log_limiter_.Allow(suppressed)) {
    spdlog::warn("accept failed: {}; waiting {} ms before the next accept{} (connections open stay served)",
                 error.message(), wait.count(),
                 suppressed > 0 ? " (" + std::to_string(suppressed) + " similar lines suppressed)" : std::string());
  }
  // A timer that only the backoff's job ends (cancels), on this loop's own
  // thread, so it cannot end before the loop waits on it. Refused (Shutdown
  // began): no wait, the loop finds the acceptor closed.
  auto woken = std::make_shared<asio::steady_timer>(acceptor_.get_executor(), asio::steady_timer::time_point::max());
  const uint64_t wait_us = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(wait).count());
  if (!accept_backoff_->RunAfter(wait_us,
                                 [woken] { asio::post(woken->get_executor(), [woken] { woken->cancel(); }); })) {
    co_return;
  }
  asio::error_code ignored;
  co_await woken->async_wait(asio::redirect_error(asio::use_awaitable, ignored));
}

void Server::RefuseOverLimit(asio::local::stream_protocol::socket socket, size_t party) {
  over_limit_.fetch_add(1, std::memory_order_relaxed);
  const std::string max = std::to_string(options_.limits.max_connections);
  std::string why = "kvtierd serves server.max_connections (" + max + ") connections already";
  if (!table_.empty()) {
    const std::string who = party < tenants_.size() ? "tenant " + tenants_[party].name : "the operator";
    uint64_t part = 0;
    {
      MutexLock lock(mu_);
      part = slots_.part();
    }
    why = who + " holds its part (" + std::to_string(part) + ", server.reserved_connections_percent) of " +
          "server.max_connections (" + max + ") and no shared slot is free";
  }
  LogPeerTriggered("refused a connection: " + why);
  Refuse(std::move(socket), Busy(why + "; try again later"));
}

void Server::Refuse(asio::local::stream_protocol::socket socket, const Status& why) {
  v1::Response response;
  wire::ToProto(why, response.mutable_status());
  std::string frame(kFrameHeaderBytes + response.ByteSizeLong(), '\0');
  EncodeFrameHeader(static_cast<uint32_t>(frame.size() - kFrameHeaderBytes), reinterpret_cast<uint8_t*>(frame.data()));
  response.SerializeToArray(frame.data() + kFrameHeaderBytes, static_cast<int>(frame.size() - kFrameHeaderBytes));
  // Best effort, never blocking: a fresh socket's buffer takes a small frame.
  [[maybe_unused]] ssize_t sent =
      ::send(socket.native_handle(), frame.data(), frame.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  asio::error_code ignored;
  socket.close(ignored);
}

void Server::LogPeerTriggered(const std::string& line) {
  uint64_t suppressed = 0;
  if (!accept_log_limiter_.Allow(suppressed)) return;
  spdlog::warn("{}{}", line,
               suppressed > 0 ? " (" + std::to_string(suppressed) + " similar lines suppressed)" : std::string());
}

Result<Server::Admission> Server::ContextFor(int fd) {
  if (table_.empty()) return Admission{tenant_contexts_[0].get(), 0};
  Result<PeerCredentials> peer = ReadPeerCredentials(fd);
  Result<Caller> caller = peer.ok() ? table_.Resolve(*peer) : Result<Caller>(peer.status());
  if (!caller.ok()) return caller.status();
  if (caller->tenant == Caller::kNoTenant) return Admission{&operator_context_, tenants_.size()};
  return Admission{tenant_contexts_[caller->tenant].get(), caller->tenant};
}

bool Server::IoThreadsAnswered() {
  bool answered = true;
  for (const auto& last : probe_answered_) answered &= last.load(std::memory_order_acquire) == probe_posted_;
  const uint64_t probe = ++probe_posted_;
  for (size_t i = 0; i < contexts_.size(); ++i) {
    asio::post(*contexts_[i], [this, i, probe] { probe_answered_[i].store(probe, std::memory_order_release); });
  }
  return answered;
}

void Server::Forget(ConnectionId id) {
  MutexLock lock(mu_);
  auto it = connections_.find(id);
  if (it == connections_.end()) return;
  slots_.Give(it->second.party, 1);
  connections_.erase(it);
}

void Server::Shutdown() {
  std::vector<std::shared_ptr<ServerConnection>> live;
  {
    MutexLock lock(mu_);
    if (shutting_down_) return;
    shutting_down_ = true;
    for (auto& [id, open] : connections_) {
      if (auto s = open.connection.lock()) live.push_back(std::move(s));
    }
  }
  asio::post(*contexts_[0], [this] {
    asio::error_code ignored;
    acceptor_.close(ignored);
  });
  accept_backoff_->Stop();  // a backoff waiting now ends (after the close above)
  for (auto& s : live) s->StopReading();
  // Posted last: each context ends once its connections (and the acceptor) end.
  for (size_t i = 0; i < contexts_.size(); ++i) {
    asio::post(*contexts_[i], [this, i] { guards_[i].reset(); });
  }
}

int Server::DupListener() { return ::fcntl(acceptor_.native_handle(), F_DUPFD_CLOEXEC, 0); }

void Server::KeepSocketFile(bool keep) {
  MutexLock lock(mu_);
  keep_socket_file_ = keep;
}

void Server::Wait() {
  {
    MutexLock lock(mu_);
    if (waited_) return;
    waited_ = true;
  }
  // io_.run() returns in every thread once the acceptor and all connections are
  // gone; cut the rest when the drain timeout passes.
  std::promise<void> drained;
  auto done = drained.get_future();
  std::thread joiner([this, &drained] {
    for (auto& t : threads_) t.join();
    drained.set_value();
  });
  if (done.wait_for(std::chrono::milliseconds(options_.drain_timeout_ms)) != std::future_status::ready) {
    spdlog::warn("drain timeout of {} ms passed; closing remaining connections", options_.drain_timeout_ms);
    for (auto& context : contexts_) context->stop();
  }
  joiner.join();
  // Promotions finishing now post to these (stopped) executors: let them
  // all land before the executors can be destroyed.
  for (const ServedTenant& tenant : tenants_) tenant.engine->WaitForIdle();
  MutexLock lock(mu_);
  if (!keep_socket_file_) ::unlink(options_.socket_path.c_str());
}

void Server::VisitCounters(CounterVisitor& v) const {
  const auto load = [](const std::atomic<int64_t>& c) { return c.load(std::memory_order_relaxed); };
  v.Visit("server.connections_accepted", load(accepted_));
  v.Visit("server.connections_refused", load(refused_));
  {
    MutexLock lock(mu_);
    v.VisitGauge("server.connections_open", static_cast<int64_t>(connections_.size()));
  }
  v.Visit("server.requests", load(connection_counters_.requests));
  v.Visit("server.oversized_frames", load(connection_counters_.oversized_frames));
  v.Visit("server.truncated_frames", load(connection_counters_.truncated_frames));
  v.Visit("server.unparsable_frames", load(connection_counters_.unparsable_frames));
  v.Visit("server.connections_over_limit", load(over_limit_));
  v.Visit("server.accept_errors", load(accept_errors_));
  v.Visit("server.frame_timeouts", load(connection_counters_.frame_timeouts));
  v.Visit("server.idle_closed", load(connection_counters_.idle_closed));
  v.Visit("server.first_request_timeouts", load(connection_counters_.first_request_timeouts));
  v.Visit("server.frame_memory_refused", load(connection_counters_.frame_memory_refused));
  v.Visit("server.reservations_expired", load(connection_counters_.reservations_expired));
  v.VisitGauge("server.partial_frame_bytes", static_cast<int64_t>(frame_budget_.used_bytes()));
  v.VisitGauge("server.client_memory_bytes", static_cast<int64_t>(client_memory_.used()));
  v.Visit("server.client_memory_refusals", client_memory_.refusals());
  if (options_.visit_daemon_counters) options_.visit_daemon_counters(v);
}

}  // namespace kvtier

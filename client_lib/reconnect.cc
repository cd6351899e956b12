#include "client_lib/reconnect.h"

#include <algorithm>
#include <string>
#include <utility>

namespace kvtier::internal {

Reconnector::Reconnector(const ClientOptions& options, std::shared_ptr<Connection> first)
    : Reconnector(options, std::move(first), system_clock_) {}

Reconnector::Reconnector(const ClientOptions& options, std::shared_ptr<Connection> first, const Clock& clock)
    : clock_(clock),
      options_(options),
      namespaces_(first->namespaces()),
      conn_(std::move(first)),
      jitter_(static_cast<std::minstd_rand::result_type>(std::chrono::steady_clock::now().time_since_epoch().count())) {
}  // a seed, not a time

std::shared_ptr<Connection> Reconnector::Peek() const {
  MutexLock lock(mu_);
  return conn_;
}

std::shared_ptr<Connection> Reconnector::Current() {
  std::shared_ptr<Connection> conn = Peek();
  if (!options_.reconnect || conn->Alive()) return conn;
  // Failed by this client while the daemon still holds the socket: stays failed.
  if (!conn->PeerClosed()) return conn;
  {
    MutexLock lock(mu_);
    if (conn_ != conn) return conn_;  // another thread reconnected meanwhile
    if (attempting_ || clock_.NowUs() < next_attempt_us_) return conn;
    attempting_ = true;
  }
  // Whatever still waits on the old daemon ends now, and nothing is sent
  // on its socket any more (its deferred releases are dropped).
  conn->Abandon(Unavailable("kvtierd closed the connection; the client reconnects"));
  Result<std::shared_ptr<Connection>> fresh = Reopen();
  MutexLock lock(mu_);
  attempting_ = false;
  if (!fresh.ok()) {
    ++failures_;
    next_attempt_us_ = clock_.NowUs() + BackoffUs();
    return conn;  // its calls fail at once with Unavailable
  }
  failures_ = 0;
  next_attempt_us_ = 0;
  conn_ = *fresh;
  reconnects_.fetch_add(1, std::memory_order_relaxed);
  return conn_;  // `conn` (the old one) goes once its handles are gone, after the lock
}

Result<std::shared_ptr<Connection>> Reconnector::Reopen() const {
  auto fresh = Connection::Open(options_);
  if (!fresh.ok()) return fresh.status();
  if ((*fresh)->namespaces() != namespaces_) {
    // Not the namespaces the caller's NamespaceIds name: never used.
    return FailedPrecondition("kvtierd registered the namespaces differently after the reconnect");
  }
  return fresh;
}

uint64_t Reconnector::BackoffUs() {
  const int64_t min_ms = std::max<int64_t>(options_.reconnect_min_backoff.count(), 1);
  const int64_t max_ms = std::max<int64_t>(options_.reconnect_max_backoff.count(), min_ms);
  int64_t wait_ms = min_ms;
  for (uint32_t i = 1; i < failures_ && wait_ms < max_ms; ++i) wait_ms *= 2;
  wait_ms = std::min(wait_ms, max_ms);
  std::uniform_int_distribution<int64_t> draw(wait_ms / 2, wait_ms);
  return static_cast<uint64_t>(draw(jitter_)) * 1000;
}

}  // namespace kvtier::internal

// internal::Reconnector: the Client's current Connection, replaced by a new
// one after kvtierd hung up (ClientOptions::reconnect). Internal.
//
// Lazy, no thread of its own: a call asks Current() for its connection.
// While the connection is alive (Connection::Alive) that is all. Once it
// failed and the daemon closed its end (it exited or restarted), the first
// call whose backoff has passed makes one attempt on its own thread
// (Connection::Open: Hello, the same namespaces in the same order, the new
// arena and directory; bounded by connect_timeout); calls meanwhile, and
// calls while another thread attempts, get the dead connection, which fails
// them at once with Unavailable. A failed attempt backs off exponentially
// from reconnect_min_backoff to reconnect_max_backoff, with jitter (each
// wait is drawn from [d/2, d]), on the injected Clock (the process's steady
// clock unless a test passes its own). A connection this client failed itself (a
// call timed out) while the daemon still holds the socket stays failed, as
// without reconnect: the daemon is there, just not answering, and it still
// holds that socket's pins.
//
// The old Connection is abandoned (failed), never reused: BlockViews,
// Reservations and loads taken on it keep it, so its arena stays mapped
// while they live, and their operations fail on it (Unavailable) instead
// of reaching the new daemon with the old daemon's leases.
//
// Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "client_lib/connection.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "kvtier/client.h"

namespace kvtier::internal {

class Reconnector {
 public:
  // `first` is the connection Client::Connect opened with `options`.
  // Backoffs are on the process's steady clock.
  Reconnector(const ClientOptions& options, std::shared_ptr<Connection> first);
  // The same with backoffs on `clock`, borrowed: it outlives the Reconnector.
  Reconnector(const ClientOptions& options, std::shared_ptr<Connection> first, const Clock& clock);

  // The connection a call uses now; may reconnect first (see above), so it
  // may take up to connect_timeout. Never null.
  std::shared_ptr<Connection> Current() EXCLUDES(mu_);
  // The current connection without any reconnect attempt. Never null.
  std::shared_ptr<Connection> Peek() const EXCLUDES(mu_);
  // Successful reconnects so far.
  uint64_t reconnects() const { return reconnects_.load(std::memory_order_relaxed); }
  // The namespaces registered at Connect (the same after every reconnect).
  const std::vector<NamespaceFingerprint>& namespaces() const { return namespaces_; }

 private:
  // Opens a connection and checks it registered the same namespaces.
  Result<std::shared_ptr<Connection>> Reopen() const;
  // The wait before the next attempt after `failures_` failed ones (>= 1).
  uint64_t BackoffUs() REQUIRES(mu_);

  const SystemClock system_clock_;
  const Clock& clock_;  // system_clock_ or the caller's
  const ClientOptions options_;
  const std::vector<NamespaceFingerprint> namespaces_;
  mutable Mutex mu_;
  std::shared_ptr<Connection> conn_ GUARDED_BY(mu_);
  bool attempting_ GUARDED_BY(mu_) = false;       // a thread is in Reopen
  uint32_t failures_ GUARDED_BY(mu_) = 0;         // failed attempts in a row
  uint64_t next_attempt_us_ GUARDED_BY(mu_) = 0;  // on clock_
  std::minstd_rand jitter_ GUARDED_BY(mu_);
  std::atomic<uint64_t> reconnects_{0};
};

}  // namespace kvtier::internal

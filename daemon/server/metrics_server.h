// MetricsServer: kvtierd's HTTP endpoint for Prometheus (and for people
// with curl). Plain HTTP/1.1 on Asio, the library the daemon already
// serves its socket with (docs/INTERNALS.md says why not another one):
//   GET /metrics  the registry in the Prometheus text format (version 0.0.4)
//   GET /healthz  "ok" (the process answers; `kvtier health` asks more)
// anything else 404, a method other than GET/HEAD 405, a request head over
// 8 KiB 431, one not sent within 5 s is dropped. One request per
// connection (Connection: close); at most 32 connections at once: a new
// one past them closes the oldest that has not sent its request yet (so
// idle connections cannot keep scrapes out), or itself when all 32 are
// being answered. An accept that fails (out of descriptors) pauses the
// listener 100 ms of MetricsOptions::clock before the next. Bound to an
// address (127.0.0.1 by default, so it is not exposed beyond the node
// unless configured).
//
// Who sees what (metrics_scope.h): with a bearer token, a GET or HEAD of
// /metrics without `Authorization: Bearer <token>` (compared in constant
// time) is answered 401 and one with it sees every series; without a token
// every scrape sees `open_view`. /healthz and / need no token.
//
// Thread-safety: one thread of its own runs every connection; `render` is
// called on it and must be thread-safe against the daemon's other work.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "common/clock.h"
#include "daemon/server/metrics_scope.h"
#include "kvtier/result.h"

namespace kvtier {

struct MetricsOptions {
  std::string address = "127.0.0.1";
  uint16_t port = 0;  // 0: any free port (port() says which)
  // Non-empty: every scrape must present it (metrics.bearer_token_file).
  std::string bearer_token;
  // What a scrape sees when there is no token.
  MetricsView open_view = MetricsView::kAll;
  // The clock the pause after a failed accept waits on (borrowed, outlives
  // the server); null: the system clock.
  const Clock* clock = nullptr;
};

// Whether the request head `head` (request line, header lines, the blank
// line) carries `Authorization: Bearer <token>` (header name and scheme in
// any case) with exactly `token`, compared in time that depends on the
// token's length only. Exposed for tests.
bool HasBearerToken(std::string_view head, std::string_view token);

class MetricsServer {
 public:
  // The exposition of the series `view` allows.
  using Render = std::function<std::string(MetricsView view)>;
  // Binds and starts serving. IoError (with the address) when the address
  // cannot be bound (in use, not local), InvalidArgument when it is not an
  // IP address.
  static Result<std::unique_ptr<MetricsServer>> Start(const MetricsOptions& options, Render render);
  ~MetricsServer();  // stops: closes the listener and every connection, joins the thread

  uint16_t port() const;
  const std::string& address() const;
  // "http://127.0.0.1:9470/metrics" (an IPv6 address in brackets).
  std::string url() const;

 private:
  struct State;
  explicit MetricsServer(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace kvtier

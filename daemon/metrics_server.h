// MetricsServer: kvtierd's HTTP endpoint for Prometheus (and for people
// with curl). Plain HTTP/1.1 on Asio, the library the daemon already
// serves its socket with (docs/ARCHITECTURE.md says why not another one):
//   GET /metrics  the registry in the Prometheus text format (version 0.0.4)
//   GET /healthz  "ok" (the process answers; `kvtier health` asks more)
// anything else 404, a method other than GET/HEAD 405, a request head over
// 8 KiB 431, one not sent within 5 s is dropped. One request per
// connection (Connection: close); at most 32 connections at once: a new
// one past them closes the oldest that has not sent its request yet (so
// idle connections cannot keep scrapes out), or itself when all 32 are
// being answered. Bound to an address (127.0.0.1 by default, so it
// is not exposed beyond the node unless configured).
//
// Thread-safety: one thread of its own runs every connection; `render` is
// called on it and must be thread-safe against the daemon's other work.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "kvtier/result.h"

namespace kvtier {

struct MetricsOptions {
  std::string address = "127.0.0.1";
  uint16_t port = 0;  // 0: any free port (port() says which)
};

class MetricsServer {
 public:
  using Render = std::function<std::string()>;
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

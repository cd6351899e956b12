// ServerConnection: one client connection. Reads frames (FrameReader: memory
// follows the bytes that arrived, under the server's FrameBudget), checks the
// cap before reading a payload, lets its RequestHandler answer, and writes
// responses in request order. Runs as one coroutine on its io thread's
// context, beside a watchdog coroutine on the same context that enforces
// the connection's timeouts (ConnectionLimits): no whole request within
// first_request_timeout of accept, a frame that does not
// arrive whole within frame_timeout, an idle connection holding nothing,
// and reservations older than reservation_timeout (aborted, the connection
// stays). Closing the connection (EOF, error, timeout, drain) closes the
// engine connection: its reservations and leases die with it.
#pragma once

#include <asio/awaitable.hpp>
#include <asio/local/stream_protocol.hpp>
#include <asio/steady_timer.hpp>
#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "common/frame_reader.h"
#include "common/log_rate_limiter.h"
#include "daemon/server/request_handler.h"

namespace kvtier {

// A connection's frame memory: charged to the daemon-wide FrameBudget
// (server.partial_frame_bytes) and to the connection's client-memory
// account (its own and its tenant's bound). Thread-compatible.
class ConnectionFrameMemory final : public FrameMemory {
 public:
  // Both borrowed; either may be null (not charged there).
  ConnectionFrameMemory(FrameBudget* shared, ClientMemoryAccount* account) : shared_(shared), account_(account) {}
  bool TryTake(size_t bytes) override;
  void Give(size_t bytes) override;

 private:
  FrameBudget* const shared_;
  ClientMemoryAccount* const account_;
};

// Counters shared by every connection of a server.
struct ConnectionCounters {
  std::atomic<int64_t> requests{0};
  std::atomic<int64_t> oversized_frames{0};
  std::atomic<int64_t> truncated_frames{0};
  std::atomic<int64_t> unparsable_frames{0};
  std::atomic<int64_t> frame_timeouts{0};          // closed: a frame did not arrive whole in time
  std::atomic<int64_t> idle_closed{0};             // closed: idle past server.idle_timeout_s
  std::atomic<int64_t> first_request_timeouts{0};  // closed: no request within first_request_timeout_ms
  std::atomic<int64_t> frame_memory_refused{0};    // closed: its frame would pass partial_frame_bytes
  std::atomic<int64_t> reservations_expired{0};    // aborted after server.reservation_timeout_s
  // The memory partial frames of all connections hold (beyond 4 KiB each).
  FrameBudget* frame_budget = nullptr;  // borrowed; null: unbounded
  // The client state of all connections, per tenant and in total.
  ClientMemory* client_memory = nullptr;  // borrowed; null: unbounded
  // The log lines peers can trigger (timeouts, truncated frames).
  LogRateLimiter log_limiter{10, std::chrono::seconds(10)};
};

class ServerConnection : public std::enable_shared_from_this<ServerConnection> {
 public:
  // The keys of a Lookup placed between two yields of the io thread (about
  // 0.1 ms of work; docs/BENCHMARKS.md, "A neighbour's huge lookups").
  static constexpr size_t kLookupStepKeys = 1024;

  using Socket = asio::local::stream_protocol::socket;

  // `context`, `counters` are borrowed. `party` is whose client memory the
  // connection's state is charged to (ClientMemory: the tenant's index, or
  // the operator's).
  ServerConnection(Socket socket, ConnectionId id, const HandlerContext& context, ConnectionCounters& counters,
                   size_t party = 0);

  // Answers gathered in one batch before they are sent and the next
  // frame is handled.
  static constexpr size_t kFlushAtBytes = 64 * 1024;

  ConnectionId id() const { return id_; }
  Socket::executor_type executor() { return socket_.get_executor(); }

  // Serves the connection until EOF, a fatal frame error, a timeout or
  // drain; then closes the engine connection.
  asio::awaitable<void> Run();

  // Stops reading new requests; buffered ones are still answered. Safe from
  // any thread (posted to the connection's context).
  void StopReading();

 private:
  static v1::Response ErrorResponse(const Status& status);
  // Answers a Pin or a corruption report (RequestHandler::AnswersLater);
  // suspends only while blocks are promoted from NVMe or a report is
  // checked, so the io thread serves other connections meanwhile.
  asio::awaitable<v1::Response> AnswerLater(const v1::Request& request);
  // Answers a Lookup of more than kLookupStepKeys keys in steps of that
  // many, yielding the io thread between them, so one connection's huge
  // lookups delay the others on its thread by one step at most.
  asio::awaitable<v1::Response> AnswerLookupInSteps(const v1::Request& request);
  // Writes write_buffer_ (all answers gathered so far) and empties it.
  asio::awaitable<bool> Flush();
  // Writes one framed response with the arena fd (and the directory fd, if
  // any) attached to its first byte.
  asio::awaitable<bool> SendWithArenaFd(const v1::Response& response);
  // Closes the socket and the engine connection.
  asio::awaitable<void> Close();
  // The watchdog: wakes at the next deadline (NextDeadline) until the
  // connection closes, aborts expired reservations, and cuts the
  // connection (TimeOut) when a frame or the idle time runs out.
  asio::awaitable<void> Watch();
  // The earliest time the watchdog has something to check.
  std::chrono::steady_clock::time_point NextDeadline();
  // Wakes the watchdog if NextDeadline moved before its timer.
  void RearmWatch();
  // Ends the connection for `reason` (logged, rate-limited): the pending
  // read and write complete with an error.
  void TimeOut(const std::string& reason);
  // Logs a line a peer can trigger, through the counters' rate limiter.
  void LogPeerTriggered(const std::string& line);

  Socket socket_;
  const ConnectionId id_;
  const HandlerContext& context_;
  ConnectionCounters& counters_;
  // What the connection holds of the daemon's memory; declared before the
  // handler and the reader, which charge it, so it is given back last.
  ClientMemoryAccount memory_;
  ConnectionFrameMemory frame_memory_;
  RequestHandler handler_;
  FrameReader reader_;
  std::string write_buffer_;
  asio::steady_timer watch_timer_;
  bool closed_ = false;
  bool timed_out_ = false;
  // When the last whole frame arrived; until the first, when accepted.
  std::chrono::steady_clock::time_point last_request_;
  bool got_request_ = false;  // a whole frame arrived (first_request_timeout no longer applies)
  // When the first byte of the frame in progress arrived; nullopt between frames.
  std::optional<std::chrono::steady_clock::time_point> frame_started_;
};

}  // namespace kvtier

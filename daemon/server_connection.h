// ServerConnection: one client connection. Reads frames, checks the cap before
// reading a payload, lets its RequestHandler answer, and writes responses in
// request order. Runs as one coroutine on its io thread's context. Closing the
// connection (EOF, error, drain) closes the engine connection: its
// reservations and leases die with it.
#pragma once

#include <asio/awaitable.hpp>
#include <asio/local/stream_protocol.hpp>
#include <atomic>
#include <memory>
#include <string>

#include "daemon/request_handler.h"

namespace kvtier {

// Counters shared by every connection of a server.
struct ConnectionCounters {
  std::atomic<int64_t> requests{0};
  std::atomic<int64_t> oversized_frames{0};
  std::atomic<int64_t> truncated_frames{0};
  std::atomic<int64_t> unparsable_frames{0};
};

class ServerConnection : public std::enable_shared_from_this<ServerConnection> {
 public:
  using Socket = asio::local::stream_protocol::socket;

  // `context`, `counters` are borrowed. A `refusal` (not ok) is the answer
  // to the first request, then the connection closes (RequestHandler).
  ServerConnection(Socket socket, ConnectionId id, const HandlerContext& context, ConnectionCounters& counters,
                   Status refusal = Status::Ok());

  ConnectionId id() const { return id_; }
  Socket::executor_type executor() { return socket_.get_executor(); }

  // Serves the connection until EOF, a fatal frame error or drain; then
  // closes the engine connection.
  asio::awaitable<void> Run();

  // Stops reading new requests; buffered ones are still answered. Safe from
  // any thread (posted to the connection's context).
  void StopReading();

 private:
  static v1::Response ErrorResponse(const Status& status);
  // Answers a Pin; suspends only while blocks are promoted from NVMe, so
  // the io thread serves other connections meanwhile.
  asio::awaitable<v1::Response> AnswerPin(const v1::Request& request);
  // Writes write_buffer_ (all answers gathered so far) and empties it.
  asio::awaitable<bool> Flush();
  // Writes one framed response with the arena fd (and the directory fd, if
  // any) attached to its first byte.
  asio::awaitable<bool> SendWithArenaFd(const v1::Response& response);
  // Closes the socket and the engine connection.
  asio::awaitable<void> Close();

  Socket socket_;
  const ConnectionId id_;
  const HandlerContext& context_;
  ConnectionCounters& counters_;
  RequestHandler handler_;
  std::string write_buffer_;
};

}  // namespace kvtier

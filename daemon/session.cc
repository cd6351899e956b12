#include "daemon/session.h"

#include <asio/read.hpp>
#include <asio/redirect_error.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>
#include <asio/post.hpp>

#include "common/framing.h"
#include "common/logging.h"
#include "common/unix_socket.h"
#include "proto/wire.h"

namespace kvtier {

Session::Session(Socket socket, SessionId id, const HandlerContext& context, int arena_fd,
                 SessionCounters& counters)
    : socket_(std::move(socket)),
      id_(id),
      context_(context),
      arena_fd_(arena_fd),
      counters_(counters),
      handler_(context, id) {}

void Session::StopReading() {
  asio::post(socket_.get_executor(), [self = shared_from_this()] {
    asio::error_code ignored;
    self->socket_.shutdown(Socket::shutdown_receive, ignored);
  });
}

asio::awaitable<void> Session::Run() {
  uint8_t header[kFrameHeaderBytes];
  for (;;) {
    asio::error_code ec;
    co_await asio::async_read(socket_, asio::buffer(header), asio::redirect_error(asio::use_awaitable, ec));
    if (ec) break;  // EOF between frames: a normal close
    const uint32_t length = DecodeFrameHeader(header);
    if (length > context_.max_frame_bytes) {
      counters_.oversized_frames.fetch_add(1, std::memory_order_relaxed);
      co_await SendConnectionError(ProtocolError(
          "frame of " + std::to_string(length) + " bytes exceeds the cap of " +
          std::to_string(context_.max_frame_bytes) + " bytes; closing the connection"));
      break;
    }
    read_buffer_.resize(length);
    size_t got = co_await asio::async_read(socket_, asio::buffer(read_buffer_),
                                           asio::redirect_error(asio::use_awaitable, ec));
    if (ec) {
      counters_.truncated_frames.fetch_add(1, std::memory_order_relaxed);
      spdlog::warn("session {}: truncated frame ({} of {} bytes): {}", id_, got, length, ec.message());
      co_await SendConnectionError(ProtocolError("truncated frame: got " + std::to_string(got) +
                                                 " of " + std::to_string(length) + " bytes"));
      break;
    }
    v1::Request request;
    v1::Response response;
    if (!request.ParseFromString(read_buffer_)) {
      counters_.unparsable_frames.fetch_add(1, std::memory_order_relaxed);
      response.set_id(0);
      wire::ToProto(ProtocolError("frame of " + std::to_string(length) +
                                  " bytes is not a valid kvtier.v1.Request"),
                    response.mutable_status());
      if (!co_await Send(response, false)) break;
      continue;  // frame boundaries are intact: keep serving
    }
    counters_.requests.fetch_add(1, std::memory_order_relaxed);
    RequestHandler::Outcome outcome = handler_.Handle(request, response);
    if (!co_await Send(response, outcome.attach_arena_fd)) break;
    if (outcome.close_after) break;
  }
  asio::error_code ignored;
  socket_.shutdown(Socket::shutdown_both, ignored);
  socket_.close(ignored);
  context_.engine->CloseSession(id_);
}

asio::awaitable<void> Session::SendConnectionError(const Status& status) {
  v1::Response response;
  response.set_id(0);
  wire::ToProto(status, response.mutable_status());
  co_await Send(response, false);
}

asio::awaitable<bool> Session::Send(const v1::Response& response, bool attach_fd) {
  const size_t body = response.ByteSizeLong();
  write_buffer_.resize(kFrameHeaderBytes + body);
  EncodeFrameHeader(static_cast<uint32_t>(body), reinterpret_cast<uint8_t*>(write_buffer_.data()));
  response.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(write_buffer_.data() + kFrameHeaderBytes));
  size_t sent = 0;
  asio::error_code ec;
  while (attach_fd) {
    // The fd must travel with the first byte; sendmsg on the native socket.
    Result<size_t> n = SendWithFd(socket_.native_handle(), write_buffer_.data(), write_buffer_.size(), arena_fd_);
    if (n.ok()) {
      sent = *n;
      break;
    }
    if (n.status().code() != StatusCode::kBusy) {
      spdlog::warn("session {}: cannot send the arena fd: {}", id_, n.status().ToString());
      co_return false;
    }
    co_await socket_.async_wait(Socket::wait_write, asio::redirect_error(asio::use_awaitable, ec));
    if (ec) co_return false;
  }
  co_await asio::async_write(socket_, asio::buffer(write_buffer_.data() + sent, write_buffer_.size() - sent),
                             asio::redirect_error(asio::use_awaitable, ec));
  co_return !ec;
}

}  // namespace kvtier

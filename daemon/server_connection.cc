#include "daemon/server_connection.h"

#include <asio/read.hpp>
#include <asio/redirect_error.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>
#include <asio/post.hpp>

#include "common/framing.h"
#include "common/logging.h"
#include "common/unix_socket.h"
#include "daemon/pending_response.h"
#include "proto/wire.h"

namespace kvtier {

ServerConnection::ServerConnection(Socket socket, ConnectionId id, const HandlerContext& context,
                                   ConnectionCounters& counters, Status refusal)
    : socket_(std::move(socket)),
      id_(id),
      context_(context),
      counters_(counters),
      handler_(context, id, std::move(refusal)) {}

void ServerConnection::StopReading() {
  asio::post(socket_.get_executor(), [self = shared_from_this()] {
    asio::error_code ignored;
    self->socket_.shutdown(Socket::shutdown_receive, ignored);
  });
}

namespace {

// Appends one framed response to `out`.
void AppendFrame(const v1::Response& response, std::string& out) {
  const size_t body = response.ByteSizeLong();
  const size_t at = out.size();
  out.resize(at + kFrameHeaderBytes + body);
  auto* bytes = reinterpret_cast<uint8_t*>(out.data() + at);
  EncodeFrameHeader(static_cast<uint32_t>(body), bytes);
  response.SerializeWithCachedSizesToArray(bytes + kFrameHeaderBytes);
}

}  // namespace

asio::awaitable<void> ServerConnection::Run() {
  // Reads whatever the socket has, answers every complete frame in it and
  // writes all the answers at once: pipelined requests cost one read and one
  // write per batch, a lone request one of each.
  std::string in(64 * 1024, '\0');
  size_t begin = 0, end = 0;
  for (;;) {
    write_buffer_.clear();
    bool close_after = false;
    while (end - begin >= kFrameHeaderBytes && !close_after) {
      const uint32_t length = DecodeFrameHeader(reinterpret_cast<const uint8_t*>(in.data() + begin));
      if (length > context_.max_frame_bytes) {
        counters_.oversized_frames.fetch_add(1, std::memory_order_relaxed);
        AppendFrame(ErrorResponse(ProtocolError(
            "frame of " + std::to_string(length) + " bytes exceeds the cap of " +
            std::to_string(context_.max_frame_bytes) + " bytes; closing the connection")), write_buffer_);
        close_after = true;
        break;
      }
      if (end - begin - kFrameHeaderBytes < length) break;  // body not complete yet
      v1::Request request;
      const bool parsed = request.ParseFromArray(in.data() + begin + kFrameHeaderBytes, static_cast<int>(length));
      begin += kFrameHeaderBytes + length;
      if (!parsed) {
        counters_.unparsable_frames.fetch_add(1, std::memory_order_relaxed);
        AppendFrame(ErrorResponse(ProtocolError("frame of " + std::to_string(length) +
                                                " bytes is not a valid kvtier.v1.Request")), write_buffer_);
        continue;  // frame boundaries are intact: keep serving
      }
      counters_.requests.fetch_add(1, std::memory_order_relaxed);
      v1::Response response;
      RequestHandler::Outcome outcome;
      if (request.body_case() == v1::Request::kPin && handler_.ServesPins()) {
        response = co_await AnswerPin(request);  // may wait for NVMe reads
      } else {
        outcome = handler_.Handle(request, response);
      }
      if (outcome.attach_arena_fd) {
        // The fd must travel with this response's first byte: flush first.
        if (!co_await Flush() || !co_await SendWithArenaFd(response)) co_return co_await Close();
      } else if (!outcome.no_response) {
        AppendFrame(response, write_buffer_);
      }
      close_after = outcome.close_after;
    }
    if (!co_await Flush() || close_after) break;

    // Keep the unparsed tail at the front and make room for a whole frame.
    in.erase(0, begin);
    end -= begin;
    begin = 0;
    size_t want = 64 * 1024;
    if (end >= kFrameHeaderBytes) {
      want = std::max<size_t>(want, kFrameHeaderBytes + DecodeFrameHeader(reinterpret_cast<const uint8_t*>(in.data())));
    }
    if (in.size() < want) in.resize(want);
    asio::error_code ec;
    size_t n = co_await socket_.async_read_some(asio::buffer(in.data() + end, in.size() - end),
                                                asio::redirect_error(asio::use_awaitable, ec));
    end += n;
    if (!ec) continue;
    if (end > begin) {  // EOF inside a frame
      counters_.truncated_frames.fetch_add(1, std::memory_order_relaxed);
      std::string what;
      if (end >= kFrameHeaderBytes) {
        const uint32_t length = DecodeFrameHeader(reinterpret_cast<const uint8_t*>(in.data()));
        what = "truncated frame: got " + std::to_string(end - kFrameHeaderBytes) + " of " +
               std::to_string(length) + " bytes";
      } else {
        what = "truncated frame header: got " + std::to_string(end) + " of " +
               std::to_string(kFrameHeaderBytes) + " bytes";
      }
      spdlog::warn("connection {}: {} ({})", id_, what, ec.message());
      write_buffer_.clear();
      AppendFrame(ErrorResponse(ProtocolError(what)), write_buffer_);
      co_await Flush();
    }
    break;  // EOF between frames is a normal close
  }
  co_await Close();
}

asio::awaitable<v1::Response> ServerConnection::AnswerPin(const v1::Request& request) {
  // Its own coroutine, with `pending` at function scope: g++ 12 mishandles
  // the lifetime of block-scoped coroutine locals across a co_await.
  std::shared_ptr<PendingResponse> pending = std::make_shared<PendingResponse>();
  asio::any_io_executor executor = socket_.get_executor();
  handler_.HandlePinAsync(request, [pending](v1::Response r) { pending->Complete(std::move(r)); });
  std::optional<v1::Response> now = pending->TryTake();  // host hits complete inline
  if (now) co_return std::move(*now);
  co_await pending->Wait(executor);
  co_return pending->Take();
}

v1::Response ServerConnection::ErrorResponse(const Status& status) {
  v1::Response response;
  response.set_id(0);
  wire::ToProto(status, response.mutable_status());
  return response;
}

asio::awaitable<void> ServerConnection::Close() {
  asio::error_code ignored;
  socket_.shutdown(Socket::shutdown_both, ignored);
  socket_.close(ignored);
  if (context_.engine != nullptr) context_.engine->CloseConnection(id_);  // an operator's holds nothing
  co_return;
}

asio::awaitable<bool> ServerConnection::Flush() {
  if (write_buffer_.empty()) co_return true;
  asio::error_code ec;
  co_await asio::async_write(socket_, asio::buffer(write_buffer_), asio::redirect_error(asio::use_awaitable, ec));
  write_buffer_.clear();
  co_return !ec;
}

asio::awaitable<bool> ServerConnection::SendWithArenaFd(const v1::Response& response) {
  std::string frame;
  AppendFrame(response, frame);
  size_t sent = 0;
  asio::error_code ec;
  const int fds[] = {context_.arena_fd, context_.directory_fd};
  const std::span<const int> passed(fds, context_.directory_fd >= 0 ? 2 : 1);
  for (;;) {
    Result<size_t> n = SendWithFds(socket_.native_handle(), frame.data(), frame.size(), passed);
    if (n.ok()) {
      sent = *n;
      break;
    }
    if (n.status().code() != StatusCode::kBusy) {
      spdlog::warn("connection {}: cannot send the arena fd: {}", id_, n.status().ToString());
      co_return false;
    }
    co_await socket_.async_wait(Socket::wait_write, asio::redirect_error(asio::use_awaitable, ec));
    if (ec) co_return false;
  }
  co_await asio::async_write(socket_, asio::buffer(frame.data() + sent, frame.size() - sent),
                             asio::redirect_error(asio::use_awaitable, ec));
  co_return !ec;
}

}  // namespace kvtier

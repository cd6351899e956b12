#include "daemon/server/server_connection.h"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/read.hpp>
#include <asio/redirect_error.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>
#include <asio/post.hpp>

#include "common/framing.h"
#include "common/logging.h"
#include "common/unix_socket.h"
#include "daemon/server/pending_response.h"
#include "proto/wire.h"

namespace kvtier {

bool ConnectionFrameMemory::TryTake(size_t bytes) {
  if (shared_ != nullptr && !shared_->TryTake(bytes)) return false;
  if (account_ != nullptr && !account_->TryCharge(bytes)) {
    if (shared_ != nullptr) shared_->Give(bytes);
    return false;
  }
  return true;
}

void ConnectionFrameMemory::Give(size_t bytes) {
  if (shared_ != nullptr) shared_->Give(bytes);
  if (account_ != nullptr) account_->Release(bytes);
}

ServerConnection::ServerConnection(Socket socket, ConnectionId id, const HandlerContext& context,
                                   ConnectionCounters& counters, size_t party)
    : socket_(std::move(socket)),
      id_(id),
      context_(context),
      counters_(counters),
      memory_(counters.client_memory, party, context.limits.max_client_memory_per_connection),
      frame_memory_(counters.frame_budget, &memory_),
      handler_(context, id, &memory_),
      reader_(context.max_frame_bytes, &frame_memory_),
      watch_timer_(socket_.get_executor()),
      last_request_(std::chrono::steady_clock::now()) {}

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
  asio::co_spawn(
      socket_.get_executor(), [self = shared_from_this()] { return self->Watch(); }, asio::detached);
  for (;;) {
    write_buffer_.clear();
    bool close_after = false;
    // Answers gathered past kFlushAtBytes are sent before the next frame
    // is handled: a peer that pipelines requests and reads no answers makes
    // the daemon hold at most that much and one answer more.
    bool flush_first = false;
    std::span<const uint8_t> body;
    FrameReader::State state;
    while (!close_after && write_buffer_.size() < kFlushAtBytes &&
           (state = reader_.Next(body)) != FrameReader::State::kNeedMore) {
      if (state == FrameReader::State::kOversized) {
        counters_.oversized_frames.fetch_add(1, std::memory_order_relaxed);
        AppendFrame(ErrorResponse(ProtocolError(
                        "frame of " + std::to_string(reader_.announced_bytes()) + " bytes exceeds the cap of " +
                        std::to_string(context_.max_frame_bytes) + " bytes; closing the connection")),
                    write_buffer_);
        close_after = true;
        break;
      }
      v1::Request request;
      const bool parsed = request.ParseFromArray(body.data(), static_cast<int>(body.size()));
      const size_t length = body.size();
      reader_.Consume();
      last_request_ = std::chrono::steady_clock::now();
      got_request_ = true;
      if (!parsed) {
        counters_.unparsable_frames.fetch_add(1, std::memory_order_relaxed);
        AppendFrame(ErrorResponse(ProtocolError("frame of " + std::to_string(length) +
                                                " bytes is not a valid kvtier.v1.Request")),
                    write_buffer_);
        continue;  // frame boundaries are intact: keep serving
      }
      counters_.requests.fetch_add(1, std::memory_order_relaxed);
      v1::Response response;
      RequestHandler::Outcome outcome;
      if (handler_.AnswersLater(request)) {
        response = co_await AnswerLater(request);  // may wait for NVMe reads or a check
      } else if (handler_.LookupTakesSteps(request, kLookupStepKeys)) {
        response = co_await AnswerLookupInSteps(request);
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
    flush_first = !close_after && write_buffer_.size() >= kFlushAtBytes;
    frame_started_.reset();
    if (reader_.buffered_bytes() > 0) frame_started_ = std::chrono::steady_clock::now();
    RearmWatch();
    if (!co_await Flush() || close_after) break;
    if (write_buffer_.capacity() > FrameReader::kInitialBytes * 16) std::string().swap(write_buffer_);
    if (flush_first) continue;  // frames may still be buffered: answer them before reading more

    std::span<uint8_t> space = reader_.ReadSpace();
    if (space.empty()) {
      counters_.frame_memory_refused.fetch_add(1, std::memory_order_relaxed);
      LogPeerTriggered("connection " + std::to_string(id_) + ": its frame of " +
                       std::to_string(reader_.announced_bytes()) +
                       " bytes would pass server.partial_frame_bytes; closing the connection");
      write_buffer_.clear();
      AppendFrame(ErrorResponse(Busy("kvtierd holds too much memory for partial frames "
                                     "(server.partial_frame_bytes); closing the connection")),
                  write_buffer_);
      co_await Flush();
      break;
    }
    asio::error_code ec;
    size_t n = co_await socket_.async_read_some(asio::buffer(space.data(), space.size()),
                                                asio::redirect_error(asio::use_awaitable, ec));
    reader_.Received(n);
    if (n > 0 && !frame_started_) frame_started_ = std::chrono::steady_clock::now();
    if (!ec) continue;
    if (reader_.buffered_bytes() > 0 && !timed_out_) {  // EOF inside a frame
      counters_.truncated_frames.fetch_add(1, std::memory_order_relaxed);
      std::string what;
      if (reader_.buffered_bytes() >= kFrameHeaderBytes) {
        what = "truncated frame: got " + std::to_string(reader_.buffered_bytes() - kFrameHeaderBytes) + " of " +
               std::to_string(reader_.announced_bytes()) + " bytes";
      } else {
        what = "truncated frame header: got " + std::to_string(reader_.buffered_bytes()) + " of " +
               std::to_string(kFrameHeaderBytes) + " bytes";
      }
      LogPeerTriggered("connection " + std::to_string(id_) + ": " + what + " (" + ec.message() + ")");
      write_buffer_.clear();
      AppendFrame(ErrorResponse(ProtocolError(what)), write_buffer_);
      co_await Flush();
    }
    break;  // EOF between frames is a normal close
  }
  co_await Close();
}

std::chrono::steady_clock::time_point ServerConnection::NextDeadline() {
  const ConnectionLimits& limits = context_.limits;
  auto next = std::chrono::steady_clock::time_point::max();
  if (frame_started_) next = std::min(next, *frame_started_ + limits.frame_timeout);
  if (!got_request_) next = std::min(next, last_request_ + limits.first_request_timeout);
  if (limits.idle_timeout.count() > 0) next = std::min(next, last_request_ + limits.idle_timeout);
  if (auto expiry = handler_.usage().NextExpiry()) next = std::min(next, *expiry);
  return next;
}

void ServerConnection::RearmWatch() {
  if (!closed_ && NextDeadline() < watch_timer_.expiry()) watch_timer_.cancel();
}

asio::awaitable<void> ServerConnection::Watch() {
  auto self = shared_from_this();  // the connection outlives its watchdog
  while (!closed_) {
    watch_timer_.expires_at(NextDeadline());
    asio::error_code ec;
    co_await watch_timer_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    if (closed_) break;
    const auto now = std::chrono::steady_clock::now();
    const size_t expired = handler_.AbortExpiredReservations(now);
    if (expired > 0) {
      counters_.reservations_expired.fetch_add(static_cast<int64_t>(expired), std::memory_order_relaxed);
      LogPeerTriggered("connection " + std::to_string(id_) + ": aborted " + std::to_string(expired) +
                       " reservations older than server.reservation_timeout_s");
    }
    const ConnectionLimits& limits = context_.limits;
    if (frame_started_ && now - *frame_started_ >= limits.frame_timeout) {
      counters_.frame_timeouts.fetch_add(1, std::memory_order_relaxed);
      TimeOut("a frame did not arrive whole within server.frame_timeout_ms (" +
              std::to_string(reader_.buffered_bytes()) + " bytes came)");
    } else if (!got_request_ && now - last_request_ >= limits.first_request_timeout) {
      counters_.first_request_timeouts.fetch_add(1, std::memory_order_relaxed);
      TimeOut("sent no whole request within server.first_request_timeout_ms of accept");
    } else if (limits.idle_timeout.count() > 0 && now - last_request_ >= limits.idle_timeout &&
               !handler_.usage().holds_anything()) {
      counters_.idle_closed.fetch_add(1, std::memory_order_relaxed);
      TimeOut("idle for server.idle_timeout_s, holding nothing");
    } else if (limits.idle_timeout.count() > 0 && now - last_request_ >= limits.idle_timeout) {
      last_request_ = now;  // holds leases or reservations: look again a timeout later
    }
  }
}

void ServerConnection::TimeOut(const std::string& reason) {
  if (timed_out_) return;
  timed_out_ = true;
  LogPeerTriggered("connection " + std::to_string(id_) + ": closing: " + reason);
  asio::error_code ignored;
  socket_.shutdown(Socket::shutdown_both, ignored);  // the pending read sees EOF, a write fails
  socket_.cancel(ignored);
}

void ServerConnection::LogPeerTriggered(const std::string& line) {
  uint64_t suppressed = 0;
  if (!counters_.log_limiter.Allow(suppressed)) return;
  if (suppressed > 0) {
    spdlog::warn("{} ({} similar lines suppressed)", line, suppressed);
  } else {
    spdlog::warn("{}", line);
  }
}

asio::awaitable<v1::Response> ServerConnection::AnswerLater(const v1::Request& request) {
  // Its own coroutine, with `pending` at function scope: g++ 12 mishandles
  // the lifetime of block-scoped coroutine locals across a co_await.
  std::shared_ptr<PendingResponse> pending = std::make_shared<PendingResponse>();
  asio::any_io_executor executor = socket_.get_executor();
  handler_.HandleLater(request, [pending](v1::Response r) { pending->Complete(std::move(r)); });
  std::optional<v1::Response> now = pending->TryTake();  // host hits complete inline
  if (now) co_return std::move(*now);
  co_await pending->Wait(executor);
  co_return pending->Take();
}

asio::awaitable<v1::Response> ServerConnection::AnswerLookupInSteps(const v1::Request& request) {
  // Locals at function scope, as in AnswerLater.
  v1::Response response;
  RequestHandler::LookupSteps steps = handler_.BeginLookup(request);
  asio::any_io_executor executor = socket_.get_executor();
  while (!handler_.StepLookup(steps, kLookupStepKeys, response)) {
    co_await asio::post(executor, asio::use_awaitable);  // behind every handler ready now
  }
  co_return response;
}

v1::Response ServerConnection::ErrorResponse(const Status& status) {
  v1::Response response;
  response.set_id(0);
  wire::ToProto(status, response.mutable_status());
  return response;
}

asio::awaitable<void> ServerConnection::Close() {
  closed_ = true;
  watch_timer_.cancel();
  asio::error_code ignored;
  socket_.shutdown(Socket::shutdown_both, ignored);
  socket_.close(ignored);
  if (context_.engine != nullptr) context_.engine->CloseConnection(id_);  // an operator's holds nothing
  co_return;
}

asio::awaitable<bool> ServerConnection::Flush() {
  if (write_buffer_.empty()) co_return true;
  // While the peer reads them, answers beyond the first 4 KiB count as the
  // connection's client memory (held past the bound: they exist already),
  // so its other requests and its tenant's see them.
  const size_t charged = write_buffer_.size() > FrameReader::kInitialBytes ? write_buffer_.size() : 0;
  if (charged > 0) memory_.ChargeSpent(charged);
  asio::error_code ec;
  co_await asio::async_write(socket_, asio::buffer(write_buffer_), asio::redirect_error(asio::use_awaitable, ec));
  memory_.Release(charged);
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

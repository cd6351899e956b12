// Reading on internal::Connection (connection.h): the reader role
// (leader/follower between callers, the background reader for calls
// nobody waits on), frames parsed and dispatched to their calls, and the
// connection failed (pending calls answered) when the stream breaks or a
// deadline passes.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>

#include "client_lib/connection.h"
#include "common/framing.h"
#include "proto/wire.h"

namespace kvtier::internal {
namespace {

// RecvSpinningFirst's result when `deadline` passed with nothing read.
constexpr ssize_t kDeadlinePassed = -2;

// recv that first polls without blocking for up to `spin_us` (yielding the
// core between tries, so a daemon on the same core still runs), then
// blocks until `deadline` at most (then returns kDeadlinePassed). A
// response that comes back within the spin costs no sleep and wake-up of
// this thread: on a VM that is most of a small request's round trip.
ssize_t RecvSpinningFirst(int fd, char* buffer, size_t capacity, uint32_t spin_us, Deadline deadline) {
  if (spin_us > 0) {
    const auto spin_until = std::min(deadline, std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us));
    do {
      ssize_t n = ::recv(fd, buffer, capacity, MSG_DONTWAIT);
      if (n >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return n;
      sched_yield();
    } while (std::chrono::steady_clock::now() < spin_until);
  }
  // Sleep in poll(POLLIN), not in a blocking recv: a thread asleep in recv
  // is also woken whenever the daemon consumes a request this client sent
  // (the socket's write space changed), a wasted wake-up per call, where
  // poll only wakes for readable data.
  // Without a spin the answer is rarely there yet: poll first.
  for (bool first = true;; first = false) {
    if (!first || spin_us > 0) {
      ssize_t n = ::recv(fd, buffer, capacity, MSG_DONTWAIT);
      if (n >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) return n;
    }
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, PollTimeoutMs(deadline));
    if (ready == 0) return kDeadlinePassed;
    if (ready < 0 && errno != EINTR) return -1;
  }
}

}  // namespace

void Connection::Track(Reader reader, int delta) {
  if (reader == Reader::kBackground) background_pending_ += delta;
  if (reader == Reader::kDetached) detached_pending_ += delta;
  if (delta > 0 && BackgroundHasWork()) bg_cv_.NotifyOne();
}

bool Connection::BackgroundHasWork() const {
  return !reading_ && (background_pending_ > 0 || detached_pending_ >= kMaxUnreadDetached);
}

void Connection::Drive(const std::function<bool()>& ready) {
  const Deadline deadline = DeadlineAfter(call_timeout_);
  MutexLock lock(mu_);
  // `ready` is checked under mu_: a reader sets results before it retakes
  // mu_ to hand the role on, so a result that arrived is always seen here
  // before this thread would block in recv for it, or give up on it.
  while (!ready()) {
    if (closed_) {
      cv_.WaitFor(mu_, std::chrono::milliseconds(10));  // results are being failed
      continue;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      // The pending calls, this one included, carry the TimedOut.
      FailTimedOut("no answer from kvtierd within call_timeout (" + std::to_string(call_timeout_.count()) + " ms)")
          .IgnoreError();
      continue;
    }
    if (reading_) {
      ++role_waiters_;
      if (deadline == kNoDeadline)
        cv_.Wait(mu_);
      else
        cv_.WaitUntil(mu_, deadline);
      --role_waiters_;
      continue;
    }
    ReadAsLeader(deadline);
  }
}

void Connection::BackgroundLoop() {
  MutexLock lock(mu_);
  while (!closed_) {
    if (BackgroundHasWork()) {
      ReadAsLeader(kNoDeadline);  // reads for calls nobody waits on
      continue;
    }
    const auto now = std::chrono::steady_clock::now();
    if (deferred_.empty()) {
      // While notes keep coming, tick every kReleaseDelay instead of
      // sleeping until notified: a wake-up per copying get would cost more
      // than the get's own round trip.
      if (now - deferred_last_ > kReleaseTickLinger) {
        bg_cv_.Wait(mu_);
        continue;
      }
      background_timed_wait_ = true;
      bg_cv_.WaitUntil(mu_, now + kReleaseDelay);
      background_timed_wait_ = false;
      continue;
    }
    const auto due = deferred_.Due();
    if (now >= due) {
      FlushDeferred();
      continue;
    }
    background_timed_wait_ = true;
    bg_cv_.WaitUntil(mu_, due);
    background_timed_wait_ = false;
  }
}

void Connection::ReadAsLeader(Deadline deadline) {
  reading_ = true;
  mu_.Unlock();
  ReadAndDispatch(deadline);
  mu_.Lock();
  reading_ = false;
  if (role_waiters_ > 0) cv_.NotifyAll();
  if (BackgroundHasWork()) bg_cv_.NotifyOne();
}

void Connection::ReadAndDispatch(Deadline deadline) {
  std::vector<v1::Response> frames;
  for (;;) {
    while (read_buffer_.size() - read_begin_ >= kFrameHeaderBytes) {
      const auto* head = reinterpret_cast<const uint8_t*>(read_buffer_.data() + read_begin_);
      const uint32_t length = DecodeFrameHeader(head);
      if (length > response_frame_limit_) {
        return Fail(ProtocolError("response frame of " + std::to_string(length) + " bytes is implausible"));
      }
      if (read_buffer_.size() - read_begin_ < kFrameHeaderBytes + length) break;
      v1::Response response;
      if (!response.ParseFromArray(read_buffer_.data() + read_begin_ + kFrameHeaderBytes, static_cast<int>(length))) {
        return Fail(ProtocolError("unparsable response from kvtierd"));
      }
      frames.push_back(std::move(response));
      read_begin_ += kFrameHeaderBytes + length;
    }
    if (!frames.empty()) break;
    read_buffer_.erase(0, read_begin_);
    read_begin_ = 0;
    const size_t have = read_buffer_.size();
    read_buffer_.resize(have + 64 * 1024);
    // Spin only while answers have recently come back within the spin
    // budget: under load (many threads, slow answers) spinning would only
    // take the cores the daemon needs.
    const bool spin = wait_ewma_us_ < static_cast<double>(spin_wait_us_);
    const auto started = std::chrono::steady_clock::now();
    ssize_t n = RecvSpinningFirst(fd_, read_buffer_.data() + have, read_buffer_.size() - have, spin ? spin_wait_us_ : 0,
                                  deadline);
    const double waited_us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - started).count();
    wait_ewma_us_ = 0.875 * wait_ewma_us_ + 0.125 * waited_us;
    read_buffer_.resize(have + static_cast<size_t>(std::max<ssize_t>(n, 0)));
    if (n == kDeadlinePassed) return;  // the caller decides; a partial frame stays buffered
    if (n > 0) continue;
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) return Fail(Unavailable("kvtierd closed the connection"));
    if (errno == ECONNRESET) return Fail(Unavailable("kvtierd reset the connection"));
    return Fail(IoError(std::string("recv: ") + std::strerror(errno)));
  }
  for (auto& response : frames) Dispatch(std::move(response));
}

void Connection::Dispatch(v1::Response response) {
  if (response.id() == 0) {  // a frame-level error report; the daemon closes next
    Status reason = wire::FromProto(response.status());
    return Fail(reason.ok() ? ProtocolError("kvtierd reported a connection error") : reason);
  }
  Done done;
  {
    MutexLock lock(mu_);
    auto it = pending_.find(response.id());
    if (it == pending_.end()) return;  // failed locally already
    done = std::move(it->second.done);
    Track(it->second.reader, -1);
    pending_.erase(it);
  }
  Status top = wire::FromProto(response.status());
  if (top.ok())
    done(std::move(response));
  else
    done(top);
}

void Connection::Fail(const Status& reason) {
  MutexLock lock(mu_);
  FailLocked(reason, reason);
}

void Connection::FailLocked(const Status& pending_reason, const Status& later_reason) {
  Status final_reason = pending_reason;
  if (!closed_) {
    closed_ = true;
    close_reason_ = later_reason;
  } else {
    final_reason = close_reason_;
  }
  hung_up_.store(true, std::memory_order_relaxed);  // a failed connection serves nothing from the directory
  std::unordered_map<uint64_t, Pending> failed;
  failed.swap(pending_);
  background_pending_ = 0;
  detached_pending_ = 0;
  cv_.NotifyAll();
  bg_cv_.NotifyAll();
  mu_.Unlock();
  for (auto& [id, pending] : failed) pending.done(final_reason);
  mu_.Lock();
}

Status Connection::FailTimedOut(const std::string& what) {
  Status timed_out = TimedOut(what + "; the connection is not used any more");
  // The fd stays open until the Connection goes (~Connection): the daemon
  // keeps the leases of BlockViews still alive.
  FailLocked(timed_out, Unavailable("the connection to kvtierd failed earlier: " + what));
  return timed_out;
}

}  // namespace kvtier::internal

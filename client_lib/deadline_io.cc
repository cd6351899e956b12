#include "client_lib/deadline_io.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/unix_socket.h"

namespace kvtier::internal {
namespace {

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

// Waits until `fd` reports `events` or `deadline` passes. True if it did
// (or poll failed: the next I/O call reports the error).
bool WaitFor(int fd, short events, Deadline deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, PollTimeoutMs(deadline));
    if (n < 0 && errno == EINTR) continue;
    return n != 0;
  }
}

// SO_SNDTIMEO bounds a blocking connect(2) on a Unix socket: it is how long
// the kernel waits for room in a full listen backlog.
void SetSendTimeout(int fd, Deadline deadline) {
  timeval tv{};  // 0: no limit
  if (deadline != kNoDeadline) {
    const int ms = std::max(PollTimeoutMs(deadline), 1);
    tv.tv_sec = ms / 1000;
    tv.tv_usec = (ms % 1000) * 1000;
  }
  // Best effort: without it connect waits as long as the kernel lets it.
  (void)::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

}  // namespace

Deadline DeadlineAfter(std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0) return kNoDeadline;
  return std::chrono::steady_clock::now() + timeout;
}

int PollTimeoutMs(Deadline deadline) {
  if (deadline == kNoDeadline) return -1;
  const auto left = deadline - std::chrono::steady_clock::now();
  if (left <= std::chrono::steady_clock::duration::zero()) return 0;
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return ms > INT_MAX ? INT_MAX : static_cast<int>(ms);
}

Result<int> ConnectUnixBefore(const std::string& path, Deadline deadline) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    return InvalidArgument("socket path longer than " + std::to_string(sizeof(addr.sun_path) - 1) + " bytes: " + path);
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return IoError(Errno("socket"));
  SetSendTimeout(fd, deadline);
  while (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (errno == EINTR) continue;
    const int err = errno;
    ::close(fd);
    errno = err;
    if (err == ENOENT || err == ECONNREFUSED) {
      return Unavailable("no kvtierd listening at " + path + " (" + std::strerror(err) + ")");
    }
    if (err == EAGAIN) return TimedOut("kvtierd at " + path + " accepted no connection in time (backlog full)");
    return IoError(Errno("connect " + path));
  }
  SetSendTimeout(fd, kNoDeadline);  // later sends poll for their own deadline
  return fd;
}

Status SendAllBefore(int fd, const void* data, size_t len, Deadline deadline) {
  const char* p = static_cast<const char*>(data);
  while (len > 0) {
    const ssize_t n = ::send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) {
      p += n;
      len -= static_cast<size_t>(n);
      continue;
    }
    if (errno == EINTR) continue;
    if (errno == EPIPE || errno == ECONNRESET) return Unavailable(Errno("send"));
    if (errno != EAGAIN && errno != EWOULDBLOCK) return IoError(Errno("send"));
    if (!WaitFor(fd, POLLOUT, deadline)) {
      return TimedOut("kvtierd took no more request bytes (" + std::to_string(len) + " left to send)");
    }
  }
  return Status::Ok();
}

Status ReadAllBefore(int fd, void* data, size_t len, std::vector<int>* received, Deadline deadline) {
  char* p = static_cast<char*>(data);
  size_t got = 0;
  while (got < len) {
    const ssize_t n = RecvWithFds(fd, p + got, len - got, MSG_DONTWAIT, received);
    if (n > 0) {
      got += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) {
      return Unavailable("connection closed after " + std::to_string(got) + " of " + std::to_string(len) + " bytes");
    }
    if (errno == EINTR) continue;
    if (errno == ECONNRESET) return Unavailable(Errno("recvmsg"));
    if (errno != EAGAIN && errno != EWOULDBLOCK) return IoError(Errno("recvmsg"));
    if (!WaitFor(fd, POLLIN, deadline)) {
      return TimedOut("got " + std::to_string(got) + " of " + std::to_string(len) + " bytes in time");
    }
  }
  return Status::Ok();
}

}  // namespace kvtier::internal

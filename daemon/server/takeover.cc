#include "daemon/server/takeover.h"

#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>

#include "common/logging.h"
#include "common/unix_socket.h"
#include "daemon/tenants/tenants.h"

namespace kvtier {
namespace {

constexpr char kHelloPrefix[] = "kvtier-takeover ";
constexpr char kHello[] = "kvtier-takeover 1";
constexpr size_t kMaxMessage = 512;
// How long an accepted caller has to send its request.
constexpr auto kRequestTimeout = std::chrono::seconds(5);

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

Result<sockaddr_un> AddressOf(const std::string& path) {
  sockaddr_un address{};
  if (path.size() >= sizeof(address.sun_path)) {
    return InvalidArgument("the takeover socket path is longer than " + std::to_string(sizeof(address.sun_path) - 1) +
                           " bytes: " + path);
  }
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  return address;
}

// Ok when the peer on `fd` is this process's user or root.
Status CheckPeer(int fd, const std::string& who) {
  Result<PeerCredentials> peer = ReadPeerCredentials(fd);
  if (!peer.ok()) return peer.status();
  if (peer->uid != ::geteuid() && peer->uid != 0) {
    return PermissionDenied(who + " runs as uid " + std::to_string(peer->uid) + ", not as uid " +
                            std::to_string(::geteuid()) + " or root");
  }
  return Status::Ok();
}

// Waits until `fd` is readable or `timeout` passes (TimedOut).
Status WaitReadable(int fd, std::chrono::milliseconds timeout) {
  pollfd p{fd, POLLIN, 0};
  for (;;) {
    const int n = ::poll(&p, 1, static_cast<int>(timeout.count()));
    if (n > 0) return Status::Ok();
    if (n == 0) return TimedOut("no answer within " + std::to_string(timeout.count()) + " ms");
    if (errno != EINTR) return IoError(Errno("poll"));
  }
}

// One message (and the fds with it, at most kMaxPassedFds) within
// `timeout`. Unavailable when the peer closed.
Result<std::string> Receive(int fd, std::chrono::milliseconds timeout, std::vector<int>* fds) {
  if (Status ready = WaitReadable(fd, timeout); !ready.ok()) return ready;
  char buffer[kMaxMessage];
  ssize_t n = 0;
  do {
    n = RecvWithFds(fd, buffer, sizeof(buffer), 0, fds);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return IoError(Errno("recvmsg"));
  if (n == 0 && HungUp(fd)) return Unavailable("the other daemon closed the takeover connection");
  return std::string(buffer, static_cast<size_t>(n));  // an empty message is no message of ours
}

// Reads and drops whatever arrives on `fd` until the other end is closed,
// however long that takes.
void AwaitHangUp(int fd) {
  for (;;) {
    std::vector<int> fds;
    auto message = Receive(fd, std::chrono::hours(24), &fds);
    for (int f : fds) ::close(f);
    if (!message.ok() && message.status().code() != StatusCode::kTimedOut) return;  // closed (or broken)
  }
}

Status Send(int fd, const std::string& message) {
  if (::send(fd, message.data(), message.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(message.size())) {
    return IoError(Errno("send"));
  }
  return Status::Ok();
}

}  // namespace

bool HungUp(int connection) {
  pollfd p{connection, POLLIN | POLLRDHUP, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLRDHUP | POLLERR)) != 0;
}

std::string TakeoverPath(const std::string& socket_path) { return socket_path + ".takeover"; }

Result<std::unique_ptr<TakeoverListener>> TakeoverListener::Start(const std::string& socket_path, std::string refusal,
                                                                  std::function<void()> on_request) {
  const std::string path = TakeoverPath(socket_path);
  auto address = AddressOf(path);
  if (!address.ok()) return address.status();
  const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return IoError(Errno("socket"));
  // The daemon serves its socket now (a second daemon cannot: Server::Start
  // refuses it, and a takeover's predecessor removed this file before it
  // handed over), so a file here is a stale one of a daemon gone.
  ::unlink(path.c_str());
  // Mode 0600 once bound (callers are checked by uid in any case: the
  // umask is not changed, other threads create files meanwhile).
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&*address), sizeof(*address)) != 0 ||
      ::chmod(path.c_str(), 0600) != 0 || ::listen(fd, 4) != 0) {
    Status failed = IoError(Errno("cannot listen on " + path));
    ::close(fd);
    return failed;
  }
  const int wake = ::eventfd(0, EFD_CLOEXEC);
  if (wake < 0) {
    Status failed = IoError(Errno("eventfd"));
    ::close(fd);
    ::unlink(path.c_str());
    return failed;
  }
  std::unique_ptr<TakeoverListener> listener(
      new TakeoverListener(path, fd, wake, std::move(refusal), std::move(on_request)));
  listener->thread_ = std::thread([l = listener.get()] { l->Run(); });
  return listener;
}

TakeoverListener::TakeoverListener(std::string path, int listen_fd, int wake_fd, std::string refusal,
                                   std::function<void()> on_request)
    : path_(std::move(path)),
      listen_fd_(listen_fd),
      wake_fd_(wake_fd),
      refusal_(std::move(refusal)),
      on_request_(std::move(on_request)) {}

TakeoverListener::~TakeoverListener() { Close(); }

void TakeoverListener::Close() {
  if (closed_) return;
  closed_ = true;
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t woke = ::write(wake_fd_, &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
  ::unlink(path_.c_str());
  ::close(listen_fd_);
  ::close(wake_fd_);
  MutexLock lock(mu_);
  if (pending_ >= 0) ::close(std::exchange(pending_, -1));
}

int TakeoverListener::TakeRequest() {
  MutexLock lock(mu_);
  return std::exchange(pending_, -1);
}

void TakeoverListener::Reopen() {
  MutexLock lock(mu_);
  handed_ = false;
}

void TakeoverListener::Run() {
  pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
  for (;;) {
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("takeover listener: poll: {}; takeovers are off", std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;  // the caller went away, or descriptors ran out: the next poll retries
    Handle(fd);
  }
}

void TakeoverListener::Handle(int fd) {
  std::string refused;
  if (Status peer = CheckPeer(fd, "the caller"); !peer.ok()) {
    refused = peer.message();
  } else {
    std::vector<int> no_fds;
    auto hello = Receive(fd, kRequestTimeout, &no_fds);
    for (int f : no_fds) ::close(f);
    if (!hello.ok() || !hello->starts_with(kHelloPrefix)) {
      spdlog::warn("takeover listener: a caller sent no takeover request; closed it");
      ::close(fd);
      return;
    }
    refused =
        *hello != kHello ? "this kvtierd speaks takeover protocol 1, not \"" + hello->substr(0, 64) + "\"" : refusal_;
  }
  if (refused.empty()) {
    MutexLock lock(mu_);
    if (handed_) {
      refused = "another takeover is already in progress";
    } else {
      handed_ = true;
      pending_ = fd;
    }
  }
  if (!refused.empty()) {
    spdlog::warn("takeover request refused: {}", refused);
    Send(fd, "refused " + refused).IgnoreError();  // best effort: the caller may be gone
    ::close(fd);
    return;
  }
  spdlog::info("takeover requested: draining, then handing the socket and the host tier over");
  on_request_();
}

Status HandOver(int connection, const std::vector<PassedFd>& fds) {
  const timeval send_timeout{10, 0};  // the new daemon reads as they come: a full buffer means it is stuck
  ::setsockopt(connection, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof(send_timeout));
  for (const PassedFd& passed : fds) {
    const std::string message = "fd " + passed.name;
    Result<size_t> sent = SendWithFds(connection, message.data(), message.size(), {&passed.fd, 1});
    if (!sent.ok()) return sent.status();
    if (*sent != message.size()) return IoError("a short send of \"" + message + "\"");
  }
  return Send(connection, "end " + std::to_string(fds.size()));
}

namespace {

// A pidfd of the process at the other end of `connection` (-1 if none):
// its closing the connection is not its end (the RocksDB lock, the NVMe
// file and the GPU go with its last fds), the pidfd's readiness is.
int PeerPidfd(int connection) {
  Result<PeerCredentials> peer = ReadPeerCredentials(connection);
  if (!peer.ok() || peer->pid <= 0 || peer->pid == ::getpid()) return -1;  // never this process itself
  return static_cast<int>(::syscall(SYS_pidfd_open, peer->pid, 0));
}

// Waits, with no time limit, until the process of `pidfd` has exited.
void AwaitExit(int pidfd) {
  if (pidfd < 0) return;
  pollfd p{pidfd, POLLIN, 0};
  while (::poll(&p, 1, -1) < 0 && errno == EINTR) {
  }
}

}  // namespace

TakeoverOutcome AwaitServing(int connection, std::vector<PassedFd>& handed, std::chrono::milliseconds timeout,
                             const std::function<void(const std::string& name)>& released) {
  const int pidfd = PeerPidfd(connection);  // while it is surely alive (or a zombie): the connection is open
  const auto close_pidfd = [pidfd] {
    if (pidfd >= 0) ::close(pidfd);
  };
  const auto until = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    std::vector<int> fds;
    auto answer = Receive(connection, std::max(left, std::chrono::milliseconds(0)), &fds);
    for (int f : fds) ::close(f);
    if (answer.ok() && *answer == "serving") {
      close_pidfd();
      return TakeoverOutcome::kServing;
    }
    if (answer.ok() && answer->starts_with("release ")) {
      // The new daemon starts some arena empty: its memory goes now, before
      // the new one is allocated (and a resume starts that tier empty).
      const std::string name = answer->substr(8);
      if (released) released(name);
      std::erase_if(handed, [&name](const PassedFd& p) {
        if (p.name != name) return false;
        ::close(p.fd);
        return true;
      });
      if (Send(connection, "released " + name).ok()) continue;
      answer = IoError("could not answer a release");
    }
    if (!answer.ok() && answer.status().code() == StatusCode::kUnavailable) {
      spdlog::error("takeover: the new kvtierd ended without serving ({})", answer.status().ToString());
      AwaitExit(pidfd);
      close_pidfd();
      return TakeoverOutcome::kFailed;
    }
    // Timed out, an unexpected message or a broken connection: it must be
    // gone before this daemon touches the arena and the index again.
    spdlog::error("takeover: the new kvtierd did not serve ({}); killing it",
                  answer.ok() ? "it said \"" + answer->substr(0, 64) + "\"" : answer.status().ToString());
    Result<PeerCredentials> peer = ReadPeerCredentials(connection);
    if (!peer.ok() || peer->pid <= 0 || ::kill(peer->pid, SIGKILL) != 0) {
      spdlog::critical("takeover: cannot kill the new kvtierd ({}); exiting rather than serve beside it",
                       peer.ok() ? std::string(std::strerror(errno)) : peer.status().ToString());
      close_pidfd();
      return TakeoverOutcome::kUnknown;
    }
    AwaitHangUp(connection);
    AwaitExit(pidfd);  // gone, every fd of it closed
    close_pidfd();
    return TakeoverOutcome::kFailed;
  }
}

Result<TakeoverRequest> TakeoverRequest::Ask(const std::string& socket_path, std::chrono::milliseconds timeout) {
  const std::string path = TakeoverPath(socket_path);
  auto address = AddressOf(path);
  if (!address.ok()) return address.status();
  const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return IoError(Errno("socket"));
  TakeoverRequest request(fd, {});  // closes fd on every error below
  while (::connect(fd, reinterpret_cast<const sockaddr*>(&*address), sizeof(*address)) != 0) {
    if (errno == EINTR) continue;
    if (errno == ENOENT || errno == ECONNREFUSED) {
      return Unavailable("no kvtierd takes takeover requests at " + path + " (" + std::strerror(errno) + ")");
    }
    return IoError(Errno("connect " + path));
  }
  if (Status peer = CheckPeer(fd, "the kvtierd at " + path); !peer.ok()) return peer;
  if (Status sent = Send(fd, kHello); !sent.ok()) return sent;
  const auto until = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    std::vector<int> fds;
    auto message = Receive(fd, std::max(left, std::chrono::milliseconds(0)), &fds);
    if (!message.ok()) {
      for (int f : fds) ::close(f);
      return Status(message.status().code(), "takeover: " + message.status().message());
    }
    if (message->starts_with("fd ") && fds.size() == 1) {
      request.fds_.push_back(PassedFd{fds[0], message->substr(3)});
      continue;
    }
    for (int f : fds) ::close(f);
    if (message->starts_with("refused ")) return FailedPrecondition("takeover refused: " + message->substr(8));
    if (message->starts_with("end ")) {
      uint64_t count = 0;
      const char* text = message->data() + 4;
      const char* last = message->data() + message->size();
      auto [end, ec] = std::from_chars(text, last, count);
      if (ec == std::errc() && end == last && count == request.fds_.size()) return request;
    }
    return IoError("takeover: an unexpected message \"" + message->substr(0, 64) + "\"");
  }
}

TakeoverRequest::TakeoverRequest(TakeoverRequest&& other) noexcept
    : connection_(std::exchange(other.connection_, -1)), fds_(std::move(other.fds_)) {}

TakeoverRequest::~TakeoverRequest() {
  if (connection_ >= 0) ::close(connection_);
  for (const PassedFd& passed : fds_) ::close(passed.fd);
}

Status TakeoverRequest::Release(const std::string& name) {
  if (connection_ < 0) return FailedPrecondition("takeover: the connection is closed");
  if (Status sent = Send(connection_, "release " + name); !sent.ok()) return sent;
  std::vector<int> fds;
  auto answer = Receive(connection_, kHandOverTimeout, &fds);
  for (int f : fds) ::close(f);
  if (!answer.ok()) return answer.status();
  if (*answer != "released " + name) return IoError("takeover: an unexpected answer to a release");
  return Status::Ok();
}

Status TakeoverRequest::Serving() {
  if (connection_ < 0) return FailedPrecondition("takeover: Serving() was already sent");
  Status sent = Send(connection_, "serving");
  ::close(std::exchange(connection_, -1));
  return sent;
}

}  // namespace kvtier

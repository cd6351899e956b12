#include "tests/testing/fake_redis.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <optional>

namespace kvtier::testing {
namespace {

using Command = FakeRedis::Command;

// Takes one command (an array of bulk strings, as the client sends them)
// off the front of `in`; nullopt while it is not all there.
std::optional<Command> TakeCommand(std::string& in) {
  size_t pos = 0;
  auto line = [&](std::string* out) {
    const size_t end = in.find("\r\n", pos);
    if (end == std::string::npos) return false;
    *out = in.substr(pos, end - pos);
    pos = end + 2;
    return true;
  };
  std::string l;
  if (!line(&l)) return std::nullopt;
  if (l.size() < 2 || l[0] != '*') {
    ADD_FAILURE() << "the client sent '" << l << "' where a command should start";
    in.clear();
    return std::nullopt;
  }
  const int count = std::stoi(l.substr(1));
  Command command;
  for (int i = 0; i < count; ++i) {
    if (!line(&l)) return std::nullopt;
    if (l.size() < 2 || l[0] != '$') {
      ADD_FAILURE() << "the client sent '" << l << "' where an argument should start";
      in.clear();
      return std::nullopt;
    }
    const size_t length = std::stoul(l.substr(1));
    if (in.size() < pos + length + 2) return std::nullopt;
    command.push_back(in.substr(pos, length));
    pos += length + 2;
  }
  in.erase(0, pos);
  return command;
}

}  // namespace

FakeRedis::FakeRedis(Handler handler, const std::string& host) : handler_(std::move(handler)), host_(host) {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  EXPECT_EQ(::inet_pton(AF_INET, host_.c_str(), &address.sin_addr), 1) << host_;
  socklen_t length = sizeof address;
  EXPECT_EQ(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&address), sizeof address), 0) << std::strerror(errno);
  EXPECT_EQ(::listen(listen_fd_, 16), 0) << std::strerror(errno);
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&address), &length);
  port_ = ntohs(address.sin_port);
  stop_fd_ = ::eventfd(0, EFD_CLOEXEC);
  acceptor_ = std::thread([this] { AcceptLoop(); });
}

FakeRedis::~FakeRedis() {
  const uint64_t one = 1;
  EXPECT_EQ(::write(stop_fd_, &one, sizeof one), ssize_t(sizeof one));
  acceptor_.join();
  std::vector<std::thread> servers;
  {
    std::lock_guard lock(mu_);
    servers.swap(servers_);
  }
  for (auto& t : servers) t.join();
  ::close(listen_fd_);
  ::close(stop_fd_);
}

std::string FakeRedis::received() const {
  std::lock_guard lock(mu_);
  return received_;
}

std::vector<FakeRedis::Command> FakeRedis::commands() const {
  std::lock_guard lock(mu_);
  return commands_;
}

int FakeRedis::connections() const {
  std::lock_guard lock(mu_);
  return connections_;
}

bool FakeRedis::WaitForCommands(size_t n) const {
  std::unique_lock lock(mu_);
  return arrived_.wait_for(lock, std::chrono::seconds(5), [&] { return commands_.size() >= n; });
}

void FakeRedis::AcceptLoop() {
  for (;;) {
    pollfd p[2] = {{listen_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    if (::poll(p, 2, -1) < 0) continue;
    if (p[1].revents != 0) return;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    std::lock_guard lock(mu_);
    ++connections_;
    servers_.emplace_back([this, fd] { Serve(fd); });
  }
}

bool FakeRedis::SendAll(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t sent = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent > 0) {
      bytes.remove_prefix(static_cast<size_t>(sent));
      continue;
    }
    if (sent < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
    pollfd p[2] = {{fd, POLLOUT, 0}, {stop_fd_, POLLIN, 0}};
    ::poll(p, 2, -1);
    if (p[1].revents != 0) return false;
  }
  return true;
}

void FakeRedis::Serve(int fd) {
  std::string pending;
  bool shut = false;
  for (;;) {
    pollfd p[2] = {{fd, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    if (::poll(p, 2, -1) < 0) continue;
    if (p[1].revents != 0) break;
    char chunk[64 * 1024];
    const ssize_t got = ::recv(fd, chunk, sizeof chunk, 0);
    if (got <= 0) break;
    pending.append(chunk, static_cast<size_t>(got));
    {
      std::lock_guard lock(mu_);
      received_.append(chunk, static_cast<size_t>(got));
    }
    while (!shut) {
      std::optional<Command> command = TakeCommand(pending);
      if (!command) break;
      Reply reply;
      {
        std::lock_guard lock(mu_);
        commands_.push_back(*command);
        arrived_.notify_all();
        reply = handler_(*command);
      }
      for (size_t i = 0; i < reply.pieces.size(); ++i) {
        if (i > 0 && reply.pause.count() > 0) std::this_thread::sleep_for(reply.pause);
        if (!SendAll(fd, reply.pieces[i])) break;
      }
      if (reply.hang_up) {
        ::shutdown(fd, SHUT_WR);  // the client reads EOF; keep reading until it closes
        shut = true;
      }
    }
  }
  ::close(fd);
}

FakeRedis::Reply Say(std::string bytes) { return FakeRedis::Reply{{std::move(bytes)}}; }

}  // namespace kvtier::testing

#include "common/unix_socket.h"

#include <cerrno>
#include <cstring>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

namespace kvtier {
namespace {

std::string Errno(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

}  // namespace

Result<int> ConnectUnix(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    return InvalidArgument("socket path longer than " + std::to_string(sizeof(addr.sun_path) - 1) + " bytes: " + path);
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return IoError(Errno("socket"));
  while (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (errno == EINTR) continue;
    int err = errno;
    ::close(fd);
    errno = err;
    if (err == ENOENT || err == ECONNREFUSED) {
      return Unavailable("no kvtierd listening at " + path + " (" + std::strerror(err) + ")");
    }
    return IoError(Errno(("connect " + path).c_str()));
  }
  return fd;
}

Status WriteAll(int fd, const void* data, size_t len) {
  const char* p = static_cast<const char*>(data);
  while (len > 0) {
    ssize_t n = ::send(fd, p, len, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EPIPE || errno == ECONNRESET) return Unavailable(Errno("send"));
      return IoError(Errno("send"));
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status ReadAll(int fd, void* data, size_t len) {
  char* p = static_cast<char*>(data);
  size_t got = 0;
  while (got < len) {
    ssize_t n = ::recv(fd, p + got, len - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == ECONNRESET) return Unavailable(Errno("recv"));
      return IoError(Errno("recv"));
    }
    if (n == 0) {
      return Unavailable("connection closed after " + std::to_string(got) + " of " + std::to_string(len) + " bytes");
    }
    got += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Result<size_t> SendWithFds(int sock, const void* data, size_t len, std::span<const int> fds) {
  if (fds.empty() || fds.size() > kMaxPassedFds) {
    return InvalidArgument("SendWithFds passes 1.." + std::to_string(kMaxPassedFds) + " fds, got " +
                           std::to_string(fds.size()));
  }
  iovec iov{const_cast<void*>(data), len};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxPassedFds)] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
  cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
  cmsg->cmsg_level = SOL_SOCKET;
  cmsg->cmsg_type = SCM_RIGHTS;
  cmsg->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
  std::memcpy(CMSG_DATA(cmsg), fds.data(), sizeof(int) * fds.size());
  for (;;) {
    ssize_t n = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
    if (n >= 0) return static_cast<size_t>(n);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return Busy("socket buffer full");
    return IoError(Errno("sendmsg"));
  }
}

namespace {

// Appends the descriptors an SCM_RIGHTS control message of `msg` carried.
void CollectPassedFds(msghdr& msg, std::vector<int>* received) {
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      received->push_back(fd);
    }
  }
}

}  // namespace

Status ReadAllWithFds(int sock, void* data, size_t len, std::vector<int>* received) {
  char* p = static_cast<char*>(data);
  size_t got = 0;
  while (got < len) {
    const ssize_t n = RecvWithFds(sock, p + got, len - got, 0, received);
    if (n < 0) {
      if (errno == EINTR) continue;
      return IoError(Errno("recvmsg"));
    }
    if (n == 0) {
      return Unavailable("connection closed after " + std::to_string(got) + " of " + std::to_string(len) + " bytes");
    }
    got += static_cast<size_t>(n);
  }
  return Status::Ok();
}

ssize_t RecvWithFds(int sock, void* data, size_t len, int flags, std::vector<int>* received) {
  iovec iov{data, len};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxPassedFds)] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t n = ::recvmsg(sock, &msg, flags | MSG_CMSG_CLOEXEC);
  if (n > 0) CollectPassedFds(msg, received);
  return n;
}

}  // namespace kvtier

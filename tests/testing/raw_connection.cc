#include "tests/testing/raw_connection.h"

#include <cerrno>
#include <cstring>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>
#include <utility>

#include "common/framing.h"
#include "common/unix_socket.h"
#include "proto/wire.h"

namespace kvtier::testing {
namespace {

// Waits until `fd` is readable (data, EOF or error). False on timeout.
bool WaitReadable(int fd, std::chrono::milliseconds timeout) {
  pollfd p{fd, POLLIN, 0};
  for (;;) {
    int n = ::poll(&p, 1, static_cast<int>(timeout.count()));
    if (n < 0 && errno == EINTR) continue;
    return n > 0;
  }
}

}  // namespace

RawConnection::~RawConnection() { Close(); }

RawConnection::RawConnection(RawConnection&& other) noexcept { *this = std::move(other); }

RawConnection& RawConnection::operator=(RawConnection&& other) noexcept {
  if (this != &other) {
    Close();
    fd_ = std::exchange(other.fd_, -1);
    received_fds_ = std::exchange(other.received_fds_, 0);
  }
  return *this;
}

void RawConnection::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Status RawConnection::Connect(const std::string& path) {
  if (fd_ >= 0) return FailedPrecondition("RawConnection is already connected");
  Result<int> fd = ConnectUnix(path);
  if (!fd.ok()) return fd.status();
  fd_ = *fd;
  // A safety net under the poll in ReadResponse: a body that never arrives
  // fails the read instead of blocking forever.
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(kReadTimeout.count() / 1000);
  if (::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0) {
    return IoError(std::string("setsockopt(SO_RCVTIMEO): ") + std::strerror(errno));
  }
  return Status::Ok();
}

Status RawConnection::SendFrame(const v1::Request& request) {
  std::string payload;
  if (!request.SerializeToString(&payload)) return Internal("cannot serialize the request");
  std::string frame(kFrameHeaderBytes, '\0');
  EncodeFrameHeader(static_cast<uint32_t>(payload.size()), reinterpret_cast<uint8_t*>(frame.data()));
  frame += payload;
  return WriteAll(fd_, frame.data(), frame.size());
}

Status RawConnection::SendRawBytes(std::span<const uint8_t> bytes) { return WriteAll(fd_, bytes.data(), bytes.size()); }

Status RawConnection::Read(void* data, size_t len) {
  std::vector<int> passed;
  Status s = ReadAllWithFds(fd_, data, len, &passed);
  for (int fd : passed) {
    ++received_fds_;
    ::close(fd);
  }
  return s;
}

Result<v1::Response> RawConnection::ReadResponse() {
  if (fd_ < 0) return FailedPrecondition("RawConnection is not connected");
  if (!WaitReadable(fd_, kReadTimeout)) {
    return TimedOut("no response within " + std::to_string(kReadTimeout.count()) + " ms");
  }
  uint8_t header[kFrameHeaderBytes];
  if (Status s = Read(header, sizeof(header)); !s.ok()) return s;
  const uint32_t length = DecodeFrameHeader(header);
  if (length > kMaxResponseBytes) {
    return ProtocolError("response frame of " + std::to_string(length) + " bytes is implausible");
  }
  std::string body(length, '\0');
  if (length > 0) {
    if (Status s = Read(body.data(), body.size()); !s.ok()) return s;
  }
  v1::Response response;
  if (!response.ParseFromString(body)) {
    return ProtocolError("response frame of " + std::to_string(length) + " bytes does not parse");
  }
  return response;
}

Status RawConnection::ShutdownWrite() {
  if (::shutdown(fd_, SHUT_WR) != 0) return IoError(std::string("shutdown: ") + std::strerror(errno));
  return Status::Ok();
}

bool RawConnection::IsClosedByPeer(std::chrono::milliseconds timeout) {
  if (fd_ < 0) return false;
  if (!WaitReadable(fd_, timeout)) return false;
  char byte;
  for (;;) {
    ssize_t n = ::recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) return true;
    if (n > 0) return false;
    if (errno == EINTR) continue;
    return errno == ECONNRESET || errno == EPIPE;
  }
}

Result<v1::Response> RawConnection::Hello(const std::vector<NamespaceDescriptor>& namespaces) {
  v1::Request request;
  request.set_id(1);
  auto* hello = request.mutable_hello();
  hello->set_protocol_version(wire::kProtocolVersion);
  hello->set_client_name("kvtier-raw-test");
  for (const auto& ns : namespaces) wire::ToProto(ns, hello->add_namespaces());
  if (Status s = SendFrame(request); !s.ok()) return s;
  return ReadResponse();
}

}  // namespace kvtier::testing

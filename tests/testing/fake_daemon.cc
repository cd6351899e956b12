#include "tests/testing/fake_daemon.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/framing.h"
#include "common/unix_socket.h"
#include "proto/wire.h"
#include "tests/testing/test_daemon.h"

namespace kvtier::testing {
namespace {

std::string Frame(const v1::Response& response) {
  std::string payload;
  response.SerializeToString(&payload);
  std::string frame(kFrameHeaderBytes, '\0');
  EncodeFrameHeader(static_cast<uint32_t>(payload.size()), reinterpret_cast<uint8_t*>(frame.data()));
  return frame + payload;
}

// A 1 MiB memfd standing in for the daemon's arena; -1 on failure.
int MakeArenaFd() {
  const int fd = ::memfd_create("kvtier-fake-arena", MFD_CLOEXEC);
  if (fd < 0) return -1;
  if (::ftruncate(fd, static_cast<off_t>(FakeDaemon::kArenaBytes)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Sends `bytes` with the arena fd attached to the first byte, as kvtierd
// sends its Hello answer.
bool SendWithArena(int fd, const std::string& bytes) {
  const int arena = MakeArenaFd();
  if (arena < 0) return false;
  const int fds[] = {arena};
  Result<size_t> sent = SendWithFds(fd, bytes.data(), bytes.size(), fds);
  ::close(arena);  // the receiver got its own copy
  if (!sent.ok()) return false;
  return WriteAll(fd, bytes.data() + *sent, bytes.size() - *sent).ok();
}

}  // namespace

FakeDaemon::FakeDaemon(Behavior behavior) : FakeDaemon(behavior, "") {}

FakeDaemon::FakeDaemon(Behavior behavior, std::string socket_path)
    : behavior_(behavior), socket_path_(std::move(socket_path)) {
  if (socket_path_.empty()) {
    dir_ = MakeTempDir();
    socket_path_ = dir_ + "/fake-kvtierd.sock";
  }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, socket_path_.c_str(), sizeof(addr.sun_path) - 1);
  listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0 || ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(listen_fd_, 16) != 0 || ::pipe2(stop_pipe_, O_CLOEXEC) != 0) {
    ADD_FAILURE() << "FakeDaemon cannot listen at " << socket_path_ << ": " << std::strerror(errno);
    return;
  }
  thread_ = std::thread([this] { Serve(); });
}

FakeDaemon::~FakeDaemon() {
  if (stop_pipe_[1] >= 0) (void)!::write(stop_pipe_[1], "x", 1);
  if (thread_.joinable()) thread_.join();
  for (int fd : accepted_) ::close(fd);
  for (int fd : {listen_fd_, stop_pipe_[0], stop_pipe_[1]}) {
    if (fd >= 0) ::close(fd);
  }
  ::unlink(socket_path_.c_str());
  if (!dir_.empty()) RemoveTree(dir_);
}

ClientOptions FakeDaemon::Options() const {
  ClientOptions options;
  options.socket_path = socket_path_;
  options.client_name = "kvtier-fake-test";
  options.namespaces = {TestNamespace()};
  return options;
}

void FakeDaemon::Serve() {
  for (;;) {
    pollfd p[2] = {{listen_fd_, POLLIN, 0}, {stop_pipe_[0], POLLIN, 0}};
    if (::poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (p[1].revents != 0) return;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    {
      std::lock_guard lock(mu_);
      accepted_.push_back(fd);
    }
    Play(fd);
  }
}

void FakeDaemon::Play(int fd) {
  if (behavior_ == Behavior::kSilent) return;
  std::string hello;
  if (!ReadFrame(fd, hello)) return;
  if (behavior_ == Behavior::kHugeHelloHeader) {
    std::string header(kFrameHeaderBytes, '\0');
    EncodeFrameHeader(kHugeFrameBytes, reinterpret_cast<uint8_t*>(header.data()));
    SendWithArena(fd, header);  // and never a body
    return;
  }
  if (!AnswerHello(fd, hello) || behavior_ == Behavior::kHelloThenSilent) return;
  std::string body;
  v1::Request request;
  if (!ReadFrame(fd, body) || !request.ParseFromString(body)) return;
  v1::Response response;  // any answer will do: only half of it goes out
  response.set_id(request.id());
  wire::ToProto(Status::Ok(), response.mutable_status());
  for (int i = 0; i < 64; ++i) {
    auto* counter = response.mutable_stats()->add_counters();
    counter->set_name("fake.counter_" + std::to_string(i));
    counter->set_value(i);
  }
  const std::string frame = Frame(response);
  (void)WriteAll(fd, frame.data(), frame.size() / 2).ok();
}

bool FakeDaemon::ReadFrame(int fd, std::string& body) {
  pollfd p[2] = {{fd, POLLIN, 0}, {stop_pipe_[0], POLLIN, 0}};
  while (::poll(p, 2, -1) < 0) {
    if (errno != EINTR) return false;
  }
  if (p[1].revents != 0) return false;
  uint8_t header[kFrameHeaderBytes];
  if (!ReadAll(fd, header, sizeof(header)).ok()) return false;
  body.assign(DecodeFrameHeader(header), '\0');
  return ReadAll(fd, body.data(), body.size()).ok();
}

bool FakeDaemon::AnswerHello(int fd, const std::string& body) {
  v1::Request request;
  if (!request.ParseFromString(body) || !request.has_hello()) return false;
  v1::Response response;
  response.set_id(request.id());
  wire::ToProto(Status::Ok(), response.mutable_status());
  auto* hello = response.mutable_hello();
  hello->set_protocol_version(wire::kProtocolVersion);
  for (const auto& ns : request.hello().namespaces()) {
    wire::ToProto(FingerprintNamespace(wire::FromProto(ns)), hello->add_namespace_fingerprints());
  }
  hello->set_arena_bytes(kArenaBytes);
  hello->set_max_frame_bytes(kDefaultMaxFrameBytes);
  hello->set_daemon_version("fake");
  return SendWithArena(fd, Frame(response));
}

}  // namespace kvtier::testing

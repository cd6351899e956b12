#include "client_lib/connection.h"

#include <cerrno>
#include <cstring>
#include <future>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/framing.h"
#include "common/unix_socket.h"
#include "proto/wire.h"

namespace kvtier::internal {
namespace {

// Frames and writes one message; caller holds the write mutex.
Status WriteFrame(int fd, const google::protobuf::MessageLite& message, uint32_t max_frame_bytes) {
  const size_t body = message.ByteSizeLong();
  if (body > max_frame_bytes) {
    return InvalidArgument("request of " + std::to_string(body) + " bytes exceeds the frame cap of " +
                           std::to_string(max_frame_bytes) + " bytes; split the batch");
  }
  std::string frame(kFrameHeaderBytes + body, '\0');
  EncodeFrameHeader(static_cast<uint32_t>(body), reinterpret_cast<uint8_t*>(frame.data()));
  message.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(frame.data() + kFrameHeaderBytes));
  return WriteAll(fd, frame.data(), frame.size());
}

}  // namespace

Result<std::shared_ptr<Connection>> Connection::Open(const ClientOptions& options) {
  for (size_t i = 0; i < options.namespaces.size(); ++i) {
    Status valid = options.namespaces[i].Validate();
    if (!valid.ok()) return InvalidArgument("namespace " + std::to_string(i) + ": " + valid.message());
  }
  std::shared_ptr<Connection> conn(new Connection());
  conn->max_frame_bytes_ = options.max_frame_bytes;
  conn->verify_checksums_ = options.verify_checksums;
  Result<int> fd = ConnectUnix(options.socket_path);
  if (!fd.ok()) return fd.status();
  conn->fd_ = *fd;
  Status hello = conn->Hello(options);
  if (!hello.ok()) return hello;
  conn->reader_ = std::thread([c = conn.get()] { c->ReadLoop(); });
  return conn;
}

Status Connection::Hello(const ClientOptions& options) {
  v1::Request request;
  request.set_id(next_id_++);
  auto* hello = request.mutable_hello();
  hello->set_protocol_version(wire::kProtocolVersion);
  hello->set_client_name(options.client_name);
  for (const auto& ns : options.namespaces) wire::ToProto(ns, hello->add_namespaces());
  Status s = WriteFrame(fd_, request, max_frame_bytes_);
  if (!s.ok()) return s;

  uint8_t header[kFrameHeaderBytes];
  int arena_fd = -1;
  s = ReadAllWithFd(fd_, header, sizeof(header), &arena_fd);
  if (!s.ok()) return Unavailable("no Hello response from kvtierd: " + s.message());
  const uint32_t length = DecodeFrameHeader(header);
  std::string body(length, '\0');
  if (length > max_frame_bytes_) s = ProtocolError("Hello response over the frame cap");
  if (s.ok()) s = ReadAll(fd_, body.data(), body.size());
  v1::Response response;
  if (s.ok() && !response.ParseFromString(body)) s = ProtocolError("unparsable Hello response");
  if (s.ok()) s = wire::FromProto(response.status());
  if (s.ok() && arena_fd < 0) s = ProtocolError("kvtierd sent no arena fd with its Hello response");
  if (!s.ok()) {
    if (arena_fd >= 0) ::close(arena_fd);
    return s;
  }
  const auto& body_hello = response.hello();
  struct stat st {};
  if (::fstat(arena_fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < body_hello.arena_bytes()) {
    ::close(arena_fd);
    return ProtocolError("the arena fd is smaller than the announced arena");
  }
  void* base = ::mmap(nullptr, body_hello.arena_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, arena_fd, 0);
  ::close(arena_fd);  // the mapping keeps the memfd alive
  if (base == MAP_FAILED) return IoError(std::string("mmap of the arena failed: ") + std::strerror(errno));
  arena_ = static_cast<std::byte*>(base);
  arena_bytes_ = body_hello.arena_bytes();
  max_frame_bytes_ = std::min(max_frame_bytes_, body_hello.max_frame_bytes());
  for (const auto& k : body_hello.namespace_fingerprints()) namespaces_.push_back(wire::FromProto(k));
  return Status::Ok();
}

Connection::~Connection() {
  Close();
  if (arena_ != nullptr) ::munmap(arena_, arena_bytes_);
}

void Connection::Close() {
  {
    std::lock_guard lock(pending_mu_);
    if (!closed_) {
      closed_ = true;
      close_reason_ = Unavailable("the client closed the connection");
    }
  }
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
  if (reader_.joinable()) {
    if (reader_.get_id() == std::this_thread::get_id()) {
      reader_.detach();  // last reference dropped inside a callback
    } else {
      reader_.join();
    }
  }
  FailAll(close_reason_);
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

void Connection::Call(v1::Request request, Done done) {
  const uint64_t id = next_id_.fetch_add(1, std::memory_order_relaxed);
  request.set_id(id);
  {
    std::lock_guard lock(pending_mu_);
    if (closed_) {
      Status reason = close_reason_;
      done(reason);
      return;
    }
    pending_.emplace(id, std::move(done));
  }
  Status s;
  {
    std::lock_guard lock(write_mu_);
    s = WriteFrame(fd_, request, max_frame_bytes_);
  }
  if (!s.ok()) {
    Done failed;
    {
      std::lock_guard lock(pending_mu_);
      auto it = pending_.find(id);
      if (it == pending_.end()) return;  // the reader already failed it
      failed = std::move(it->second);
      pending_.erase(it);
    }
    failed(s);
  }
}

Result<v1::Response> Connection::CallSync(v1::Request request) {
  std::promise<Result<v1::Response>> promise;
  auto future = promise.get_future();
  Call(std::move(request), [&promise](Result<v1::Response> r) { promise.set_value(std::move(r)); });
  return future.get();
}

void Connection::ReadLoop() {
  Status reason;
  std::string body;
  for (;;) {
    uint8_t header[kFrameHeaderBytes];
    reason = ReadAll(fd_, header, sizeof(header));
    if (!reason.ok()) break;
    const uint32_t length = DecodeFrameHeader(header);
    if (length > max_frame_bytes_ * 4u + 1024u) {  // responses carry per-key records
      reason = ProtocolError("response frame of " + std::to_string(length) + " bytes is implausible");
      break;
    }
    body.resize(length);
    reason = ReadAll(fd_, body.data(), body.size());
    if (!reason.ok()) break;
    v1::Response response;
    if (!response.ParseFromString(body)) {
      reason = ProtocolError("unparsable response from kvtierd");
      break;
    }
    if (response.id() == 0) {  // connection-level error; the daemon closes next
      reason = wire::FromProto(response.status());
      if (reason.ok()) reason = ProtocolError("kvtierd reported a connection error");
      continue;
    }
    Done done;
    {
      std::lock_guard lock(pending_mu_);
      auto it = pending_.find(response.id());
      if (it == pending_.end()) continue;  // a call already failed locally
      done = std::move(it->second);
      pending_.erase(it);
    }
    Status top = wire::FromProto(response.status());
    if (top.ok()) done(std::move(response)); else done(top);
  }
  {
    std::lock_guard lock(pending_mu_);
    if (!closed_) {
      closed_ = true;
      close_reason_ = reason.code() == StatusCode::kUnavailable
                          ? Unavailable("kvtierd closed the connection: " + reason.message())
                          : reason;
    }
  }
  FailAll(close_reason_);
}

void Connection::FailAll(const Status& status) {
  std::unordered_map<uint64_t, Done> failed;
  {
    std::lock_guard lock(pending_mu_);
    failed.swap(pending_);
  }
  for (auto& [id, done] : failed) done(status);
}

Result<std::span<std::byte>> Connection::Slot(uint64_t offset, uint64_t length) const {
  if (offset > arena_bytes_ || length > arena_bytes_ - offset) {
    return InvalidArgument("slot [" + std::to_string(offset) + ", +" + std::to_string(length) +
                           ") lies outside the " + std::to_string(arena_bytes_) + "-byte arena");
  }
  return std::span<std::byte>(arena_ + offset, length);
}

}  // namespace kvtier::internal

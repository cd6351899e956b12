// internal::Connection (connection.h): opening (connect, the daemon's
// identity, Hello and the arena, directory and device pool it brings), the
// liveness checks, closing, and arena slots. Sending is in
// connection_calls.cc, reading and failing in connection_reader.cc.
#include "client_lib/connection.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client_lib/daemon_identity.h"
#include "common/framing.h"
#include "proto/wire.h"

namespace kvtier::internal {
namespace {

// The largest response frame a connection with frame cap `max_frame_bytes`
// accepts. kvtierd puts no cap on its responses: it answers each item of a
// request (of at most max_frame_bytes) with one record, so the bound
// follows from the densest request item and the largest record:
//   - a lease of a Release is a packed varint of 1 byte (leases < 128), and
//     is answered with a Status of up to 58 bytes ("lease 127 is not held
//     (unknown or already released)" and its tags);
//   - a key (16 bytes) is answered with a Status whose message names the
//     key and sizes (about 100-200 bytes: "block size 8388609 can never fit
//     the host tier (...)", "layer range [0, 5) is not within ... of block
//     <key>", NoSpace with free and largest-free byte counts) plus up to four
//     numbers (PinnedBlock): under 20 bytes per request byte. A batch of
//     the frame cap in keys thus draws a reply of about 6 times the cap (a
//     Reserve of blocks that can never fit, a GetLayers with a bad range).
// So 64 response bytes per request byte, plus 1 MiB for the replies that do
// not scale with the request (Stats lists every counter). The bound only
// catches a desynchronized stream: the read buffer grows as bytes arrive,
// so a larger bound costs nothing up front.
size_t ResponseFrameLimit(uint32_t max_frame_bytes) {
  constexpr size_t kResponseBytesPerRequestByte = 64;
  constexpr size_t kUnscaledResponseBytes = 1u << 20;
  return static_cast<size_t>(max_frame_bytes) * kResponseBytesPerRequestByte + kUnscaledResponseBytes;
}

// The fds a Hello response brings: the arena and (if offered) the block
// directory memfd. Closes whatever it still holds (a mapping keeps a memfd
// alive).
struct HelloFds {
  int arena = -1;
  int directory = -1;
  HelloFds() = default;
  HelloFds(const HelloFds&) = delete;
  HelloFds& operator=(const HelloFds&) = delete;
  ~HelloFds() {
    if (arena >= 0) ::close(arena);
    if (directory >= 0) ::close(directory);
  }
};

// Reads the Hello response from `fd` by `deadline` into `response` and
// `fds`. The frame length is checked against `max_frame_bytes` before
// anything is allocated for the body. Ok only for a parsed, ok response
// that brought an arena fd, or announced no arena (an operator's
// connection). TimedOut (nothing, or not all, came by the
// deadline), Unavailable (the daemon hung up), ProtocolError (a frame over
// the cap, unparsable, no arena fd), or the daemon's own refusal
// (VersionMismatch, InvalidArgument).
Status ReadHelloResponse(int fd, uint32_t max_frame_bytes, const ClientOptions& options, Deadline deadline,
                         v1::Response& response, HelloFds& fds) {
  const std::string timeout = " within connect_timeout (" + std::to_string(options.connect_timeout.count()) + " ms)";
  uint8_t header[kFrameHeaderBytes];
  std::vector<int> passed;
  Status s = ReadAllBefore(fd, header, sizeof(header), &passed, deadline);
  // passed[0] is the arena, passed[1] (if any) the block directory.
  for (size_t i = 0; i < passed.size(); ++i) {
    if (i == 0)
      fds.arena = passed[i];
    else if (i == 1)
      fds.directory = passed[i];
    else
      ::close(passed[i]);
  }
  if (s.code() == StatusCode::kTimedOut) {
    return TimedOut("kvtierd at " + options.socket_path + " did not answer Hello" + timeout);
  }
  if (!s.ok()) return Unavailable("no Hello response from kvtierd: " + s.message());
  const uint32_t length = DecodeFrameHeader(header);
  if (length > max_frame_bytes) {
    return ProtocolError("Hello response of " + std::to_string(length) + " bytes exceeds the frame cap of " +
                         std::to_string(max_frame_bytes) + " bytes");
  }
  std::string body(length, '\0');
  passed.clear();
  s = ReadAllBefore(fd, body.data(), body.size(), &passed, deadline);
  for (int unexpected : passed) ::close(unexpected);
  if (s.code() == StatusCode::kTimedOut) return TimedOut("kvtierd sent part of its Hello response only" + timeout);
  if (!s.ok()) return Unavailable("no whole Hello response from kvtierd: " + s.message());
  if (!response.ParseFromString(body)) return ProtocolError("unparsable Hello response");
  if (s = wire::FromProto(response.status()); !s.ok()) return s;
  // No arena is an operator's connection to a kvtierd with tenants: admin
  // requests only (arena_bytes 0).
  if (fds.arena < 0 && response.hello().arena_bytes() > 0) {
    return ProtocolError("kvtierd sent no arena fd with its Hello response");
  }
  return Status::Ok();
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
  conn->spin_wait_us_ = options.spin_wait_us;
  conn->use_directory_ = options.use_directory;
  conn->call_timeout_ = std::max(options.call_timeout, std::chrono::milliseconds(0));
  auto trusted = TrustedDaemonUids(options, std::getenv("KVTIER_TRUSTED_DAEMON_UIDS"));
  if (!trusted.ok()) return trusted.status();
  const Deadline deadline = DeadlineAfter(options.connect_timeout);
  Result<int> fd = ConnectUnixBefore(options.socket_path, deadline);
  if (!fd.ok()) return fd.status();
  conn->fd_ = *fd;
  Status peer = CheckDaemonPeer(conn->fd_, options.socket_path, *trusted);
  if (!peer.ok()) return peer;
  Status hello = conn->Hello(options, deadline);
  if (!hello.ok()) return hello;
  conn->response_frame_limit_ = ResponseFrameLimit(conn->max_frame_bytes_);
  conn->background_reader_ = std::thread([c = conn.get()] { c->BackgroundLoop(); });
  return conn;
}

Status Connection::Hello(const ClientOptions& options, Deadline deadline) {
  v1::Request request;
  {
    MutexLock lock(mu_);  // no other thread exists yet; taken for the analysis
    request.set_id(next_id_++);
  }
  auto* hello = request.mutable_hello();
  hello->set_protocol_version(wire::kProtocolVersion);
  hello->set_client_name(options.client_name);
  for (const auto& ns : options.namespaces) wire::ToProto(ns, hello->add_namespaces());
  Status s = WriteFrames({}, &request, deadline);
  v1::Response response;
  HelloFds fds;
  if (!s.ok()) {
    // The daemon refuses a caller at accept (no tenant's, too many
    // connections) with one frame and closes: that frame says why, better
    // than the failed write does.
    Status why = ReadHelloResponse(fd_, max_frame_bytes_, options, deadline, response, fds);
    return why.ok() || why.code() == StatusCode::kUnavailable || why.code() == StatusCode::kTimedOut ? s : why;
  }
  s = ReadHelloResponse(fd_, max_frame_bytes_, options, deadline, response, fds);
  if (!s.ok()) return s;
  const auto& body_hello = response.hello();
  if (fds.directory >= 0 && use_directory_ && body_hello.directory_bytes() > 0) {
    AttachDirectory(fds.directory, body_hello.directory_bytes());  // a mapping keeps the memfd alive
  }
  if (body_hello.arena_bytes() > 0) {
    struct stat st {};
    if (::fstat(fds.arena, &st) != 0 || static_cast<uint64_t>(st.st_size) < body_hello.arena_bytes()) {
      return ProtocolError("the arena fd is smaller than the announced arena");
    }
    // Prefault the pages now, so no get or put pays a page fault on the hot
    // path (nothing maps there); not for a tool that never touches the
    // arena (ClientOptions::prefault_arena). Only the part kvtierd has
    // allocated: a fault on a page it has not allocated yet would allocate
    // it, charged to this process (the rest faults in at first touch, once
    // kvtierd has allocated it). MAP_POPULATE when that is all of it;
    // MADV_POPULATE_READ of the part otherwise (kernels before 5.14 lack
    // it: those pages then fault in at first touch).
    const uint64_t allocated = body_hello.arena_allocated_bytes() == 0
                                   ? body_hello.arena_bytes()
                                   : std::min(body_hello.arena_allocated_bytes(), body_hello.arena_bytes());
    const bool populate_all = options.prefault_arena && allocated == body_hello.arena_bytes();
    void* base = ::mmap(nullptr, body_hello.arena_bytes(), PROT_READ | PROT_WRITE,
                        MAP_SHARED | (populate_all ? MAP_POPULATE : 0), fds.arena, 0);
    if (base == MAP_FAILED) return IoError(std::string("mmap of the arena failed: ") + std::strerror(errno));
    if (options.prefault_arena && !populate_all) {
      const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
      (void)::madvise(base, allocated / page * page, MADV_POPULATE_READ);
    }
    arena_ = static_cast<std::byte*>(base);
    arena_bytes_ = body_hello.arena_bytes();
  }
  max_frame_bytes_ = std::min(max_frame_bytes_, body_hello.max_frame_bytes());
  for (const auto& k : body_hello.namespace_fingerprints()) namespaces_.push_back(wire::FromProto(k));
  for (const auto& ns : options.namespaces) layouts_.emplace_back(ns.layer_count, ns.BlockBytes());
  events_endpoints_ = EventsEndpoints{body_hello.events_endpoint(), body_hello.events_replay_endpoint()};
  if (body_hello.has_device_pool()) {
    const auto& pool = body_hello.device_pool();
    device_pool_offer_ = DevicePoolOffer{pool.ipc_handle(), pool.bytes(), pool.pci_bus_id()};
  }
  return Status::Ok();
}

void Connection::AttachDirectory(int fd, uint64_t bytes) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < bytes) return;
  void* base = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (base == MAP_FAILED) return;
  auto reader = DirectoryReader::Attach(static_cast<const std::byte*>(base), bytes);
  if (!reader.ok()) {
    ::munmap(base, bytes);
    return;
  }
  directory_map_ = static_cast<const std::byte*>(base);
  directory_bytes_ = bytes;
  directory_.emplace(*reader);
}

const DirectoryReader* Connection::directory() {
  if (!directory_ || !Alive()) return nullptr;
  return &*directory_;
}

bool Connection::Alive() {
  if (hung_up_.load(std::memory_order_relaxed)) return false;
  const int64_t now_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
  int64_t checked_ns = liveness_checked_ns_.load(std::memory_order_relaxed);
  // One thread per interval polls; the others go on.
  if (now_ns - checked_ns >= std::chrono::nanoseconds(kLivenessInterval).count() &&
      liveness_checked_ns_.compare_exchange_strong(checked_ns, now_ns, std::memory_order_relaxed)) {
    pollfd p{fd_, POLLRDHUP, 0};
    if (::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0) {
      hung_up_.store(true, std::memory_order_relaxed);
      return false;
    }
  }
  return true;
}

bool Connection::PeerClosed() const {
  if (fd_ < 0) return true;
  pollfd p{fd_, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

Status Connection::RegisterArenaForGpu() {
  MutexLock lock(gpu_mu_);
  if (gpu_registration_) return Status::Ok();
  auto registration = ArenaRegistration::Register(arena());
  if (!registration.ok()) return registration.status();
  gpu_registration_ = std::move(*registration);
  return Status::Ok();
}

const DevicePoolMapping* Connection::DevicePoolOn(int ordinal) {
  if (!device_pool_offer_) return nullptr;
  MutexLock lock(gpu_mu_);
  if (device_pool_state_ == PoolMapping::kUnresolved) {
    Result<int> pool_ordinal = DevicePoolMapping::OrdinalOf(*device_pool_offer_);
    device_pool_state_ = pool_ordinal.ok() ? PoolMapping::kResolved : PoolMapping::kFailed;
    if (pool_ordinal.ok()) device_pool_ordinal_ = *pool_ordinal;
  }
  if (device_pool_state_ == PoolMapping::kFailed || ordinal != device_pool_ordinal_) return nullptr;
  if (device_pool_state_ == PoolMapping::kResolved) {
    // Not logged: a client without the pool is complete (the arena path).
    auto mapping = DevicePoolMapping::Open(*device_pool_offer_, ordinal);
    device_pool_state_ = mapping.ok() ? PoolMapping::kOpen : PoolMapping::kFailed;
    if (mapping.ok()) device_pool_ = std::move(*mapping);
  }
  return device_pool_.get();
}

Connection::~Connection() {
  // No load is left (each holds the connection) and each finished its
  // copies out of the pool; the mapping closes before anything else goes
  // (an importer closes before the exporter may free the pool).
  device_pool_.reset();
  Close();
  gpu_registration_.reset();  // unregistered while still mapped
  if (fd_ >= 0) ::close(fd_);
  if (arena_ != nullptr) ::munmap(arena_, arena_bytes_);
  if (directory_map_ != nullptr) ::munmap(const_cast<std::byte*>(directory_map_), directory_bytes_);
}

void Connection::Close() {
  {
    MutexLock lock(mu_);
    if (!closed_ && !deferred_.empty()) FlushDeferred();  // best effort
  }
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);  // wakes a reader blocked in recv
  Fail(Unavailable("the client closed the connection"));
  if (background_reader_.joinable()) {
    if (background_reader_.get_id() == std::this_thread::get_id()) {
      background_reader_.detach();  // last reference dropped inside a callback
    } else {
      background_reader_.join();
    }
  }
}

Result<std::span<std::byte>> Connection::Slot(uint64_t offset, uint64_t length) const {
  if (offset > arena_bytes_ || length > arena_bytes_ - offset) {
    return InvalidArgument("slot [" + std::to_string(offset) + ", +" + std::to_string(length) + ") lies outside the " +
                           std::to_string(arena_bytes_) + "-byte arena");
  }
  return std::span<std::byte>(arena_ + offset, length);
}

}  // namespace kvtier::internal

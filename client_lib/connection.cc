#include "client_lib/connection.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <future>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client_lib/daemon_identity.h"
#include "common/framing.h"
#include "proto/wire.h"

namespace kvtier::internal {
namespace {

// Appends `message` framed to `out` (reused between calls, so steady
// traffic allocates nothing here); `out` is unchanged on error.
Status AppendFrame(const google::protobuf::MessageLite& message, uint32_t max_frame_bytes, std::string& out) {
  const size_t body = message.ByteSizeLong();
  if (body > max_frame_bytes) {
    return InvalidArgument("request of " + std::to_string(body) + " bytes exceeds the frame cap of " +
                           std::to_string(max_frame_bytes) + " bytes; split the batch");
  }
  const size_t at = out.size();
  out.resize(at + kFrameHeaderBytes + body);
  EncodeFrameHeader(static_cast<uint32_t>(body), reinterpret_cast<uint8_t*>(out.data() + at));
  message.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(out.data() + at + kFrameHeaderBytes));
  return Status::Ok();
}

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
    if (i == 0) fds.arena = passed[i]; else if (i == 1) fds.directory = passed[i]; else ::close(passed[i]);
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
    // MAP_POPULATE: fault every page in now, so no get or put pays a page
    // fault on the hot path (nothing maps there).
    void* base = ::mmap(nullptr, body_hello.arena_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
                        fds.arena, 0);
    if (base == MAP_FAILED) return IoError(std::string("mmap of the arena failed: ") + std::strerror(errno));
    arena_ = static_cast<std::byte*>(base);
    arena_bytes_ = body_hello.arena_bytes();
  }
  max_frame_bytes_ = std::min(max_frame_bytes_, body_hello.max_frame_bytes());
  for (const auto& k : body_hello.namespace_fingerprints()) namespaces_.push_back(wire::FromProto(k));
  for (const auto& ns : options.namespaces) layouts_.emplace_back(ns.layer_count, ns.BlockBytes());
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
  const int64_t now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                             std::chrono::steady_clock::now().time_since_epoch()).count();
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

void Connection::Track(Reader reader, int delta) {
  if (reader == Reader::kBackground) background_pending_ += delta;
  if (reader == Reader::kDetached) detached_pending_ += delta;
  if (delta > 0 && BackgroundHasWork()) bg_cv_.NotifyOne();
}

bool Connection::BackgroundHasWork() const {
  return !reading_ && (background_pending_ > 0 || detached_pending_ >= kMaxUnreadDetached);
}

void Connection::Call(v1::Request request, Done done, Reader reader) {
  uint64_t id = 0;
  Deferred deferred;  // deferred frames ride along
  {
    MutexLock lock(mu_);
    if (closed_) {
      Status reason = close_reason_;
      lock.Unlock();
      done(reason);
      return;
    }
    id = next_id_++;
    pending_.emplace(id, Pending{std::move(done), reader});
    Track(reader, +1);
    std::swap(deferred, deferred_);
  }
  request.set_id(id);
  Status s = WriteFrames(deferred, &request, DeadlineAfter(call_timeout_));
  if (s.ok()) return;
  Done failed;
  {
    MutexLock lock(mu_);
    auto it = pending_.find(id);
    if (it == pending_.end()) return;  // already failed by Fail()
    failed = std::move(it->second.done);
    Track(it->second.reader, -1);
    pending_.erase(it);
  }
  failed(s);
}

std::chrono::steady_clock::time_point Connection::Deferred::Due() const {
  auto due = std::chrono::steady_clock::time_point::max();
  if (!leases.empty()) due = std::min(due, leases_since + kReleaseDelay);
  if (!uses.empty()) due = std::min(due, uses_since + kUsageDelay);
  if (lookups != 0 || lookup_keys != 0) due = std::min(due, counters_since + kCountersDelay);
  return due;
}

Status Connection::WriteFrames(const Deferred& deferred, const v1::Request* request, Deadline deadline) {
  Status framed, written;
  {
    MutexLock lock(write_mu_);
    {
      // A failed write may have left part of a frame: nothing may follow it.
      MutexLock state(mu_);
      if (closed_) return close_reason_;
    }
    write_buffer_.clear();
    // At most a few hundred leases or keys: always far below any frame cap.
    if (!deferred.leases.empty()) {
      AppendFrame(wire::MakeReleaseNoReply(deferred.leases), max_frame_bytes_, write_buffer_).IgnoreError();
    }
    if (!deferred.uses.empty() || deferred.lookups != 0 || deferred.lookup_keys != 0) {
      AppendFrame(wire::MakeUsageReport(deferred.uses, deferred.lookups, deferred.lookup_keys, deferred.lookup_hits),
                  max_frame_bytes_, write_buffer_)
          .IgnoreError();
    }
    framed = request != nullptr ? AppendFrame(*request, max_frame_bytes_, write_buffer_) : Status::Ok();
    if (!write_buffer_.empty()) written = SendAllBefore(fd_, write_buffer_.data(), write_buffer_.size(), deadline);
  }
  if (written.code() == StatusCode::kTimedOut) {
    MutexLock lock(mu_);
    return FailTimedOut("sending a request timed out: " + written.message());
  }
  if (!written.ok()) Fail(written);
  return framed.ok() ? written : framed;
}

template <typename AddFn>
void Connection::Defer(AddFn&& add) {
  MutexLock lock(mu_);
  if (closed_) return;  // the daemon released everything with the connection
  const bool was_empty = deferred_.empty();
  const auto due_before = deferred_.Due();
  deferred_last_ = std::chrono::steady_clock::now();
  const bool flush_now = add(deferred_, deferred_last_);
  // A timed wait wakes by itself, unless the new note is due sooner.
  if (background_timed_wait_ ? deferred_.Due() < due_before : was_empty) bg_cv_.NotifyOne();
  if (flush_now) FlushDeferred();
}

void Connection::ReleaseLater(std::span<const uint64_t> leases) {
  if (leases.empty()) return;
  Defer([leases](Deferred& d, std::chrono::steady_clock::time_point now) {
    if (d.leases.empty()) d.leases_since = now;
    d.leases.insert(d.leases.end(), leases.begin(), leases.end());
    return d.leases.size() >= kMaxDeferredLeases;
  });
}

void Connection::NoteDirectoryUses(uint32_t ns, std::span<const BlockKey> keys) {
  if (keys.empty()) return;
  Defer([ns, keys](Deferred& d, std::chrono::steady_clock::time_point now) {
    if (d.uses.empty()) d.uses_since = now;
    for (const BlockKey& key : keys) d.uses.emplace_back(ns, key);
    return d.uses.size() >= kMaxDeferredUses;
  });
}

void Connection::NoteLocalLookups(uint64_t lookups, uint64_t keys, uint64_t hits) {
  if (lookups == 0 && keys == 0) return;
  Defer([lookups, keys, hits](Deferred& d, std::chrono::steady_clock::time_point now) {
    if (d.lookups == 0 && d.lookup_keys == 0) d.counters_since = now;
    d.lookups += lookups;
    d.lookup_keys += keys;
    d.lookup_hits += hits;
    return false;
  });
}

void Connection::FlushDeferred() {
  Deferred deferred;
  std::swap(deferred, deferred_);
  mu_.Unlock();
  // A failed write fails the connection; the leases end with it.
  WriteFrames(deferred, nullptr, DeadlineAfter(call_timeout_)).IgnoreError();
  mu_.Lock();
}

Result<v1::Response> Connection::CallSync(v1::Request request) {
  std::promise<Result<v1::Response>> promise;
  auto future = promise.get_future();
  Call(std::move(request), [&promise](Result<v1::Response> r) { promise.set_value(std::move(r)); },
       Reader::kCaller);
  return Await(std::move(future));
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
      FailTimedOut("no answer from kvtierd within call_timeout (" + std::to_string(call_timeout_.count()) +
                             " ms)").IgnoreError();
      continue;
    }
    if (reading_) {
      ++role_waiters_;
      if (deadline == kNoDeadline) cv_.Wait(mu_); else cv_.WaitUntil(mu_, deadline);
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
    ssize_t n = RecvSpinningFirst(fd_, read_buffer_.data() + have, read_buffer_.size() - have,
                                  spin ? spin_wait_us_ : 0, deadline);
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
  if (top.ok()) done(std::move(response)); else done(top);
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

Result<std::span<std::byte>> Connection::Slot(uint64_t offset, uint64_t length) const {
  if (offset > arena_bytes_ || length > arena_bytes_ - offset) {
    return InvalidArgument("slot [" + std::to_string(offset) + ", +" + std::to_string(length) +
                           ") lies outside the " + std::to_string(arena_bytes_) + "-byte arena");
  }
  return std::span<std::byte>(arena_ + offset, length);
}

}  // namespace kvtier::internal

// internal::Connection: one socket to kvtierd, the arena mapping and the
// machinery of pipelined calls. Not part of the public API.
//
// Requests from any thread are framed and written under a mutex. Responses
// are read by whichever thread needs one (leader/follower): a thread waiting
// in Await becomes the reader if nobody reads, reads whole frames and runs
// their callbacks, then hands the socket on. So a synchronous call costs no
// thread hop. A background thread reads while calls of the public *Async
// API are pending, and drains answers nobody waits for once a few pile up
// (so they can never fill the socket and stall the daemon).
//
// Deadlines: Open gives the connect and Hello ClientOptions::connect_timeout
// in all; every Await (a synchronous call) waits at most
// ClientOptions::call_timeout for its answer, and every write at most that
// long for socket space. When one runs out the connection is failed:
// pending calls get TimedOut, later ones Unavailable, and nothing more is
// read or written (a half-read frame is never resumed). The fd itself stays
// open until the Connection is destroyed, so the daemon keeps the leases of
// live BlockViews (their bytes cannot be reused under them).
//
// Lifetime: shared by the Client, its BlockViews and Reservations; the
// socket closes when the last of them lets go (see ~Connection).
//
// Releases nobody waits for are deferred: they ride in one Release{no_reply}
// frame in front of the next request (same write), or the background thread
// sends them kReleaseDelay later if no request comes. A copying get thus
// costs one round trip, not a round trip plus a frame and its answer. Reads
// served from the block directory are reported the same way (a UsageReport
// frame, due kUsageDelay / kCountersDelay later).
//
// Thread-safe. Callbacks run on the reading thread, one at a time; they may
// issue further calls but must never wait for one.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "client_lib/deadline_io.h"
#include "client_lib/device_copy.h"
#include "common/block_directory.h"
#include "common/mutex.h"
#include "kvtier/client.h"
#include "kvtier/v1/kvtier.pb.h"

namespace kvtier::internal {

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  using Done = std::function<void(Result<v1::Response>)>;

  // Who reads a call's response.
  enum class Reader {
    kCaller,      // the calling thread Awaits it
    kBackground,  // nobody waits on a thread: the background reader does
    kDetached,    // nobody waits at all (fire and forget): whoever reads next
  };

  // Connects, performs Hello (receiving and mapping the arena) and starts
  // the background reader. Errors as documented for Client::Connect.
  static Result<std::shared_ptr<Connection>> Open(const ClientOptions& options);
  ~Connection();

  // Sends `request` (its id is assigned here); `done` runs exactly once on a
  // reading thread with the response, or with Unavailable if the connection
  // fails first (possibly at once, on this thread). A response whose
  // top-level status is not ok is delivered as that Status.
  void Call(v1::Request request, Done done, Reader reader);

  // Reads and dispatches responses on this thread (or waits while another
  // thread does) until `future` is ready, then returns its value. If it is
  // not ready within call_timeout, fails the connection (the future then
  // holds TimedOut).
  template <typename T>
  T Await(std::future<T> future) {
    Drive([&future] { return future.wait_for(std::chrono::seconds(0)) == std::future_status::ready; });
    return future.get();
  }
  // Call + Await.
  Result<v1::Response> CallSync(v1::Request request);

  // Releases `leases` without an answer, deferred as described above; sent
  // at once when kMaxDeferredLeases are queued. Never blocks on the daemon.
  // Leases queued on a closed connection are dropped (the daemon released
  // them with the connection).
  void ReleaseLater(std::span<const uint64_t> leases);
  // Reports blocks of namespace `ns` copied out through the directory, and
  // lookups answered from it (`lookups` calls covering `keys` keys, of which
  // `hits` hit), deferred like releases. Never blocks on the daemon.
  void NoteDirectoryUses(uint32_t ns, std::span<const BlockKey> keys);
  void NoteLocalLookups(uint64_t lookups, uint64_t keys, uint64_t hits);

  // Shuts the socket down, fails pending calls, joins the background reader.
  // Idempotent. The fd itself is closed by the destructor, which runs this:
  // the Client does not call it while BlockViews or Reservations still
  // share the connection (their leases and reservations end with it).
  void Close();

  std::span<std::byte> arena() const { return {arena_, arena_bytes_}; }
  // The arena bytes of a slot; InvalidArgument if it lies outside the arena
  // (a daemon bug or a corrupted response, never trusted blindly).
  Result<std::span<std::byte>> Slot(uint64_t offset, uint64_t length) const;
  const std::vector<NamespaceFingerprint>& namespaces() const { return namespaces_; }
  // Where the daemon publishes this caller's KV events (Hello); empty when off.
  const EventsEndpoints& events_endpoints() const { return events_endpoints_; }
  // Layer split of namespace `ns`'s blocks: {layer_count, block_bytes}.
  std::pair<uint32_t, uint64_t> layout(uint32_t ns) const { return layouts_[ns]; }
  bool verify_checksums() const { return verify_checksums_; }
  std::chrono::milliseconds call_timeout() const { return call_timeout_; }
  uint32_t spin_wait_us() const { return spin_wait_us_; }
  // Registers the arena mapping with CUDA (cudaHostRegister) the first
  // time a GPU destination needs it; later calls return the first
  // outcome at once (a failure is retried). Unimplemented without CUDA.
  Status RegisterArenaForGpu();
  // The daemon's device pool (HelloResponse.device_pool) mapped into this
  // process, for a load into GPU memory on device `ordinal`; null when the
  // daemon offered no pool, the pool is on another GPU (compared by PCI
  // bus id), or mapping it failed. The first call for the pool's GPU
  // opens the mapping (once per connection); a failure is remembered and
  // not retried, loads then go through the arena. Always null without
  // CUDA. Valid until the Connection is destroyed, which closes it: a
  // load holds the connection and finishes its copies first.
  const DevicePoolMapping* DevicePoolOn(int ordinal);
  // False once the connection failed or the daemon hung up (a
  // non-blocking poll, at most every kLivenessInterval).
  bool Alive();
  // The daemon's block directory; null when it offers none, the client
  // opted out (ClientOptions::use_directory), the connection failed, or the
  // daemon hung up (checked
  // with a non-blocking poll at most every kLivenessInterval, so calls stop
  // being served from a dead daemon's table within about that long).
  const DirectoryReader* directory();
  // Whether kvtierd closed its end of the socket (it exited, restarted, or
  // cut this client off): a non-blocking poll, not throttled. False for a
  // connection this client failed itself (a time-out) while the daemon
  // still holds the socket. Used by Reconnector on failed connections only.
  bool PeerClosed() const;
  // Fails the connection with `reason` as if it broke (pending calls get
  // it, later calls too); the fd and the mappings stay until the last
  // holder lets go. Idempotent (the first reason stays).
  void Abandon(const Status& reason) { Fail(reason); }

 private:
  struct Pending {
    Done done;
    Reader reader = Reader::kCaller;
  };
  // Detached answers left unread before the background reader drains them.
  static constexpr int kMaxUnreadDetached = 16;
  // Longest a deferred release waits for a request to ride with. A pinned
  // block cannot be evicted, so this bounds how long a released block stays
  // unevictable.
  static constexpr std::chrono::microseconds kReleaseDelay{1000};
  static constexpr size_t kMaxDeferredLeases = 256;
  // Directory reads only steer eviction order: reported less eagerly.
  static constexpr std::chrono::microseconds kUsageDelay{10000};
  static constexpr size_t kMaxDeferredUses = 256;
  // Local lookups only feed counters.
  static constexpr std::chrono::microseconds kCountersDelay{100000};
  static constexpr std::chrono::microseconds kLivenessInterval{1000};

  // What goes to the daemon unasked: leases to release, directory reads and
  // lookups to report. Empty when nothing is waiting.
  struct Deferred {
    std::vector<uint64_t> leases;
    std::vector<std::pair<uint32_t, BlockKey>> uses;  // namespace index, key
    uint64_t lookups = 0, lookup_keys = 0, lookup_hits = 0;
    std::chrono::steady_clock::time_point leases_since, uses_since, counters_since;
    bool empty() const { return leases.empty() && uses.empty() && lookups == 0 && lookup_keys == 0; }
    // When the oldest waiting item is due.
    std::chrono::steady_clock::time_point Due() const;
  };
  // How long the background thread keeps ticking after the last deferred
  // release before it sleeps until notified.
  static constexpr std::chrono::milliseconds kReleaseTickLinger{50};

  void Track(Reader reader, int delta) REQUIRES(mu_);
  // True when the background reader should take the reader role now.
  bool BackgroundHasWork() const REQUIRES(mu_);

  Connection() = default;
  // Sends Hello and maps what the answer brings; all before `deadline`.
  Status Hello(const ClientOptions& options, Deadline deadline);
  // Reads (or waits for the reader) until `ready`, failing the connection
  // if call_timeout passes first. `ready` is called under mu_.
  void Drive(const std::function<bool()>& ready) EXCLUDES(mu_);
  void BackgroundLoop() EXCLUDES(mu_);
  // Frames `deferred` (a Release{no_reply} and a UsageReport, each only if
  // needed) and then `request` (if not null) into one write, which must
  // finish by `deadline`. Takes write_mu_; caller must not hold mu_. A
  // request over the frame cap fails alone (InvalidArgument): the deferred
  // frames still go. A failed write (TimedOut, Unavailable, IoError) may
  // have sent part of a frame: it fails the connection. On a connection
  // already failed, returns its reason and writes nothing.
  Status WriteFrames(const Deferred& deferred, const v1::Request* request, Deadline deadline) EXCLUDES(write_mu_, mu_);
  // Sends everything deferred now; mu_ is held on entry and exit and
  // released meanwhile.
  void FlushDeferred() REQUIRES(mu_);
  // Adds a note under mu_ through `add` (called with deferred_ and the time;
  // returns true to send everything now), then wakes the background thread
  // if it would not wake in time by itself. Nothing on a closed connection.
  // A template (defined in connection_calls.cc, beside its only users): a copying get
  // passes through here, and a std::function could allocate.
  template <typename AddFn>
  void Defer(AddFn&& add) EXCLUDES(mu_);
  // Maps the directory memfd read-only; on any failure the client simply
  // runs without a directory (logged nowhere: the socket path is complete).
  void AttachDirectory(int fd, uint64_t bytes);
  // Takes the reader role (precondition: nobody holds it; mu_ held on entry
  // and exit), reads and dispatches without mu_, hands the role back and
  // wakes waiters.
  void ReadAsLeader(Deadline deadline) REQUIRES(mu_);
  // Reads at least one whole frame (blocking until `deadline` at most) and
  // dispatches every complete frame buffered; returns having dispatched
  // nothing if `deadline` passes first (a partial frame stays buffered).
  // Caller holds the reader role (reading_ == true), not mu_.
  void ReadAndDispatch(Deadline deadline) EXCLUDES(mu_);
  void Dispatch(v1::Response response) EXCLUDES(mu_);
  // Marks the connection closed and fails every pending call with
  // `reason`; later calls fail with it too. If it was closed already, the
  // first reason stays and pending calls get that one.
  void Fail(const Status& reason) EXCLUDES(mu_);
  // The same, with mu_ held on entry and exit (released while callbacks
  // run): pending calls get `pending_reason`, later calls `later_reason`.
  void FailLocked(const Status& pending_reason, const Status& later_reason) REQUIRES(mu_);
  // Fails the connection after a call or a write got nowhere within its
  // deadline (`what` says which): pending calls get the TimedOut returned,
  // later ones Unavailable. mu_ as for FailLocked.
  Status FailTimedOut(const std::string& what) REQUIRES(mu_);

  int fd_ = -1;
  std::byte* arena_ = nullptr;
  size_t arena_bytes_ = 0;
  uint32_t max_frame_bytes_ = 0;
  size_t response_frame_limit_ = 0;            // largest response frame accepted (ResponseFrameLimit)
  std::chrono::milliseconds call_timeout_{0};  // 0: no deadline
  bool verify_checksums_ = false;
  uint32_t spin_wait_us_ = 0;
  bool use_directory_ = true;
  std::vector<NamespaceFingerprint> namespaces_;
  std::vector<std::pair<uint32_t, uint64_t>> layouts_;  // per namespace: layer_count, block bytes
  const std::byte* directory_map_ = nullptr;            // read-only mapping, or null
  size_t directory_bytes_ = 0;
  std::optional<DirectoryReader> directory_;
  std::atomic<int64_t> liveness_checked_ns_{0};  // steady clock of the last hang-up check
  std::atomic<bool> hung_up_{false};             // the daemon hung up, or the connection failed
  Mutex gpu_mu_;
  std::unique_ptr<ArenaRegistration> gpu_registration_ GUARDED_BY(gpu_mu_);  // released before the unmap
  EventsEndpoints events_endpoints_;                  // set by Hello only (before any other thread)
  std::optional<DevicePoolOffer> device_pool_offer_;  // set by Hello only (before any other thread)
  // The pool's mapping, opened on first use (DevicePoolOn).
  enum class PoolMapping {
    kUnresolved,  // the pool's GPU not looked up yet
    kResolved,    // on device_pool_ordinal_, not mapped yet
    kOpen,        // device_pool_ is the mapping
    kFailed,      // the lookup or the mapping failed: loads go through the arena
  };
  PoolMapping device_pool_state_ GUARDED_BY(gpu_mu_) = PoolMapping::kUnresolved;
  int device_pool_ordinal_ GUARDED_BY(gpu_mu_) = -1;
  std::unique_ptr<DevicePoolMapping> device_pool_ GUARDED_BY(gpu_mu_);  // closed first by ~Connection

  // Lock order: write_mu_, then mu_ (WriteFrames checks closed_ while
  // writing); nothing takes write_mu_ while holding mu_.
  Mutex write_mu_ ACQUIRED_BEFORE(mu_);  // serializes frames on the socket
  std::string write_buffer_ GUARDED_BY(write_mu_);

  Mutex mu_;
  // Two condition variables so that a synchronous call, the common case,
  // wakes nobody: cv_ is only notified when a caller is blocked on it
  // (role_waiters_ > 0), bg_cv_ only when the background reader has work.
  CondVar cv_;                            // reader role freed, or closed
  CondVar bg_cv_;                         // background reader may have work, or closed
  int role_waiters_ GUARDED_BY(mu_) = 0;  // callers blocked on cv_
  Deferred deferred_ GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point deferred_last_ GUARDED_BY(mu_);  // when something was last deferred
  bool background_timed_wait_ GUARDED_BY(mu_) = false;                   // the background thread will wake by itself
  std::unordered_map<uint64_t, Pending> pending_ GUARDED_BY(mu_);
  int background_pending_ GUARDED_BY(mu_) = 0;
  int detached_pending_ GUARDED_BY(mu_) = 0;
  bool reading_ GUARDED_BY(mu_) = false;  // someone holds the reader role
  bool closed_ GUARDED_BY(mu_) = false;
  Status close_reason_ GUARDED_BY(mu_);
  uint64_t next_id_ GUARDED_BY(mu_) = 1;

  // Only touched by the reader-role holder:
  std::string read_buffer_;
  double wait_ewma_us_ = 0;  // moving average of how long reads waited
  size_t read_begin_ = 0;    // parsed up to here
  std::thread background_reader_;
};

}  // namespace kvtier::internal

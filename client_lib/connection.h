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
// Thread-safe. Callbacks run on the reading thread, one at a time; they may
// issue further calls but must never wait for one.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

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
  // thread does) until `future` is ready, then returns its value.
  template <typename T>
  T Await(std::future<T> future) {
    Drive([&future] { return future.wait_for(std::chrono::seconds(0)) == std::future_status::ready; });
    return future.get();
  }
  // Call + Await.
  Result<v1::Response> CallSync(v1::Request request);

  // Shuts the socket down, fails pending calls, joins the background reader.
  // Idempotent. The fd itself is closed by the destructor.
  void Close();

  std::span<std::byte> arena() const { return {arena_, arena_bytes_}; }
  // The arena bytes of a slot; InvalidArgument if it lies outside the arena
  // (a daemon bug or a corrupted response, never trusted blindly).
  Result<std::span<std::byte>> Slot(uint64_t offset, uint64_t length) const;
  const std::vector<NamespaceFingerprint>& namespaces() const { return namespaces_; }
  bool verify_checksums() const { return verify_checksums_; }

 private:
  struct Pending {
    Done done;
    Reader reader = Reader::kCaller;
  };
  // Detached answers left unread before the background reader drains them.
  static constexpr int kMaxUnreadDetached = 16;

  void Track(Reader reader, int delta);  // caller holds mu_

  Connection() = default;
  Status Hello(const ClientOptions& options);
  void Drive(const std::function<bool()>& ready);
  void BackgroundLoop();
  // Takes the reader role (precondition: nobody holds it; `lock` holds mu_),
  // reads and dispatches without mu_, hands the role back and wakes waiters.
  void ReadAsLeader(std::unique_lock<std::mutex>& lock);
  // Reads at least one whole frame (blocking) and dispatches every complete
  // frame buffered. Caller holds the reader role (reading_ == true), not mu_.
  void ReadAndDispatch();
  void Dispatch(v1::Response response);
  // Marks the connection closed with `reason` and fails every pending call.
  void Fail(const Status& reason);

  int fd_ = -1;
  std::byte* arena_ = nullptr;
  size_t arena_bytes_ = 0;
  uint32_t max_frame_bytes_ = 0;
  bool verify_checksums_ = false;
  uint32_t spin_wait_us_ = 0;
  std::vector<NamespaceFingerprint> namespaces_;

  std::mutex write_mu_;       // serializes frames on the socket
  std::string write_buffer_;  // guarded by write_mu_ (Hello runs before any other thread)

  std::mutex mu_;
  std::condition_variable cv_;                    // reader role freed, or closed
  std::unordered_map<uint64_t, Pending> pending_;  // guarded by mu_
  int background_pending_ = 0;                     // guarded by mu_
  int detached_pending_ = 0;                       // guarded by mu_
  bool reading_ = false;                           // guarded by mu_: someone holds the reader role
  bool closed_ = false;                            // guarded by mu_
  Status close_reason_;                            // guarded by mu_
  uint64_t next_id_ = 1;                           // guarded by mu_

  // Only touched by the reader-role holder:
  std::string read_buffer_;
  double wait_ewma_us_ = 0;  // moving average of how long reads waited
  size_t read_begin_ = 0;    // parsed up to here
  std::thread background_reader_;
};

}  // namespace kvtier::internal

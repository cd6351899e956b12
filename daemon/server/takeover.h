// Takeover: a new kvtierd (`kvtierd --takeover`) takes the listening
// socket and the kept host arenas from the one running, so an upgrade or
// a restart for a changed configuration keeps the host tier and refuses no
// connection (docs/OPERATIONS.md "Takeover").
//
// The two meet on a SOCK_SEQPACKET socket beside the daemon's socket,
// TakeoverPath(socket_path), mode 0600; each side checks the other's
// SO_PEERCRED uid: the same user as itself, or root. Messages, one text
// line each:
//   new -> old  "kvtier-takeover 1"
//   old -> new  "refused <why>"                     and closes, or, once it
//               has drained its connections and closed its tiers:
//               "fd <name>" (one fd attached) ...   the listening socket
//                                                   (kListenerName) and
//                                                   each kept host pair
//               "end <count>"
//   new -> old  "release <name>"                    a kept arena or journal
//   old -> new  "released <name>"                   it will not adopt: the
//                                                   old one closes its copy
//                                                   (its memory is freed
//                                                   before the new arena is
//                                                   allocated)
//   new -> old  "serving"                           once its socket serves
// The old daemon exits on "serving". If the connection ends without it (the
// new daemon failed to start), or kServingTimeout passes or anything else
// arrives (the new daemon is then killed, and its end awaited), the old one
// starts again on the fds it still holds, as after a restart.
// Thread-compatible unless said otherwise.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "daemon/server/systemd_notify.h"
#include "kvtier/result.h"

namespace kvtier {

// The name the listening socket travels under, in a takeover and in
// systemd's file descriptor store.
inline constexpr char kListenerName[] = "kvtierd-socket";
// How long each side waits for the other's next step: the old one for
// "serving" (the new one's whole start), the new one for the fds (the old
// one's drain and close).
// The new daemon waits server.drain_timeout_ms more than kHandOverTimeout.
inline constexpr std::chrono::seconds kServingTimeout{120};
inline constexpr std::chrono::seconds kHandOverTimeout{120};

// Where the daemon listening at `socket_path` takes takeover requests.
std::string TakeoverPath(const std::string& socket_path);

// The running daemon's end. A thread accepts takeover requests; the first
// well-formed one from an allowed caller is kept for the main thread
// (TakeRequest) and `on_request` is called on the listener's thread to wake
// it; later ones are refused.
class TakeoverListener {
 public:
  // Binds TakeoverPath(socket_path) (replacing a stale file). With
  // `refusal` non-empty every request is answered "refused <refusal>" (a
  // daemon whose service manager restarts it). Errors: InvalidArgument (a
  // path too long), IoError.
  static Result<std::unique_ptr<TakeoverListener>> Start(const std::string& socket_path, std::string refusal,
                                                         std::function<void()> on_request);
  ~TakeoverListener();  // Close()
  TakeoverListener(const TakeoverListener&) = delete;
  TakeoverListener& operator=(const TakeoverListener&) = delete;

  // The accepted request's connection, now the caller's; -1 when none.
  // Thread-safe.
  int TakeRequest() EXCLUDES(mu_);
  // After the caller dropped the request it took: the next one is kept
  // again. Thread-safe.
  void Reopen() EXCLUDES(mu_);
  // Stops the thread, closes the socket and removes its file (a request
  // not taken is closed). Idempotent.
  void Close() EXCLUDES(mu_);

 private:
  TakeoverListener(std::string path, int listen_fd, int wake_fd, std::string refusal, std::function<void()> on_request);
  void Run();
  // Reads the request on `fd` and answers it, or keeps it.
  void Handle(int fd) EXCLUDES(mu_);

  const std::string path_;
  const int listen_fd_;
  const int wake_fd_;  // an eventfd: written to end Run
  const std::string refusal_;
  const std::function<void()> on_request_;
  std::thread thread_;
  bool closed_ = false;  // only the owner's thread
  Mutex mu_;
  int pending_ GUARDED_BY(mu_) = -1;
  bool handed_ GUARDED_BY(mu_) = false;  // a request was kept: refuse the rest
};

// Old side: true when the requester on `connection` is gone already (a
// takeover not worth a drain).
bool HungUp(int connection);
// Old side, once it stopped serving: sends `fds` (each with its name), then
// "end". The fds stay the caller's. A send blocked 10 s fails (IoError).
Status HandOver(int connection, const std::vector<PassedFd>& fds);

enum class TakeoverOutcome {
  kServing,  // the new daemon serves: exit
  kFailed,   // it is gone without serving: serve again on `handed`
  kUnknown,  // it did not serve and could not be killed: exit non-zero
};
// Old side: waits up to `timeout` for "serving", answering releases (the
// fds named are closed and removed from `handed`, and `released`, if set,
// is told the name first, so the caller lets go of its own mapping of
// it). On anything else the new
// daemon (the connection's SO_PEERCRED pid) is killed (SIGKILL). Before
// kFailed the new daemon's exit is awaited (a pidfd taken at the start),
// with no time limit, so that it holds nothing (the NVMe index's lock, the
// GPU) when the caller starts again.
TakeoverOutcome AwaitServing(int connection, std::vector<PassedFd>& handed, std::chrono::milliseconds timeout,
                             const std::function<void(const std::string& name)>& released = {});

// The new daemon's end: the request and what it receives.
class TakeoverRequest {
 public:
  // Connects to the daemon at `socket_path`, asks, and waits up to
  // `timeout` for its fds. Errors: Unavailable (nobody takes requests
  // there), PermissionDenied (another user's daemon), FailedPrecondition
  // (refused, with its reason), TimedOut, IoError.
  static Result<TakeoverRequest> Ask(const std::string& socket_path, std::chrono::milliseconds timeout);
  TakeoverRequest(TakeoverRequest&& other) noexcept;
  TakeoverRequest& operator=(TakeoverRequest&&) = delete;
  TakeoverRequest(const TakeoverRequest&) = delete;
  ~TakeoverRequest();  // closes the connection: the old daemon starts again unless Serving() was sent

  // The fds received, now the caller's (a second call: empty).
  std::vector<PassedFd> TakeFds() { return std::exchange(fds_, {}); }
  // Asks the old daemon to close its copy of the fd named `name` (a kept
  // arena or journal this daemon will not adopt) and waits until it did.
  Status Release(const std::string& name);
  // Tells the old daemon this one serves; it exits. Closes the connection.
  Status Serving();

 private:
  TakeoverRequest(int connection, std::vector<PassedFd> fds) : connection_(connection), fds_(std::move(fds)) {}
  int connection_ = -1;
  std::vector<PassedFd> fds_;
};

}  // namespace kvtier

// FakeDaemon: a Unix socket that speaks just enough of the kvtier protocol
// to misbehave on purpose, for the client library's failure paths (a daemon
// that never answers, stalls after Hello, stops inside a frame, announces a
// huge frame). Unlike TestDaemon there is no engine behind it.
//
// One thread accepts and serves connections one at a time. Every accepted
// socket stays open until the FakeDaemon is destroyed, which closes them
// all: a client still waiting on one then sees the connection end, so a
// test never hangs on a client that ignores its deadline.
//
// Thread-safe: socket_path() and Options() may be called from any thread.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kvtier/client.h"

namespace kvtier::testing {

class FakeDaemon {
 public:
  enum class Behavior {
    kSilent,              // accepts, reads nothing, answers nothing
    kHelloThenSilent,     // a valid Hello answer (1 MiB arena, no directory), then no answers
    kHelloThenHalfFrame,  // a valid Hello answer, then half of the answer to the first request
    kHugeHelloHeader,     // answers Hello with only a frame header announcing kHugeFrameBytes
  };
  static constexpr uint32_t kHugeFrameBytes = 0xFFFFFFF0u;
  static constexpr uint64_t kArenaBytes = 1u << 20;

  // Listens on a fresh socket in a temporary directory. Fails the test
  // (ADD_FAILURE) if it cannot.
  explicit FakeDaemon(Behavior behavior);
  // The same at `socket_path` (its directory is the caller's), as a daemon
  // restarted where the last one listened.
  FakeDaemon(Behavior behavior, std::string socket_path);
  ~FakeDaemon();  // closes every socket, joins the thread, removes the socket and its own directory
  FakeDaemon(const FakeDaemon&) = delete;
  FakeDaemon& operator=(const FakeDaemon&) = delete;

  const std::string& socket_path() const { return socket_path_; }
  // Client options for this socket with TestNamespace() registered.
  ClientOptions Options() const;

 private:
  void Serve();
  // Plays `behavior_` on one accepted connection; returns when it has said
  // all it will (the socket stays open).
  void Play(int fd);
  // Reads one whole frame into `body`; false on EOF, error or stop.
  bool ReadFrame(int fd, std::string& body);
  // Sends a valid Hello answer for the Hello request in `body`.
  bool AnswerHello(int fd, const std::string& body);

  const Behavior behavior_;
  std::string dir_;  // its own temporary directory; empty when given a path
  std::string socket_path_;
  int listen_fd_ = -1;
  int stop_pipe_[2] = {-1, -1};  // written by the destructor to stop Serve
  std::mutex mu_;
  std::vector<int> accepted_;  // guarded by mu_
  std::thread thread_;
};

}  // namespace kvtier::testing

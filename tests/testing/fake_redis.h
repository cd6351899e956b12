// FakeRedis: a scripted Redis node on a loopback TCP port for the remote
// tier's tests. Each command the client sends (an array of bulk strings)
// is answered with what the test's handler returns: bytes written whole or
// in pieces with pauses, or nothing, possibly followed by hanging up. Every
// byte, command and accepted connection is recorded, so a test can show
// what reached the node, or that nothing did.
//
// It listens on `host` (an IPv4 loopback address: 127.0.0.1 by default;
// Linux routes all of 127.0.0.0/8 to the loopback device, so 127.0.0.2 or
// 127.0.1.1 is another address on the same machine).
//
// Thread-safe; every connection has a thread of its own; the handler runs
// under the server's lock (one call at a time).
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace kvtier::testing {

class FakeRedis {
 public:
  using Command = std::vector<std::string>;
  struct Reply {
    std::vector<std::string> pieces;     // written in turn (none: silence)
    std::chrono::milliseconds pause{0};  // between two pieces
    bool hang_up = false;                // then the server shuts its side
  };
  using Handler = std::function<Reply(const Command&)>;

  explicit FakeRedis(Handler handler, const std::string& host = "127.0.0.1");
  ~FakeRedis();  // stops accepting and serving, joins every thread
  FakeRedis(const FakeRedis&) = delete;
  FakeRedis& operator=(const FakeRedis&) = delete;

  const std::string& host() const { return host_; }
  int port() const { return port_; }
  std::string address() const { return host_ + ":" + std::to_string(port_); }

  // Every byte received, all connections, in arrival order.
  std::string received() const;
  std::vector<Command> commands() const;
  // Connections accepted so far.
  int connections() const;
  // Waits until `n` commands arrived (or a generous while passed).
  bool WaitForCommands(size_t n) const;

 private:
  void AcceptLoop();
  // Sends all of `bytes` unless the server is stopping.
  bool SendAll(int fd, std::string_view bytes);
  void Serve(int fd);

  Handler handler_;
  std::string host_;
  int listen_fd_ = -1;
  int stop_fd_ = -1;
  int port_ = 0;
  std::thread acceptor_;
  mutable std::mutex mu_;
  mutable std::condition_variable arrived_;
  std::vector<std::thread> servers_;  // guarded by mu_
  std::string received_;              // guarded by mu_
  std::vector<Command> commands_;     // guarded by mu_
  int connections_ = 0;               // guarded by mu_
};

// A reply of `bytes` in one piece.
FakeRedis::Reply Say(std::string bytes);

}  // namespace kvtier::testing

// internal::Connection: one socket to kvtierd, the arena mapping and the
// machinery of pipelined calls. Requests from any thread are framed and
// written under a mutex; one reader thread parses responses and completes
// the matching call by id. Not part of the public API.
//
// Thread-safe. Callbacks run on the reader thread, one at a time; they may
// issue further calls but must not block on them.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kvtier/client.h"
#include "kvtier/v1/kvtier.pb.h"

namespace kvtier::internal {

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  using Done = std::function<void(Result<v1::Response>)>;

  // Connects, performs Hello (receiving and mapping the arena) and starts
  // the reader thread. Errors as documented for Client::Connect.
  static Result<std::shared_ptr<Connection>> Open(const ClientOptions& options);
  ~Connection();

  // Sends `request` (its id is assigned here) and later runs `done` exactly
  // once on the reader thread with the response, or with Unavailable if the
  // connection fails first. A response whose top-level status is not ok is
  // delivered as that Status.
  void Call(v1::Request request, Done done);
  // Call, waiting for the outcome.
  Result<v1::Response> CallSync(v1::Request request);

  // Closes the socket, fails pending calls, joins the reader. Idempotent.
  void Close();

  std::span<std::byte> arena() const { return {arena_, arena_bytes_}; }
  // The arena bytes of a slot; InvalidArgument if it lies outside the arena
  // (a daemon bug or a corrupted response, never trusted blindly).
  Result<std::span<std::byte>> Slot(uint64_t offset, uint64_t length) const;
  const std::vector<NamespaceFingerprint>& namespaces() const { return namespaces_; }
  bool verify_checksums() const { return verify_checksums_; }

 private:
  Connection() = default;
  Status Hello(const ClientOptions& options);
  void ReadLoop();
  void FailAll(const Status& status);

  int fd_ = -1;
  std::byte* arena_ = nullptr;
  size_t arena_bytes_ = 0;
  uint32_t max_frame_bytes_ = 0;
  bool verify_checksums_ = false;
  std::vector<NamespaceFingerprint> namespaces_;

  std::mutex write_mu_;          // serializes frames on the socket
  std::mutex pending_mu_;
  std::unordered_map<uint64_t, Done> pending_;  // guarded by pending_mu_
  bool closed_ = false;                         // guarded by pending_mu_
  Status close_reason_;                         // guarded by pending_mu_
  std::atomic<uint64_t> next_id_{1};
  std::thread reader_;
};

}  // namespace kvtier::internal

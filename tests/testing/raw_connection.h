// RawConnection: a blocking, hand-driven client of the kvtier control
// protocol for protocol tests. Unlike kvtier::Client it does nothing on its
// own: no Hello at connect, no ids, no reader thread, no checks on what it
// sends, so tests can send malformed headers, garbage payloads, requests out
// of order or before Hello, and watch exactly what the daemon answers.
//
// Thread-compatible: one thread drives a connection at a time.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/result.h"
#include "kvtier/v1/kvtier.pb.h"

namespace kvtier::testing {

class RawConnection {
 public:
  // Every blocking read gives up after this long (a hung daemon fails the
  // test instead of hanging it).
  static constexpr std::chrono::milliseconds kReadTimeout{10000};
  // Responses larger than this are reported as ProtocolError, not read.
  static constexpr uint32_t kMaxResponseBytes = 64u << 20;

  RawConnection() = default;
  ~RawConnection();  // closes the socket
  RawConnection(RawConnection&& other) noexcept;
  RawConnection& operator=(RawConnection&& other) noexcept;
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;

  // Connects to the daemon socket at `path` (errors as ConnectUnix).
  // Precondition: not connected.
  Status Connect(const std::string& path);

  // Frames and writes `request` exactly as given (its id included; no cap
  // check). Unavailable if the peer closed, IoError otherwise.
  Status SendFrame(const v1::Request& request);
  // Writes `bytes` as they are: headers, partial frames, garbage.
  Status SendRawBytes(std::span<const uint8_t> bytes);

  // Reads one framed Response. If an fd arrives as SCM_RIGHTS it is closed
  // at once and received_fd_count() goes up. Errors: TimedOut (nothing
  // within kReadTimeout), Unavailable (EOF, e.g. the daemon closed),
  // ProtocolError (frame over kMaxResponseBytes or unparsable), IoError.
  Result<v1::Response> ReadResponse();

  // Half-closes the socket: the daemon sees EOF, we can still read.
  Status ShutdownWrite();

  // True if the peer closed the connection (a read sees EOF or a reset)
  // within `timeout`; false if nothing happens in time or data is pending
  // (the data is left unread).
  bool IsClosedByPeer(std::chrono::milliseconds timeout = std::chrono::seconds(5));

  // Sends Hello (protocol version 1, `namespaces` registered, id 1) and
  // returns the daemon's response. A successful Hello carries the arena fd,
  // which is received and closed (see received_fd_count()).
  Result<v1::Response> Hello(const std::vector<NamespaceDescriptor>& namespaces);

  // How many SCM_RIGHTS fds arrived with responses so far.
  int received_fd_count() const { return received_fds_; }
  int fd() const { return fd_; }

 private:
  void Close();
  // Reads exactly `len` bytes, recording (and closing) any passed fd.
  Status Read(void* data, size_t len);

  int fd_ = -1;
  int received_fds_ = 0;
};

}  // namespace kvtier::testing

// One TCP connection to one Redis node, speaking RESP2, with a deadline on
// every step. The remote tier's own client (no hiredis: see
// docs/INTERNALS.md, "Remote tier"): commands go out with one writev
// from where their bytes lie (a value's header and payload are two pieces,
// never joined), and a bulk reply can land straight in the caller's
// buffers, so a block crosses the socket with no copy of its own.
//
// Failure model: any error or deadline leaves the connection `broken()`
// (a reply may be half read); its owner discards it. Errors:
//   Unavailable  connect refused, reset, closed by the peer
//   TimedOut     the deadline passed (the DeadlineExceeded)
//   ProtocolError the peer sent something that is not RESP
// A Redis error reply ("-MOVED ...") is not an error here: it is a reply
// of type kError, for the caller to interpret.
//
// Not thread-safe: one user at a time (the pool hands it out).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <sys/socket.h>

#include "kvtier/result.h"

namespace kvtier {

using RedisDeadline = std::chrono::steady_clock::time_point;

// One reply. Bulk and simple strings and errors keep their bytes in
// `text`; kBulk read by ReadBulkInto keeps only its length in `integer`.
struct RespReply {
  enum class Type : uint8_t { kSimple, kError, kInteger, kBulk, kNil, kArray };
  Type type = Type::kNil;
  std::string text;
  int64_t integer = 0;
  std::vector<RespReply> elements;

  bool is_error() const { return type == Type::kError; }
};

// What one reply may hold, checked as each length is announced, before
// anything is read or allocated for it; past a bound the reply is a
// ProtocolError and the connection broken.
struct RespLimits {
  // Array elements in the whole reply, nested ones included. A reply of
  // the commands the tier sends holds none but CLUSTER SLOTS', which is
  // read a range at a time (cluster_client.h).
  int64_t max_elements = int64_t{1} << 16;
  // Bytes of one bulk string: Redis' own proto-max-bulk-len cap.
  int64_t max_bulk_bytes = int64_t{512} << 20;
};

// One argument of a command: the bytes of `head` then those of `tail`
// (either may be empty), sent as one bulk string.
struct RespArg {
  std::string_view head;
  std::span<const std::byte> tail = {};
};

class RedisConnection {
 public:
  // Connects to host:port (a numeric IPv4/IPv6 address or a name) with
  // TCP_NODELAY. Unavailable or TimedOut naming the address. `allow`,
  // when given, sees each address the host resolves to before it is
  // dialled; those it refuses are skipped, and when it refuses them all
  // the result is PermissionDenied naming one (nothing was sent).
  using AddressFilter = std::function<bool(const sockaddr* address)>;
  static Result<std::unique_ptr<RedisConnection>> Connect(const std::string& host, int port, RedisDeadline deadline,
                                                          const AddressFilter& allow = nullptr);
  ~RedisConnection();
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;

  // Queues one command (an array of bulk strings) without sending it; a
  // pipeline is several Appends then one Flush. The argument bytes are
  // borrowed until Flush returns.
  void Append(std::span<const RespArg> args);
  // Sends everything appended.
  Status Flush(RedisDeadline deadline);

  // The next reply, whole (nested arrays included), within `limits`.
  Result<RespReply> ReadReply(RedisDeadline deadline, const RespLimits& limits = {});
  // The next reply, but of an array only its announced length: type
  // kArray, `integer` the element count, no elements (the caller reads
  // them with ReadReply, one at a time, and decides how many it takes).
  // Other replies come back whole, within `limits`.
  Result<RespReply> ReadReplyHead(RedisDeadline deadline, const RespLimits& limits = {});
  // The next reply, expected to be a bulk string: when its length is
  // exactly head.size() + body.size() its bytes land in `head` then `body`
  // (no intermediate copy); a bulk of any other length is read and
  // discarded, and only its length is reported, so the stream stays in
  // step. Other reply types come back whole (an error, nil).
  Result<RespReply> ReadBulkInto(std::span<std::byte> head, std::span<std::byte> body, RedisDeadline deadline);

  bool broken() const { return broken_; }
  const std::string& address() const { return address_; }
  // The address connected to (what the host resolved to).
  const sockaddr* peer() const { return reinterpret_cast<const sockaddr*>(&peer_); }

 private:
  RedisConnection(int fd, std::string address, const sockaddr* peer, socklen_t peer_length);
  // Some bytes (1..n) from the socket into `dst`, waiting until the deadline.
  Result<size_t> Receive(void* dst, size_t n, RedisDeadline deadline);
  // Makes at least `n` unread bytes available in the buffer.
  Status Fill(size_t n, RedisDeadline deadline);
  // Reads into `dst` directly: buffered bytes first, then the socket.
  Status ReadExact(std::span<std::byte> dst, RedisDeadline deadline);
  // Drops `n` bytes of the stream.
  Status Skip(size_t n, RedisDeadline deadline);
  Result<std::string> ReadLine(RedisDeadline deadline);
  // One reply at nesting `depth`; `elements_left` counts down the array
  // elements the whole reply may still hold. A head only: an array's
  // elements are left unread.
  Result<RespReply> ReadReplyAt(int depth, int64_t& elements_left, const RespLimits& limits, bool head_only,
                                RedisDeadline deadline);
  Status WaitFor(short events, RedisDeadline deadline);
  Status Fail(Status status);

  int fd_ = -1;
  std::string address_;
  sockaddr_storage peer_{};
  bool broken_ = false;
  // Outgoing: framing bytes (RESP lengths) and the pieces to send, as
  // (offset in framing_ or pointer) runs turned into iovecs at Flush.
  std::string framing_;
  struct Piece {
    const std::byte* data = nullptr;  // null: framing_[offset, offset + size)
    size_t offset = 0;
    size_t size = 0;
  };
  std::vector<Piece> pieces_;
  // Incoming: buffer_[begin_, end_) is read but not consumed.
  std::vector<char> buffer_;
  size_t begin_ = 0;
  size_t end_ = 0;
};

// "host:port" split; InvalidArgument naming the text when it is not one.
// "[v6]:port" for IPv6 addresses.
Result<std::pair<std::string, int>> ParseRedisAddress(std::string_view text);

}  // namespace kvtier

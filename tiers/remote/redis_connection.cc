#include "tiers/remote/redis_connection.h"

#include <cerrno>
#include <charconv>
#include <cstring>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>

namespace kvtier {
namespace {

constexpr size_t kReadChunk = 64 * 1024;
// Nesting of arrays a reply may have (CLUSTER SLOTS has 3 levels).
constexpr int kMaxDepth = 8;
// Bytes a bulk reply may announce to ReadBulkInto: Redis' own
// proto-max-bulk-len cap (ReadReply takes its RespLimits).
constexpr int64_t kMaxBulk = RespLimits{}.max_bulk_bytes;
constexpr int kMaxIov = 512;  // below IOV_MAX (1024)

int MillisLeft(RedisDeadline deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  if (left.count() <= 0) return 0;
  return static_cast<int>(std::min<int64_t>(left.count() + 1, 60'000));
}

Status ErrnoStatus(const std::string& what, int error) {
  if (error == ECONNREFUSED || error == ECONNRESET || error == EPIPE || error == ENETUNREACH || error == EHOSTUNREACH ||
      error == ECONNABORTED) {
    return Unavailable(what + ": " + std::strerror(error));
  }
  return IoError(what + ": " + std::strerror(error));
}

void AppendDecimal(std::string& out, int64_t value) {
  char digits[24];
  auto [end, ec] = std::to_chars(digits, digits + sizeof digits, value);
  out.append(digits, end);
}

}  // namespace

Result<std::pair<std::string, int>> ParseRedisAddress(std::string_view text) {
  const size_t colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == text.size()) {
    return InvalidArgument("'" + std::string(text) + "' is not host:port");
  }
  std::string_view host = text.substr(0, colon);
  if (host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host.empty() || host.find_first_of("[]") != std::string_view::npos) {
    return InvalidArgument("'" + std::string(text) + "' has no valid host");
  }
  int port = 0;
  const std::string_view digits = text.substr(colon + 1);
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), port);
  if (ec != std::errc() || end != digits.data() + digits.size() || port <= 0 || port > 65535) {
    return InvalidArgument("'" + std::string(text) + "' has no valid port");
  }
  return std::make_pair(std::string(host), port);
}

Result<std::unique_ptr<RedisConnection>> RedisConnection::Connect(const std::string& host, int port,
                                                                  RedisDeadline deadline, const AddressFilter& allow) {
  const std::string address = host + ":" + std::to_string(port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); rc != 0) {
    return Unavailable("cannot resolve redis node " + address + ": " + ::gai_strerror(rc));
  }
  Status last = Unavailable("no address for redis node " + address);
  bool dialled = false;
  std::string refused;  // an address `allow` refused, for the message
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    if (allow && !allow(a->ai_addr)) {
      char text[NI_MAXHOST] = {};
      ::getnameinfo(a->ai_addr, a->ai_addrlen, text, sizeof text, nullptr, 0, NI_NUMERICHOST);
      if (refused.empty()) refused = text;
      continue;
    }
    dialled = true;
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      last = ErrnoStatus("socket for redis node " + address, errno);
      continue;
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
      last = ErrnoStatus("connect to redis node " + address, errno);
      ::close(fd);
      continue;
    }
    pollfd p{fd, POLLOUT, 0};
    const int ready = ::poll(&p, 1, MillisLeft(deadline));
    if (ready == 0) {
      ::close(fd);
      ::freeaddrinfo(found);
      return TimedOut("connect to redis node " + address + " timed out");
    }
    int error = 0;
    socklen_t length = sizeof error;
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length);
    if (ready < 0 || error != 0) {
      last = ErrnoStatus("connect to redis node " + address, ready < 0 ? errno : error);
      ::close(fd);
      continue;
    }
    auto connection = std::unique_ptr<RedisConnection>(new RedisConnection(fd, address, a->ai_addr, a->ai_addrlen));
    ::freeaddrinfo(found);
    return connection;
  }
  ::freeaddrinfo(found);
  if (!dialled && !refused.empty()) {
    return PermissionDenied("redis node " + address + " resolves to " + refused + ", an address not allowed");
  }
  return last;
}

RedisConnection::RedisConnection(int fd, std::string address, const sockaddr* peer, socklen_t peer_length)
    : fd_(fd), address_(std::move(address)) {
  std::memcpy(&peer_, peer, std::min<size_t>(peer_length, sizeof peer_));
  buffer_.resize(kReadChunk);
}

RedisConnection::~RedisConnection() {
  if (fd_ >= 0) ::close(fd_);
}

Status RedisConnection::Fail(Status status) {
  broken_ = true;
  return Status(status.code(), "redis node " + address_ + ": " + status.message());
}

void RedisConnection::Append(std::span<const RespArg> args) {
  auto frame = [this](auto&&... text) {
    const size_t offset = framing_.size();
    (framing_.append(text), ...);
    pieces_.push_back(Piece{nullptr, offset, framing_.size() - offset});
  };
  std::string count = "*";
  AppendDecimal(count, static_cast<int64_t>(args.size()));
  count += "\r\n";
  frame(count);
  for (const RespArg& arg : args) {
    std::string length = "$";
    AppendDecimal(length, static_cast<int64_t>(arg.head.size() + arg.tail.size()));
    length += "\r\n";
    if (arg.tail.empty()) {
      frame(length, arg.head, std::string_view("\r\n"));
      continue;
    }
    frame(length, arg.head);
    pieces_.push_back(Piece{arg.tail.data(), 0, arg.tail.size()});
    frame(std::string_view("\r\n"));
  }
}

Status RedisConnection::Flush(RedisDeadline deadline) {
  if (broken_) return Unavailable("redis node " + address_ + ": connection failed earlier");
  std::vector<iovec> iov;
  iov.reserve(pieces_.size());
  for (const Piece& p : pieces_) {
    if (p.size == 0) continue;
    void* base = p.data != nullptr ? static_cast<void*>(const_cast<std::byte*>(p.data))
                                   : static_cast<void*>(framing_.data() + p.offset);
    iov.push_back(iovec{base, p.size});
  }
  size_t next = 0;
  Status result = Status::Ok();
  while (next < iov.size()) {
    const int count = static_cast<int>(std::min<size_t>(iov.size() - next, kMaxIov));
    msghdr message{};
    message.msg_iov = iov.data() + next;
    message.msg_iovlen = count;
    const ssize_t sent = ::sendmsg(fd_, &message, MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (Status s = WaitFor(POLLOUT, deadline); !s.ok()) {
          result = s;
          break;
        }
        continue;
      }
      result = Fail(ErrnoStatus("send", errno));
      break;
    }
    size_t left = static_cast<size_t>(sent);
    while (left > 0 && next < iov.size()) {
      if (left >= iov[next].iov_len) {
        left -= iov[next].iov_len;
        ++next;
      } else {
        iov[next].iov_base = static_cast<char*>(iov[next].iov_base) + left;
        iov[next].iov_len -= left;
        left = 0;
      }
    }
  }
  framing_.clear();
  pieces_.clear();
  return result;
}

Status RedisConnection::WaitFor(short events, RedisDeadline deadline) {
  for (;;) {
    const int millis = MillisLeft(deadline);
    if (millis == 0) return Fail(TimedOut("no answer before the deadline"));
    pollfd p{fd_, events, 0};
    const int ready = ::poll(&p, 1, millis);
    if (ready > 0) return Status::Ok();
    if (ready < 0 && errno != EINTR) return Fail(ErrnoStatus("poll", errno));
  }
}

Status RedisConnection::Fill(size_t n, RedisDeadline deadline) {
  if (broken_) return Unavailable("redis node " + address_ + ": connection failed earlier");
  while (end_ - begin_ < n) {
    if (begin_ > 0 && (buffer_.size() - end_ < kReadChunk || begin_ == end_)) {
      std::memmove(buffer_.data(), buffer_.data() + begin_, end_ - begin_);
      end_ -= begin_;
      begin_ = 0;
    }
    // Room grows toward n as bytes arrive, at most doubling what is already
    // buffered: a node that announces a 512 MiB bulk and sends nothing
    // costs a read chunk, not 512 MiB.
    const size_t missing = n - (end_ - begin_);
    const size_t room = std::min(missing, std::max(kReadChunk, end_ - begin_));
    if (buffer_.size() - end_ < room) buffer_.resize(end_ + std::max(kReadChunk, room));
    Result<size_t> got = Receive(buffer_.data() + end_, buffer_.size() - end_, deadline);
    if (!got.ok()) return got.status();
    end_ += *got;
  }
  return Status::Ok();
}

Result<size_t> RedisConnection::Receive(void* dst, size_t n, RedisDeadline deadline) {
  for (;;) {
    const ssize_t got = ::recv(fd_, dst, n, 0);
    if (got > 0) return static_cast<size_t>(got);
    if (got == 0) return Fail(Unavailable("connection closed by the peer"));
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return Fail(ErrnoStatus("recv", errno));
    if (Status s = WaitFor(POLLIN, deadline); !s.ok()) return s;
  }
}

Status RedisConnection::ReadExact(std::span<std::byte> dst, RedisDeadline deadline) {
  const size_t buffered = std::min(dst.size(), end_ - begin_);
  if (buffered > 0) std::memcpy(dst.data(), buffer_.data() + begin_, buffered);
  begin_ += buffered;
  size_t done = buffered;
  while (done < dst.size()) {
    Result<size_t> got = Receive(dst.data() + done, dst.size() - done, deadline);
    if (!got.ok()) return got.status();
    done += *got;
  }
  return Status::Ok();
}

Status RedisConnection::Skip(size_t n, RedisDeadline deadline) {
  while (n > 0) {
    if (end_ == begin_) {
      if (Status s = Fill(1, deadline); !s.ok()) return s;
    }
    const size_t take = std::min(n, end_ - begin_);
    begin_ += take;
    n -= take;
  }
  return Status::Ok();
}

Result<std::string> RedisConnection::ReadLine(RedisDeadline deadline) {
  size_t scanned = 0;
  for (;;) {
    const char* start = buffer_.data() + begin_;
    const size_t have = end_ - begin_;
    for (size_t i = scanned; i + 1 < have; ++i) {
      if (start[i] == '\r' && start[i + 1] == '\n') {
        std::string line(start, i);
        begin_ += i + 2;
        return line;
      }
    }
    scanned = have > 0 ? have - 1 : 0;
    if (have > 64 * 1024) return Fail(ProtocolError("reply line longer than 64 KiB"));
    if (Status s = Fill(have + 1, deadline); !s.ok()) return s;
  }
}

Result<RespReply> RedisConnection::ReadReply(RedisDeadline deadline, const RespLimits& limits) {
  int64_t elements_left = limits.max_elements;
  return ReadReplyAt(0, elements_left, limits, /*head_only=*/false, deadline);
}

Result<RespReply> RedisConnection::ReadReplyHead(RedisDeadline deadline, const RespLimits& limits) {
  int64_t elements_left = limits.max_elements;
  return ReadReplyAt(0, elements_left, limits, /*head_only=*/true, deadline);
}

Result<RespReply> RedisConnection::ReadReplyAt(int depth, int64_t& elements_left, const RespLimits& limits,
                                               bool head_only, RedisDeadline deadline) {
  Result<std::string> line = ReadLine(deadline);
  if (!line.ok()) return line.status();
  if (line->empty()) return Fail(ProtocolError("empty reply line"));
  RespReply reply;
  const std::string_view rest = std::string_view(*line).substr(1);
  auto number = [&]() -> Result<int64_t> {
    int64_t value = 0;
    auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), value);
    if (ec != std::errc() || end != rest.data() + rest.size()) {
      return Fail(ProtocolError("bad number in reply line '" + *line + "'"));
    }
    return value;
  };
  switch ((*line)[0]) {
    case '+':
      reply.type = RespReply::Type::kSimple;
      reply.text = rest;
      return reply;
    case '-':
      reply.type = RespReply::Type::kError;
      reply.text = rest;
      return reply;
    case ':': {
      Result<int64_t> n = number();
      if (!n.ok()) return n.status();
      reply.type = RespReply::Type::kInteger;
      reply.integer = *n;
      return reply;
    }
    case '$': {
      Result<int64_t> n = number();
      if (!n.ok()) return n.status();
      if (*n == -1) return reply;  // nil
      if (*n < 0 || *n > limits.max_bulk_bytes) {
        return Fail(ProtocolError("bulk length " + std::to_string(*n) + " out of range (at most " +
                                  std::to_string(limits.max_bulk_bytes) + ")"));
      }
      if (Status s = Fill(static_cast<size_t>(*n) + 2, deadline); !s.ok()) return s;
      const char* end = buffer_.data() + begin_ + *n;
      if (end[0] != '\r' || end[1] != '\n') return Fail(ProtocolError("bulk not ended by CRLF"));
      reply.type = RespReply::Type::kBulk;
      reply.text.assign(buffer_.data() + begin_, static_cast<size_t>(*n));
      begin_ += static_cast<size_t>(*n) + 2;
      return reply;
    }
    case '*': {
      Result<int64_t> n = number();
      if (!n.ok()) return n.status();
      if (*n == -1) return reply;  // nil array
      if (*n < 0 || depth >= kMaxDepth) {
        return Fail(ProtocolError("array of " + std::to_string(*n) + " elements at depth " + std::to_string(depth)));
      }
      reply.type = RespReply::Type::kArray;
      if (head_only && depth == 0) {
        reply.integer = *n;
        return reply;
      }
      if (*n > elements_left) {
        return Fail(ProtocolError("array of " + std::to_string(*n) + " elements exceeds the reply's bound of " +
                                  std::to_string(limits.max_elements)));
      }
      elements_left -= *n;
      // Reserved for what a real reply holds, not for what was announced:
      // the elements themselves must arrive before they take memory.
      reply.elements.reserve(static_cast<size_t>(std::min<int64_t>(*n, 1024)));
      for (int64_t i = 0; i < *n; ++i) {
        Result<RespReply> element = ReadReplyAt(depth + 1, elements_left, limits, head_only, deadline);
        if (!element.ok()) return element.status();
        reply.elements.push_back(std::move(*element));
      }
      return reply;
    }
    default:
      return Fail(ProtocolError("reply starts with '" + line->substr(0, 16) + "'"));
  }
}

Result<RespReply> RedisConnection::ReadBulkInto(std::span<std::byte> head, std::span<std::byte> body,
                                                RedisDeadline deadline) {
  if (Status s = Fill(1, deadline); !s.ok()) return s;
  if (buffer_[begin_] != '$') return ReadReply(deadline);
  Result<std::string> line = ReadLine(deadline);
  if (!line.ok()) return line.status();
  int64_t length = 0;
  auto [end, ec] = std::from_chars(line->data() + 1, line->data() + line->size(), length);
  if (ec != std::errc() || end != line->data() + line->size() || length < -1 || length > kMaxBulk) {
    return Fail(ProtocolError("bad bulk line '" + *line + "'"));
  }
  RespReply reply;
  if (length == -1) return reply;  // nil
  reply.type = RespReply::Type::kBulk;
  reply.integer = length;
  if (static_cast<uint64_t>(length) == head.size() + body.size()) {
    if (Status s = ReadExact(head, deadline); !s.ok()) return s;
    if (Status s = ReadExact(body, deadline); !s.ok()) return s;
  } else {
    if (Status s = Skip(static_cast<size_t>(length), deadline); !s.ok()) return s;
  }
  std::byte crlf[2];
  if (Status s = ReadExact(crlf, deadline); !s.ok()) return s;
  if (crlf[0] != std::byte{'\r'} || crlf[1] != std::byte{'\n'}) return Fail(ProtocolError("bulk not ended by CRLF"));
  return reply;
}

}  // namespace kvtier

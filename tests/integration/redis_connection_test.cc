// The remote tier's own Redis client against a scripted fake server on
// loopback: RedisConnection (tiers/remote/redis_connection.h) — the bytes a
// command puts on the wire, every RESP2 reply type, replies arriving whole,
// pipelined or in pieces, bulk replies landing in the caller's buffers,
// deadlines, a peer that hangs up, garbage — and ClusterClient
// (tiers/remote/cluster_client.h) routing over one or several fake nodes:
// MOVED, ASK, TRYAGAIN, CLUSTERDOWN, CLUSTER SLOTS, a plain Redis, a dead
// node.
//
// The fake server (tests/testing/fake_redis.h) answers each command the
// client sends with what the test's handler returns (possibly in pieces
// with short pauses, possibly then hanging up) and records every byte and
// command. Deadlines are short
// and only reached by the tests that wait for them.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/counters.h"
#include "tests/testing/counter_of.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/fake_redis.h"
#include "tiers/remote/cluster_client.h"
#include "tiers/remote/hash_slot.h"
#include "tiers/remote/redis_connection.h"

namespace kvtier::testing {
namespace {

using namespace std::chrono_literals;
using namespace std::string_literals;
using Clock = std::chrono::steady_clock;
using Command = FakeRedis::Command;

RedisDeadline Soon(std::chrono::milliseconds ms = 2000ms) { return Clock::now() + ms; }

// A port nothing listens on: bound (so no one else takes it) but not
// listening, so a connect is refused.
class ClosedPort {
 public:
  ClosedPort() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof address;
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
  }
  ~ClosedPort() { ::close(fd_); }
  int port() const { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  int fd_ = -1;
  int port_ = 0;
};

std::unique_ptr<RedisConnection> ConnectTo(const FakeRedis& server) {
  auto connection = RedisConnection::Connect("127.0.0.1", server.port(), Soon());
  EXPECT_TRUE(connection.ok()) << connection.status().ToString();
  return connection.ok() ? std::move(*connection) : nullptr;
}

// Appends `args` as one command.
void Append(RedisConnection& c, const Command& args) {
  std::vector<RespArg> pieces;
  for (const std::string& a : args) pieces.push_back(RespArg{a});
  c.Append(pieces);
}

// One command, flushed, and its reply.
Result<RespReply> Ask(RedisConnection& c, const Command& args, RedisDeadline deadline = Soon()) {
  Append(c, args);
  if (Status s = c.Flush(deadline); !s.ok()) return s;
  return c.ReadReply(deadline);
}

std::span<const std::byte> Bytes(std::string_view s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}
std::string Text(std::span<const std::byte> b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

// `bytes` cut at `at` (ascending offsets).
std::vector<std::string> Cut(const std::string& bytes, std::vector<size_t> at) {
  std::vector<std::string> pieces;
  size_t from = 0;
  for (size_t to : at) {
    pieces.push_back(bytes.substr(from, to - from));
    from = to;
  }
  pieces.push_back(bytes.substr(from));
  return pieces;
}

std::string Pattern(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + 17) & 0xff);  // \r and \n included
  return s;
}

// ---------------------------------------------------------------- wire

TEST(RedisConnectionTest, CommandsGoOutAsArraysOfBulkStringsWithTwoPieceArgumentsJoined) {
  FakeRedis server([](const Command&) { return Say("+OK\r\n"); });
  auto c = ConnectTo(server);
  ASSERT_NE(c, nullptr);
  const std::string head = "HEAD";
  const std::string tail = "\0\x01\r\nxyz"s;  // binary, CRLF inside
  const std::string empty;
  const RespArg set[] = {{"SET"}, {"kvtier:k"}, {head, Bytes(tail)}};
  const RespArg tail_only[] = {{"APPEND"}, {"", Bytes(tail)}, {empty}};
  c->Append(set);
  c->Append(tail_only);  // a pipeline: both in one flush
  ASSERT_TRUE(c->Flush(Soon()).ok());
  for (int i = 0; i < 2; ++i) {
    auto reply = c->ReadReply(Soon());
    ASSERT_TRUE(reply.ok()) << reply.status().ToString();
    EXPECT_EQ(reply->type, RespReply::Type::kSimple);
  }
  EXPECT_EQ(server.received(),
            "*3\r\n$3\r\nSET\r\n$8\r\nkvtier:k\r\n$11\r\nHEAD\0\x01\r\nxyz\r\n"
            "*3\r\n$6\r\nAPPEND\r\n$7\r\n\0\x01\r\nxyz\r\n$0\r\n\r\n"s);
  ASSERT_EQ(server.commands().size(), 2u);
  EXPECT_EQ(server.commands()[0][2], head + tail);
}

// ---------------------------------------------------------------- replies

TEST(RedisConnectionTest, ParsesEveryReplyType) {
  const std::map<std::string, std::string> replies = {
      {"simple", "+PONG\r\n"},
      {"error", "-ERR wrong number of arguments\r\n"},
      {"integer", ":-42\r\n"},
      {"bulk", "$5\r\nhello\r\n"},
      {"empty", "$0\r\n\r\n"},
      {"binary", "$8\r\na\r\nb\0c\r\n\r\n"s},
      {"nil", "$-1\r\n"},
      {"nil_array", "*-1\r\n"},
      {"empty_array", "*0\r\n"},
      {"nested", "*4\r\n:1\r\n*3\r\n+a\r\n$-1\r\n*1\r\n$2\r\nzz\r\n-ERR inner\r\n$3\r\nend\r\n"},
  };
  FakeRedis server([&](const Command& c) { return Say(replies.at(c[1])); });
  auto c = ConnectTo(server);
  ASSERT_NE(c, nullptr);
  auto ask = [&](const std::string& what) {
    auto reply = Ask(*c, {"GET", what});
    EXPECT_TRUE(reply.ok()) << what << ": " << reply.status().ToString();
    return reply.ok() ? *reply : RespReply{};
  };
  using T = RespReply::Type;
  RespReply r = ask("simple");
  EXPECT_EQ(r.type, T::kSimple);
  EXPECT_EQ(r.text, "PONG");
  r = ask("error");
  EXPECT_EQ(r.type, T::kError);
  EXPECT_TRUE(r.is_error());
  EXPECT_EQ(r.text, "ERR wrong number of arguments");
  r = ask("integer");
  EXPECT_EQ(r.type, T::kInteger);
  EXPECT_EQ(r.integer, -42);
  r = ask("bulk");
  EXPECT_EQ(r.type, T::kBulk);
  EXPECT_EQ(r.text, "hello");
  r = ask("empty");
  EXPECT_EQ(r.type, T::kBulk);
  EXPECT_EQ(r.text, "");
  r = ask("binary");
  EXPECT_EQ(r.type, T::kBulk);
  EXPECT_EQ(r.text, "a\r\nb\0c\r\n"s);
  EXPECT_EQ(ask("nil").type, T::kNil);
  EXPECT_EQ(ask("nil_array").type, T::kNil);
  r = ask("empty_array");
  EXPECT_EQ(r.type, T::kArray);
  EXPECT_TRUE(r.elements.empty());
  r = ask("nested");
  ASSERT_EQ(r.type, T::kArray);
  ASSERT_EQ(r.elements.size(), 4u);
  EXPECT_EQ(r.elements[0].integer, 1);
  const RespReply& inner = r.elements[1];
  ASSERT_EQ(inner.type, T::kArray);
  ASSERT_EQ(inner.elements.size(), 3u);
  EXPECT_EQ(inner.elements[0].text, "a");
  EXPECT_EQ(inner.elements[1].type, T::kNil);
  ASSERT_EQ(inner.elements[2].type, T::kArray);
  ASSERT_EQ(inner.elements[2].elements.size(), 1u);
  EXPECT_EQ(inner.elements[2].elements[0].text, "zz");
  EXPECT_EQ(r.elements[2].type, T::kError);
  EXPECT_EQ(r.elements[2].text, "ERR inner");
  EXPECT_EQ(r.elements[3].text, "end");
  EXPECT_FALSE(c->broken());
}

// Three commands pipelined; `reply` answers them all (to the first one).
void ExpectThreeRepliesInOrder(FakeRedis::Reply reply) {
  bool first = true;
  FakeRedis server([&](const Command&) {
    if (!std::exchange(first, false)) return FakeRedis::Reply{};
    return reply;
  });
  auto c = ConnectTo(server);
  ASSERT_NE(c, nullptr);
  for (const char* key : {"a", "b", "c"}) Append(*c, {"GET", key});
  ASSERT_TRUE(c->Flush(Soon()).ok());
  auto one = c->ReadReply(Soon());
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_EQ(one->text, "first");
  auto two = c->ReadReply(Soon());
  ASSERT_TRUE(two.ok()) << two.status().ToString();
  EXPECT_EQ(two->integer, 2);
  std::array<std::byte, 3> head{};
  std::array<std::byte, 2> body{};
  auto three = c->ReadBulkInto(head, body, Soon());
  ASSERT_TRUE(three.ok()) << three.status().ToString();
  EXPECT_EQ(Text(head) + Text(body), "th\r\nd");
  EXPECT_FALSE(c->broken());
}

TEST(RedisConnectionTest, PipelinedRepliesInOneWrite) {
  ExpectThreeRepliesInOrder(Say("+first\r\n:2\r\n$5\r\nth\r\nd\r\n"));
}

TEST(RedisConnectionTest, PipelinedRepliesSplitAcrossWrites) {
  // Cuts inside a type byte's line, inside CRLFs, inside a bulk's length
  // and payload: each piece is a separate segment (TCP_NODELAY and a pause).
  ExpectThreeRepliesInOrder(FakeRedis::Reply{{"+fir", "st\r", "\n:", "2\r\n$", "5\r\nth\r", "\nd", "\r", "\n"}, 5ms});
}

TEST(RedisConnectionTest, ALargeBulkArrivingInPiecesIsReassembled) {
  // Over three times the connection's 64 KiB read buffer, cut inside its
  // length line, its payload and its CRLF, and followed by another reply.
  const std::string value = Pattern(200 * 1024 + 3);
  const std::string whole = "$" + std::to_string(value.size()) + "\r\n" + value + "\r\n:7\r\n";
  FakeRedis server([&](const Command& c) {
    if (c[0] != "GET") return FakeRedis::Reply{};
    return FakeRedis::Reply{Cut(whole, {3, 40, 70 * 1024, whole.size() - 5, whole.size() - 4}), 3ms};
  });
  auto c = ConnectTo(server);
  ASSERT_NE(c, nullptr);
  Append(*c, {"GET", "big"});
  Append(*c, {"INCR", "n"});
  ASSERT_TRUE(c->Flush(Soon()).ok());
  auto big = c->ReadReply(Soon());
  ASSERT_TRUE(big.ok()) << big.status().ToString();
  EXPECT_EQ(big->type, RespReply::Type::kBulk);
  EXPECT_TRUE(big->text == value) << "the value arrived altered (" << big->text.size() << " bytes)";
  auto next = c->ReadReply(Soon());
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(next->integer, 7);
}

// ---------------------------------------------------------------- ReadBulkInto

TEST(RedisConnectionTest, ReadBulkIntoLandsTheBytesInHeadThenBody) {
  const std::string value = Pattern(64);
  FakeRedis server([&](const Command&) { return Say("$64\r\n" + value + "\r\n"); });
  auto c = ConnectTo(server);
  ASSERT_NE(c, nullptr);
  Append(*c, {"GET", "k"});
  ASSERT_TRUE(c->Flush(Soon()).ok());
  std::array<std::byte, 24> head{};
  std::array<std::byte, 40> body{};
  auto reply = c->ReadBulkInto(head, body, Soon());
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ(reply->type, RespReply::Type::kBulk);
  EXPECT_EQ(reply->integer, 64);
  EXPECT_TRUE(reply->text.empty()) << "the bytes go to the caller's buffers, not the reply";
  EXPECT_EQ(Text(head), value.substr(0, 24));
  EXPECT_EQ(Text(body), value.substr(24));
}

TEST(RedisConnectionTest, ReadBulkIntoTakesALargeValueArrivingInPiecesThenStaysInStep) {
  // Larger than the connection's 64 KiB read buffer: most of it is read
  // straight from the socket into `body`.
  const std::string value = Pattern(300 * 1024 + 7);
  const std::string whole = "$" + std::to_string(value.size()) + "\r\n" + value + "\r\n+next\r\n";
  FakeRedis server([&](const Command& c) {
    if (c[0] != "GET") return FakeRedis::Reply{};
    // Cut inside the bulk line, the payload, and the next reply's line.
    return FakeRedis::Reply{Cut(whole, {30, 30 + 100 * 1024, whole.size() - 6, whole.size() - 3}), 3ms};
  });
  auto c = ConnectTo(server);
  ASSERT_NE(c, nullptr);
  Append(*c, {"GET", "big"});
  Append(*c, {"PING"});
  ASSERT_TRUE(c->Flush(Soon()).ok());
  std::vector<std::byte> head(72), body(value.size() - 72);
  auto reply = c->ReadBulkInto(head, body, Soon());
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ(reply->integer, int64_t(value.size()));
  EXPECT_TRUE(Text(head) + Text(body) == value) << "the value arrived altered";
  auto next = c->ReadReply(Soon());
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(next->text, "next");
}

TEST(RedisConnectionTest, ReadBulkIntoSkipsABulkOfAnotherLengthAndStaysInStep) {
  const std::string big = Pattern(200 * 1024);
  FakeRedis server([&](const Command& c) -> FakeRedis::Reply {
    if (c[1] == "short") return Say("$5\r\nhello\r\n");
    if (c[1] == "big")
      return FakeRedis::Reply{
          {"$" + std::to_string(big.size()) + "\r\n" + big.substr(0, 1000), big.substr(1000) + "\r\n"}, 3ms};
    if (c[1] == "nil") return Say("$-1\r\n");
    if (c[1] == "error") return Say("-MOVED 12 127.0.0.1:1\r\n");
    return Say("$3\r\nabc\r\n");
  });
  auto c = ConnectTo(server);
  ASSERT_NE(c, nullptr);
  for (const char* key : {"short", "right", "big", "nil", "error", "right"}) Append(*c, {"GET", key});
  ASSERT_TRUE(c->Flush(Soon()).ok());
  std::array<std::byte, 2> head;
  std::array<std::byte, 1> body;
  auto read = [&] {
    head.fill(std::byte{0xee});
    body.fill(std::byte{0xee});
    auto reply = c->ReadBulkInto(head, body, Soon());
    EXPECT_TRUE(reply.ok()) << reply.status().ToString();
    return reply.ok() ? *reply : RespReply{};
  };
  RespReply r = read();
  EXPECT_EQ(r.type, RespReply::Type::kBulk);
  EXPECT_EQ(r.integer, 5) << "a bulk of another length reports its length";
  EXPECT_EQ(Text(head) + Text(body), "\xee\xee\xee") << "and leaves the buffers alone";
  r = read();
  EXPECT_EQ(r.integer, 3);
  EXPECT_EQ(Text(head) + Text(body), "abc");
  r = read();
  EXPECT_EQ(r.integer, int64_t(big.size()));
  EXPECT_EQ(Text(head) + Text(body), "\xee\xee\xee");
  EXPECT_EQ(read().type, RespReply::Type::kNil);
  r = read();
  EXPECT_EQ(r.type, RespReply::Type::kError);
  EXPECT_EQ(r.text, "MOVED 12 127.0.0.1:1");
  r = read();
  EXPECT_EQ(r.integer, 3);
  EXPECT_EQ(Text(head) + Text(body), "abc");
  EXPECT_FALSE(c->broken());
}

// ---------------------------------------------------------------- failures

TEST(RedisConnectionTest, ASilentServerTimesOutAtTheDeadlineAndBreaksTheConnection) {
  FakeRedis server([](const Command&) { return FakeRedis::Reply{}; });
  auto c = ConnectTo(server);
  ASSERT_NE(c, nullptr);
  const auto start = Clock::now();
  auto reply = Ask(*c, {"GET", "k"}, Soon(100ms));
  const auto waited = Clock::now() - start;
  ASSERT_FALSE(reply.ok());
  EXPECT_EQ(reply.status().code(), StatusCode::kTimedOut) << reply.status().ToString();
  EXPECT_GE(waited, 90ms);
  EXPECT_LT(waited, 2s);
  EXPECT_TRUE(c->broken());
  // Half a reply may be on its way: nothing more is read from it.
  auto again = c->ReadReply(Soon());
  EXPECT_EQ(again.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(c->Flush(Soon()).code(), StatusCode::kUnavailable);

  // The same for a bulk read into buffers, the server stopping mid-value.
  FakeRedis stalls([](const Command&) { return Say("$10\r\nabc"); });
  auto d = ConnectTo(stalls);
  ASSERT_NE(d, nullptr);
  Append(*d, {"GET", "k"});
  ASSERT_TRUE(d->Flush(Soon()).ok());
  std::array<std::byte, 10> body{};
  auto bulk = d->ReadBulkInto({}, body, Soon(100ms));
  EXPECT_EQ(bulk.status().code(), StatusCode::kTimedOut) << bulk.status().ToString();
  EXPECT_TRUE(d->broken());
}

// The process's peak resident memory (VmHWM), in bytes.
int64_t PeakResidentBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

TEST(RedisConnectionTest, ALengthAnnouncedButNotSentCostsNoMemory) {
  // A hostile or broken node answers with the largest bulk length and the
  // most array elements a reply may announce, then sends nothing more: the
  // read times out, and memory grows with bytes received, not announced.
  FakeRedis server([](const Command& c) { return Say(c[1] == "bulk" ? "$536870000\r\n" : "*65536\r\n"); });
  const int64_t before = PeakResidentBytes();
  ASSERT_GT(before, 0);
  for (const char* what : {"bulk", "array", "bulk", "array"}) {
    auto c = ConnectTo(server);
    ASSERT_NE(c, nullptr);
    auto reply = Ask(*c, {"GET", what}, Soon(150ms));
    EXPECT_EQ(reply.status().code(), StatusCode::kTimedOut) << what << ": " << reply.status().ToString();
  }
  EXPECT_LT(PeakResidentBytes() - before, int64_t{32} << 20) << "memory was taken for what was only announced";
}

TEST(RedisConnectionTest, APeerClosingMidReplyIsUnavailable) {
  std::map<std::string, FakeRedis::Reply> replies = {
      {"line", FakeRedis::Reply{{"+OK"}, 0ms, true}},
      {"bulk", FakeRedis::Reply{{"$10\r\nabc"}, 0ms, true}},
      {"array", FakeRedis::Reply{{"*3\r\n:1\r\n"}, 0ms, true}},
      {"nothing", FakeRedis::Reply{{}, 0ms, true}},
  };
  FakeRedis server([&](const Command& c) { return replies.at(c[1]); });
  for (const auto& entry : replies) {
    const std::string& what = entry.first;
    auto c = ConnectTo(server);
    ASSERT_NE(c, nullptr);
    auto reply = Ask(*c, {"GET", what});
    ASSERT_FALSE(reply.ok()) << what;
    EXPECT_EQ(reply.status().code(), StatusCode::kUnavailable) << what << ": " << reply.status().ToString();
    EXPECT_NE(reply.status().message().find(server.address()), std::string::npos) << reply.status().ToString();
    EXPECT_TRUE(c->broken()) << what;
  }
  // Into buffers: the length matched, the payload stopped short.
  auto c = ConnectTo(server);
  ASSERT_NE(c, nullptr);
  Append(*c, {"GET", "bulk"});
  ASSERT_TRUE(c->Flush(Soon()).ok());
  std::array<std::byte, 4> head{};
  std::array<std::byte, 6> body{};
  auto bulk = c->ReadBulkInto(head, body, Soon());
  EXPECT_EQ(bulk.status().code(), StatusCode::kUnavailable) << bulk.status().ToString();
  EXPECT_TRUE(c->broken());
}

TEST(RedisConnectionTest, GarbageRepliesAreProtocolErrors) {
  std::string too_deep;
  for (int i = 0; i < 100; ++i) too_deep += "*1\r\n";
  too_deep += ":1\r\n";
  const std::vector<std::string> garbage = {
      "?x\r\n",                           // no such type
      "\r\n",                             // an empty line
      ":12x\r\n",                         // a bad integer
      ":\r\n",                            //
      "$abc\r\n",                         // a bad length
      "$-2\r\n",                          //
      "*1x\r\n",                          //
      "*-2\r\n",                          //
      "$536870913\r\n",                   // 512 MiB + 1: refused before waiting for it
      "$99999999999999999999\r\n",        // overflows
      too_deep,                           // nested past any real reply
      "$3\r\nabcXY\r\n",                  // a bulk not ended by CRLF
      "*2\r\n:1\r\n!x\r\n",               // garbage inside an array
      "+" + std::string(70 * 1024, 'a'),  // a line without end
      "*65537\r\n",                       // more elements than a reply may hold
      "*40000\r\n*40000\r\n",             // the same, nested: refused at the second count
  };
  FakeRedis server([&](const Command& c) { return Say(garbage.at(std::stoul(c[1]))); });
  for (size_t i = 0; i < garbage.size(); ++i) {
    auto c = ConnectTo(server);
    ASSERT_NE(c, nullptr);
    auto reply = Ask(*c, {"GET", std::to_string(i)});
    ASSERT_FALSE(reply.ok()) << "case " << i << " parsed";
    EXPECT_EQ(reply.status().code(), StatusCode::kProtocolError) << "case " << i << ": " << reply.status().ToString();
    EXPECT_TRUE(c->broken()) << "case " << i;
  }
  // ReadBulkInto checks its bulk line and terminator too.
  for (size_t i : {size_t{4}, size_t{8}, size_t{9}, size_t{11}, size_t{0}}) {
    auto c = ConnectTo(server);
    ASSERT_NE(c, nullptr);
    Append(*c, {"GET", std::to_string(i)});
    ASSERT_TRUE(c->Flush(Soon()).ok());
    std::array<std::byte, 3> body{};
    auto reply = c->ReadBulkInto({}, body, Soon());
    EXPECT_EQ(reply.status().code(), StatusCode::kProtocolError) << "case " << i << ": " << reply.status().ToString();
    EXPECT_TRUE(c->broken()) << "case " << i;
  }
}

TEST(RedisConnectionTest, ArraysAsDeepAsClusterSlotsParse) {
  // CLUSTER SLOTS: an array of ranges, each holding arrays of nodes, one
  // of which holds a map (Redis 7 metadata): four levels.
  const std::string reply =
      "*1\r\n*3\r\n:0\r\n:16383\r\n*4\r\n$9\r\n127.0.0.1\r\n:7000\r\n$2\r\nid\r\n*2\r\n+k\r\n+v\r\n";
  FakeRedis server([&](const Command&) { return Say(reply); });
  auto c = ConnectTo(server);
  ASSERT_NE(c, nullptr);
  auto r = Ask(*c, {"CLUSTER", "SLOTS"});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->elements.at(0).elements.at(2).elements.at(3).elements.at(1).text, "v");
}

TEST(RedisConnectionTest, ConnectingToAClosedPortIsUnavailable) {
  ClosedPort closed;
  auto c = RedisConnection::Connect("127.0.0.1", closed.port(), Soon());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kUnavailable) << c.status().ToString();
  EXPECT_NE(c.status().message().find(closed.address()), std::string::npos) << c.status().ToString();
}

TEST(RedisConnectionTest, ParseRedisAddressTakesHostPortAndBracketedV6) {
  using P = std::pair<std::string, int>;
  EXPECT_EQ(ParseRedisAddress("127.0.0.1:6379").value(), P("127.0.0.1", 6379));
  EXPECT_EQ(ParseRedisAddress("redis-0.cache.svc:7000").value(), P("redis-0.cache.svc", 7000));
  EXPECT_EQ(ParseRedisAddress("[::1]:6379").value(), P("::1", 6379));
  EXPECT_EQ(ParseRedisAddress("[fe80::1%eth0]:1").value(), P("fe80::1%eth0", 1));
  EXPECT_EQ(ParseRedisAddress("h:65535").value(), P("h", 65535));
  for (const char* bad : {"", "6379", "host", "host:", ":6379", "host:0", "host:65536", "host:-1", "host:+1",
                          "host:12x", "host: 1", "host:99999999999", "[::1]", "[]:6379", "[::1:6379", "::1]:6379"}) {
    auto parsed = ParseRedisAddress(bad);
    ASSERT_FALSE(parsed.ok()) << "'" << bad << "' parsed as " << parsed->first << " port " << parsed->second;
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(parsed.status().message().find(bad), std::string::npos) << parsed.status().ToString();
  }
}

// ---------------------------------------------------------------- ClusterClient

// The clients' clock (their pauses before TRYAGAIN's retries): stateless,
// shared by the tests that do not drive a FakeClock.
const SystemClock kClock{};

std::unique_ptr<ClusterClient> Cluster(std::vector<std::string> seeds, std::chrono::milliseconds node_retry = 500ms,
                                       const kvtier::Clock& clock = kClock) {
  ClusterOptions options;
  options.seeds = std::move(seeds);
  options.connect_timeout = 500ms;
  options.node_retry = node_retry;
  auto client = ClusterClient::Create(options, clock);
  EXPECT_TRUE(client.ok()) << client.status().ToString();
  return client.ok() ? std::move(*client) : nullptr;
}

// GET `key`, as the remote tier runs a command through the client.
ClusterClient::Command Get(std::string key) {
  return [key = std::move(key)](RedisConnection& c) -> Result<RespReply> {
    const RespArg args[] = {{"GET"}, {key}};
    c.Append(args);
    if (Status s = c.Flush(Soon()); !s.ok()) return s;
    return c.ReadReply(Soon());
  };
}

Result<RespReply> RunGet(ClusterClient& client, const std::string& key) { return client.Run(key, Get(key), Soon()); }

// A key whose slot is in [first, last].
std::string KeyInSlots(uint16_t first, uint16_t last) {
  for (int i = 0;; ++i) {
    std::string key = "key:" + std::to_string(i);
    const uint16_t slot = HashSlot(key);
    if (slot >= first && slot <= last) return key;
  }
}

// The GETs a server saw, by key.
std::vector<std::string> GetsSeen(const FakeRedis& server) {
  std::vector<std::string> keys;
  for (const Command& c : server.commands()) {
    if (c[0] == "GET") keys.push_back(c[1]);
  }
  return keys;
}

TEST(ClusterClientTest, CreateWantsSeedsThatAreAddresses) {
  EXPECT_EQ(ClusterClient::Create(ClusterOptions{}, kClock).status().code(), StatusCode::kInvalidArgument);
  ClusterOptions options;
  options.seeds = {"127.0.0.1:7000", "no-port"};
  EXPECT_EQ(ClusterClient::Create(options, kClock).status().code(), StatusCode::kInvalidArgument);
}

TEST(ClusterClientTest, MovedSendsTheCommandToTheNamedNodeAndLaterOnesStraightThere) {
  FakeRedis owner([](const Command& c) { return Say("$5\r\nvalue\r\n"); });
  FakeRedis seed([&](const Command& c) {
    return Say("-MOVED " + std::to_string(HashSlot(c[1])) + " " + owner.address() + "\r\n");
  });
  auto client = Cluster({seed.address()});
  ASSERT_NE(client, nullptr);
  const std::string key = "kvtier:v1:moved";
  for (int i = 0; i < 3; ++i) {
    auto reply = RunGet(*client, key);
    ASSERT_TRUE(reply.ok()) << reply.status().ToString();
    EXPECT_EQ(reply->text, "value");
  }
  EXPECT_EQ(GetsSeen(seed).size(), 1u) << "after MOVED the slot's commands go to its owner";
  EXPECT_EQ(GetsSeen(owner), std::vector<std::string>(3, key));
  EXPECT_EQ(CounterOf(*client, "remote.cluster.moved"), 1);
  EXPECT_EQ(CounterOf(*client, "remote.cluster.nodes"), 2);
  // Another slot still goes to the seed (the map only learned one slot).
  const std::string other = KeyInSlots((HashSlot(key) + 1) % kClusterSlots, (HashSlot(key) + 1) % kClusterSlots);
  ASSERT_TRUE(RunGet(*client, other).ok());
  EXPECT_EQ(GetsSeen(seed).size(), 2u);
  EXPECT_EQ(CounterOf(*client, "remote.cluster.moved"), 2);
}

TEST(ClusterClientTest, MovedWithoutAHostMeansTheHostThatAnswered) {
  // Redis 7 with cluster-preferred-endpoint-type unknown-endpoint: "MOVED 3999 :6380".
  FakeRedis owner([](const Command&) { return Say("+there\r\n"); });
  FakeRedis seed([&](const Command& c) {
    return Say("-MOVED " + std::to_string(HashSlot(c[1])) + " :" + std::to_string(owner.port()) + "\r\n");
  });
  auto client = Cluster({seed.address()});
  ASSERT_NE(client, nullptr);
  auto reply = RunGet(*client, "k");
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ(reply->text, "there");
  EXPECT_EQ(GetsSeen(owner).size(), 1u);
  const auto nodes = client->Nodes();
  EXPECT_NE(std::find(nodes.begin(), nodes.end(), owner.address()), nodes.end());
}

TEST(ClusterClientTest, AMalformedRedirectIsAProtocolError) {
  for (const std::string redirect : {"MOVED abc 127.0.0.1:1", "MOVED 99999999999999999999 127.0.0.1:1",
                                     "MOVED 16384 127.0.0.1:1", "ASK 12", "MOVED 12 127.0.0.1"}) {
    FakeRedis seed([&](const Command&) { return Say("-" + redirect + "\r\n"); });
    auto client = Cluster({seed.address()});
    ASSERT_NE(client, nullptr);
    auto reply = RunGet(*client, "k");
    ASSERT_FALSE(reply.ok()) << redirect;
    EXPECT_EQ(reply.status().code(), StatusCode::kProtocolError) << redirect << ": " << reply.status().ToString();
  }
}

TEST(ClusterClientTest, AskSendsAskingThenTheCommandToTheTargetOnceAndKeepsTheMap) {
  FakeRedis target([](const Command& c) { return Say(c[0] == "ASKING" ? "+OK\r\n" : "$8\r\nmigrated\r\n"); });
  std::atomic<int> gets{0};
  FakeRedis seed([&](const Command& c) {
    if (gets++ == 0) return Say("-ASK " + std::to_string(HashSlot(c[1])) + " " + target.address() + "\r\n");
    return Say("$4\r\nhome\r\n");
  });
  auto client = Cluster({seed.address()});
  ASSERT_NE(client, nullptr);
  auto first = RunGet(*client, "k");
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->text, "migrated");
  EXPECT_EQ(target.commands(), (std::vector<Command>{{"ASKING"}, {"GET", "k"}}));
  auto second = RunGet(*client, "k");
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(second->text, "home") << "ASK redirects one command; the slot stays with its node";
  EXPECT_EQ(GetsSeen(seed).size(), 2u);
  EXPECT_EQ(target.commands().size(), 2u);
  EXPECT_EQ(CounterOf(*client, "remote.cluster.asked"), 1);
  EXPECT_EQ(CounterOf(*client, "remote.cluster.moved"), 0);
}

TEST(ClusterClientTest, TryAgainIsRetriedOnTheSameNode) {
  std::atomic<int> gets{0};
  FakeRedis seed([&](const Command&) {
    if (gets++ < 2) return Say("-TRYAGAIN Multiple keys request during rehashing of slot\r\n");
    return Say("+OK\r\n");
  });
  auto client = Cluster({seed.address()});
  ASSERT_NE(client, nullptr);
  auto reply = RunGet(*client, "k");
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ(reply->text, "OK");
  EXPECT_EQ(GetsSeen(seed).size(), 3u);
  EXPECT_EQ(CounterOf(*client, "remote.cluster.try_again"), 2);
  EXPECT_EQ(CounterOf(*client, "remote.cluster.retries"), 2);
}

// The pause before TRYAGAIN's retry is a wait on the client's clock: the
// command goes out again once that clock reaches the pause's end, not
// before.
TEST(ClusterClientTest, TryAgainWaitsOnTheClientsClock) {
  FakeClock clock;
  std::atomic<int> gets{0};
  FakeRedis seed([&](const Command&) {
    if (gets++ == 0) return Say("-TRYAGAIN Multiple keys request during rehashing of slot\r\n");
    return Say("+OK\r\n");
  });
  auto client = Cluster({seed.address()}, 500ms, clock);
  ASSERT_NE(client, nullptr);
  const uint64_t started_us = clock.NowUs();
  Result<RespReply> reply = Unavailable("not run");
  std::thread run([&] { reply = RunGet(*client, "k"); });
  const uint64_t retry_at = clock.AwaitWaiter();  // the command waits for its retry's time
  EXPECT_EQ(retry_at, started_us + 10'000);
  EXPECT_EQ(gets.load(), 1) << "sent again before the pause ended";
  clock.SetUs(retry_at);
  run.join();
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ(reply->text, "OK");
  EXPECT_EQ(GetsSeen(seed).size(), 2u);
  EXPECT_EQ(CounterOf(*client, "remote.cluster.try_again"), 1);
}

TEST(ClusterClientTest, ClusterDownIsUnavailableAtOnceAndOtherErrorsAreReplies) {
  FakeRedis seed([](const Command& c) {
    return Say(c[1] == "down" ? "-CLUSTERDOWN The cluster is down\r\n" : "-WRONGTYPE Operation against a key\r\n");
  });
  auto client = Cluster({seed.address()});
  ASSERT_NE(client, nullptr);
  auto down = RunGet(*client, "down");
  ASSERT_FALSE(down.ok());
  EXPECT_EQ(down.status().code(), StatusCode::kUnavailable) << down.status().ToString();
  EXPECT_EQ(GetsSeen(seed).size(), 1u) << "not retried";
  auto wrong = RunGet(*client, "wrong");
  ASSERT_TRUE(wrong.ok()) << wrong.status().ToString();
  EXPECT_TRUE(wrong->is_error());
  EXPECT_EQ(wrong->text, "WRONGTYPE Operation against a key");
}

// CLUSTER SLOTS of a two-master cluster: [0, 8191] on `low` (which is also
// the seed), [8192, 16383] on `high` (given with an empty host: the host
// of the node asked) with a replica.
std::string SlotsReply(int low_port, int high_port, int replica_port) {
  auto node = [](const std::string& host, int port) {
    return "*3\r\n$" + std::to_string(host.size()) + "\r\n" + host + "\r\n:" + std::to_string(port) +
           "\r\n$4\r\nnode\r\n";
  };
  return "*2\r\n"
         "*3\r\n:0\r\n:8191\r\n" +
         node("127.0.0.1", low_port) + "*4\r\n:8192\r\n:16383\r\n" + node("", high_port) +
         node("127.0.0.1", replica_port);
}

TEST(ClusterClientTest, ClusterSlotsRoutesEachKeyToItsSlotsMaster) {
  ClosedPort replica;
  FakeRedis high([](const Command& c) { return Say("+high\r\n"); });
  std::atomic<int> low_port{0};
  FakeRedis low([&](const Command& c) {
    if (c[0] == "CLUSTER") return Say(SlotsReply(low_port, high.port(), replica.port()));
    return Say("+low\r\n");
  });
  low_port = low.port();
  auto client = Cluster({low.address()});
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Refresh(Soon()).ok());
  EXPECT_EQ(low.commands().at(0), (Command{"CLUSTER", "SLOTS"}));
  auto nodes = client->Nodes();
  std::sort(nodes.begin(), nodes.end());
  auto expected = std::vector<std::string>{low.address(), high.address(), replica.address()};
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(nodes, expected) << "masters and replicas are learned";

  // The edges of both ranges, and a slot inside each.
  const std::vector<std::string> low_keys = {KeyInSlots(0, 0), KeyInSlots(4000, 4100), KeyInSlots(8191, 8191)};
  const std::vector<std::string> high_keys = {KeyInSlots(8192, 8192), KeyInSlots(12000, 12100),
                                              KeyInSlots(16383, 16383)};
  for (const auto& k : low_keys) {
    auto reply = RunGet(*client, k);
    ASSERT_TRUE(reply.ok()) << reply.status().ToString();
    EXPECT_EQ(reply->text, "low") << k << " in slot " << HashSlot(k);
  }
  for (const auto& k : high_keys) {
    auto reply = RunGet(*client, k);
    ASSERT_TRUE(reply.ok()) << reply.status().ToString();
    EXPECT_EQ(reply->text, "high") << k << " in slot " << HashSlot(k);
  }
  EXPECT_EQ(GetsSeen(low), low_keys);
  EXPECT_EQ(GetsSeen(high), high_keys);
  EXPECT_EQ(CounterOf(*client, "remote.cluster.map_refreshes"), 1);
  EXPECT_EQ(CounterOf(*client, "remote.cluster.moved"), 0);
  EXPECT_EQ(CounterOf(*client, "remote.cluster.connect_failures"), 0) << "the replica is never asked";
}

TEST(ClusterClientTest, APlainRedisIsOneNodeOwningEverySlot) {
  // The first seed is dead; node_retry 0 makes any command routed to it
  // try (and fail) a connect again, which the counter would show.
  ClosedPort dead;
  FakeRedis plain([](const Command& c) {
    if (c[0] == "CLUSTER") return Say("-ERR This instance has cluster support disabled\r\n");
    return Say("+plain\r\n");
  });
  auto client = Cluster({dead.address(), plain.address()}, 0ms);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Refresh(Soon()).ok());
  EXPECT_EQ(CounterOf(*client, "remote.cluster.connect_failures"), 1) << "the dead seed was tried first";
  for (const auto& k : {KeyInSlots(0, 10), KeyInSlots(5000, 6000), KeyInSlots(16300, 16383)}) {
    auto reply = RunGet(*client, k);
    ASSERT_TRUE(reply.ok()) << reply.status().ToString();
    EXPECT_EQ(reply->text, "plain");
  }
  EXPECT_EQ(GetsSeen(plain).size(), 3u);
  EXPECT_EQ(CounterOf(*client, "remote.cluster.connect_failures"), 1) << "no command went to the dead seed";
  EXPECT_EQ(CounterOf(*client, "remote.cluster.map_refreshes"), 1);
}

// The skip is time on the client's clock: a node that failed a connect is
// not dialled again until that clock passed node_retry, and is then.
TEST(ClusterClientTest, ADeadNodeIsSkippedForNodeRetry) {
  ClosedPort dead;
  FakeClock clock;
  auto client = Cluster({dead.address()}, 60s, clock);
  ASSERT_NE(client, nullptr);
  auto first = RunGet(*client, "k");
  ASSERT_FALSE(first.ok());
  EXPECT_EQ(first.status().code(), StatusCode::kUnavailable) << first.status().ToString();
  EXPECT_EQ(CounterOf(*client, "remote.cluster.connect_failures"), 1);
  clock.AdvanceUs(60'000'000 - 1);
  auto second = RunGet(*client, "k");
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable) << second.status().ToString();
  EXPECT_EQ(CounterOf(*client, "remote.cluster.connect_failures"), 1) << "a node known dead is not dialled again";
  EXPECT_EQ(CounterOf(*client, "remote.cluster.connects"), 0);
  clock.AdvanceUs(1);
  auto third = RunGet(*client, "k");
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(CounterOf(*client, "remote.cluster.connect_failures"), 2) << "dialled again once node_retry passed";
}

TEST(ClusterClientTest, ANodeThatHangsUpIsRetriedAfterReadingTheMapAgain) {
  // The seed drops the first GET's connection; the client reads the map
  // (the seed owns everything) and runs the command again.
  std::atomic<int> gets{0};
  FakeRedis seed([&](const Command& c) -> FakeRedis::Reply {
    if (c[0] == "CLUSTER") return Say("-ERR This instance has cluster support disabled\r\n");
    if (gets++ == 0) return FakeRedis::Reply{{}, 0ms, true};
    return Say("+again\r\n");
  });
  auto client = Cluster({seed.address()});
  ASSERT_NE(client, nullptr);
  auto reply = RunGet(*client, "k");
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ(reply->text, "again");
  EXPECT_EQ(GetsSeen(seed).size(), 2u);
  EXPECT_EQ(CounterOf(*client, "remote.cluster.map_refreshes"), 1);
  EXPECT_GE(seed.connections(), 2);
}

}  // namespace
}  // namespace kvtier::testing

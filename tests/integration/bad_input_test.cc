// Bad input at every layer: frames, messages, protocol order, namespaces,
// sizes, leases, dying clients and a full arena. Each case checks the exact
// StatusCode, that the message helps, and that the daemon keeps serving.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <poll.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

#include "common/counters.h"
#include "common/framing.h"
#include "proto/wire.h"
#include "tests/testing/protocol_checks.h"
#include "tests/testing/raw_connection.h"
#include "tests/testing/test_daemon.h"

namespace kvtier::testing {
namespace {

using ::testing::HasSubstr;

constexpr uint32_t kSmallFrameCap = 64u << 10;
constexpr uint32_t kUnregisteredNs = 5;  // with exactly one namespace registered

TEST(BadInput, WrongProtocolVersionIsRejectedAndClosed) {
  TestDaemon daemon;
  RawConnection raw;
  ASSERT_TRUE(raw.Connect(daemon.socket_path()).ok());
  v1::Request hello;
  hello.set_id(1);
  hello.mutable_hello()->set_protocol_version(1);  // block keys v1: refused
  wire::ToProto(TestNamespace(), hello.mutable_hello()->add_namespaces());
  auto r = RoundTrip(raw, hello);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->id(), 1u);
  EXPECT_TRUE(HasCode(r->status(), StatusCode::kVersionMismatch));
  EXPECT_THAT(r->status().message(), HasSubstr("protocol 1"));
  EXPECT_THAT(r->status().message(), HasSubstr("kvtierd speaks 2"));
  EXPECT_EQ(raw.received_fd_count(), 0) << "no arena for a rejected client";
  EXPECT_TRUE(raw.IsClosedByPeer());
  ExpectDaemonServes(daemon);
}

TEST(BadInput, RequestBeforeHelloIsFailedPrecondition) {
  TestDaemon daemon;
  RawConnection raw;
  ASSERT_TRUE(raw.Connect(daemon.socket_path()).ok());
  const auto keys = TestKeys(TestNamespace(), 1, 1);
  auto r = RoundTrip(raw, LookupReq(7, 0, keys));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->id(), 7u);
  EXPECT_TRUE(HasCode(r->status(), StatusCode::kFailedPrecondition));
  EXPECT_THAT(r->status().message(), HasSubstr("Hello"));
  EXPECT_FALSE(r->has_lookup());
  // The connection survives: Hello still works, then the same request.
  auto hello = raw.Hello({TestNamespace()});
  ASSERT_TRUE(hello.ok()) << hello.status().ToString();
  EXPECT_TRUE(HasCode(hello->status(), StatusCode::kOk));
  r = RoundTrip(raw, LookupReq(8, 0, keys));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(HasCode(r->status(), StatusCode::kOk));
  ExpectDaemonServes(daemon);
}

TEST(BadInput, SecondHelloIsFailedPrecondition) {
  TestDaemon daemon;
  RawConnection raw = HelloRaw(daemon);
  auto again = raw.Hello({TestNamespace("rev-2"), TestNamespace("rev-3")});
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(HasCode(again->status(), StatusCode::kFailedPrecondition));
  EXPECT_THAT(again->status().message(), HasSubstr("already"));
  EXPECT_EQ(raw.received_fd_count(), 2) << "no second arena or directory fd";
  // The first registration stands: namespace 1 was not added.
  const auto keys = TestKeys(TestNamespace(), 1, 2);
  auto r = RoundTrip(raw, LookupReq(9, 1, keys));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(HasCode(r->status(), StatusCode::kInvalidArgument));
  ExpectDaemonServes(daemon);
}

TEST(BadInput, FrameOverTheCapIsRejectedAndClosed) {
  TestDaemonOptions options;
  options.max_frame_bytes = kSmallFrameCap;
  TestDaemon daemon(options);
  RawConnection raw = HelloRaw(daemon);
  ASSERT_TRUE(raw.SendRawBytes(FrameHeader(kSmallFrameCap + 1)).ok());
  ExpectConnectionError(raw, "frame of 65537 bytes exceeds the cap of 65536 bytes");
  EXPECT_EQ(ServerCounter(daemon, "server.oversized_frames"), 1);
  ExpectDaemonServes(daemon);
}

TEST(BadInput, FrameHeaderOfFourGigabytesIsRejectedAndClosed) {
  TestDaemonOptions options;
  options.max_frame_bytes = kSmallFrameCap;
  TestDaemon daemon(options);
  RawConnection raw;
  ASSERT_TRUE(raw.Connect(daemon.socket_path()).ok());
  ASSERT_TRUE(raw.SendRawBytes(FrameHeader(0xFFFFFFFFu)).ok());
  ExpectConnectionError(raw, "frame of 4294967295 bytes exceeds the cap of 65536 bytes");
  ExpectDaemonServes(daemon);
}

TEST(BadInput, TruncatedFrameIsReportedAndClosed) {
  TestDaemon daemon;
  RawConnection raw = HelloRaw(daemon);
  std::vector<uint8_t> bytes = FrameHeader(100);
  bytes.resize(bytes.size() + 50, 0x08);
  ASSERT_TRUE(raw.SendRawBytes(bytes).ok());
  ASSERT_TRUE(raw.ShutdownWrite().ok());
  ExpectConnectionError(raw, "truncated frame: got 50 of 100 bytes");
  EXPECT_EQ(ServerCounter(daemon, "server.truncated_frames"), 1);
  ExpectDaemonServes(daemon);
}

TEST(BadInput, GarbagePayloadIsProtocolErrorAndConnectionSurvives) {
  TestDaemon daemon;
  RawConnection raw = HelloRaw(daemon);
  // Field 1 with wire type 7 (no such type), then noise.
  const std::vector<uint8_t> garbage = {0x0F, 0xDE, 0xAD, 0xBE, 0xEF, 0xFF, 0xFF};
  ASSERT_FALSE(v1::Request().ParseFromArray(garbage.data(), static_cast<int>(garbage.size())))
      << "precondition: the payload must not parse";
  std::vector<uint8_t> frame = FrameHeader(static_cast<uint32_t>(garbage.size()));
  frame.insert(frame.end(), garbage.begin(), garbage.end());
  ASSERT_TRUE(raw.SendRawBytes(frame).ok());
  auto r = raw.ReadResponse();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->id(), 0u);
  EXPECT_TRUE(HasCode(r->status(), StatusCode::kProtocolError));
  EXPECT_THAT(r->status().message(), HasSubstr("not a valid kvtier.v1.Request"));
  EXPECT_EQ(ServerCounter(daemon, "server.unparsable_frames"), 1);
  // Frame boundaries are intact, so the next request is answered normally.
  r = RoundTrip(raw, StatsReq(11));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->id(), 11u);
  EXPECT_TRUE(HasCode(r->status(), StatusCode::kOk));
  EXPECT_TRUE(r->has_stats());
  ExpectDaemonServes(daemon);
}

TEST(BadInput, RequestWithoutBodyIsUnimplemented) {
  TestDaemon daemon;
  RawConnection raw = HelloRaw(daemon);
  v1::Request empty;
  empty.set_id(5);
  auto r = RoundTrip(raw, empty);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->id(), 5u);
  EXPECT_TRUE(HasCode(r->status(), StatusCode::kUnimplemented));
  EXPECT_THAT(r->status().message(), HasSubstr("unknown or empty request type"));
  EXPECT_EQ(r->body_case(), v1::Response::BODY_NOT_SET);
  r = RoundTrip(raw, StatsReq(6));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(HasCode(r->status(), StatusCode::kOk));
  ExpectDaemonServes(daemon);
}

// What a newer client sends: a request type (field 99, an empty message)
// this daemon does not know. Protobuf keeps it as an unknown field, so the
// oneof is empty and the daemon answers Unimplemented; unknown fields next
// to a known body are ignored (proto3 forward compatibility).
TEST(BadInput, UnknownFieldNumberIsHandledCleanly) {
  TestDaemon daemon;
  RawConnection raw = HelloRaw(daemon);
  const std::string field_99 = {'\x9A', '\x06', '\x00'};  // tag (99 << 3 | 2), length 0

  v1::Request only_unknown;
  only_unknown.set_id(12);
  std::string payload = only_unknown.SerializeAsString() + field_99;
  std::vector<uint8_t> frame = FrameHeader(static_cast<uint32_t>(payload.size()));
  frame.insert(frame.end(), payload.begin(), payload.end());
  ASSERT_TRUE(raw.SendRawBytes(frame).ok());
  auto r = raw.ReadResponse();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->id(), 12u);
  EXPECT_TRUE(HasCode(r->status(), StatusCode::kUnimplemented));
  EXPECT_THAT(r->status().message(), HasSubstr("newer than kvtierd"));

  const auto keys = TestKeys(TestNamespace(), 1, 3);
  payload = LookupReq(13, 0, keys).SerializeAsString() + field_99;
  frame = FrameHeader(static_cast<uint32_t>(payload.size()));
  frame.insert(frame.end(), payload.begin(), payload.end());
  ASSERT_TRUE(raw.SendRawBytes(frame).ok());
  r = raw.ReadResponse();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->id(), 13u);
  EXPECT_TRUE(HasCode(r->status(), StatusCode::kOk));
  EXPECT_EQ(r->lookup().prefix_blocks(), 0u);
  ExpectDaemonServes(daemon);
}

TEST(BadInput, UnregisteredNamespaceIsInvalidArgument) {
  TestDaemon daemon;
  RawConnection raw = HelloRaw(daemon);
  const auto keys = TestKeys(TestNamespace(), 1, 4);
  const std::vector<std::pair<const char*, v1::Request>> requests = {
      {"Lookup", LookupReq(20, kUnregisteredNs, keys)},
      {"Reserve", ReserveReq(21, kUnregisteredNs, keys, {4096})},
      {"Pin", PinReq(22, kUnregisteredNs, keys)},
      {"Erase", EraseReq(23, kUnregisteredNs, keys)},
  };
  for (const auto& [what, request] : requests) {
    SCOPED_TRACE(what);
    auto r = RoundTrip(raw, request);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->id(), request.id());
    EXPECT_TRUE(HasCode(r->status(), StatusCode::kInvalidArgument));
    EXPECT_THAT(r->status().message(), HasSubstr("namespace 5 is not registered"));
    EXPECT_EQ(r->body_case(), v1::Response::BODY_NOT_SET);
  }
  EXPECT_EQ(EngineCounter(daemon, "engine.reserves"), 0) << "nothing reached the engine";
  EXPECT_EQ(daemon.host().used_bytes(), 0u);
  ExpectDaemonServes(daemon);
}

TEST(BadInput, ClientRejectsUnregisteredNamespaceWithoutRoundTrip) {
  TestDaemon daemon;
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  const auto keys = TestKeys(TestNamespace(), 1, 5);
  const int64_t requests_before = ServerCounter(daemon, "server.requests");
  const auto expect_bad_ns = [](const Status& s) {
    EXPECT_TRUE(HasCode(s, StatusCode::kInvalidArgument));
    EXPECT_THAT(s.message(), HasSubstr("namespace 5 was not registered"));
  };
  expect_bad_ns(client->Lookup(kUnregisteredNs, keys).status());
  const uint64_t sizes[] = {4096};
  expect_bad_ns(client->Reserve(kUnregisteredNs, keys, sizes).status());
  auto pins = client->Pin(kUnregisteredNs, keys);
  ASSERT_EQ(pins.size(), 1u);
  expect_bad_ns(pins[0].status());
  expect_bad_ns(client->Erase(kUnregisteredNs, keys).status());
  expect_bad_ns(client->Put(kUnregisteredNs, keys[0], Block(keys[0], 4096)));
  std::vector<std::byte> dst(4096);
  expect_bad_ns(client->Get(kUnregisteredNs, keys[0], dst).status());
  EXPECT_EQ(ServerCounter(daemon, "server.requests"), requests_before)
      << "the client must reject a bad namespace without a round trip";
  ExpectDaemonServes(daemon);
}

TEST(BadInput, ReserveWithMismatchedKeysAndSizesIsInvalidArgument) {
  TestDaemon daemon;
  RawConnection raw = HelloRaw(daemon);
  const auto keys = TestKeys(TestNamespace(), 2, 6);
  auto r = RoundTrip(raw, ReserveReq(30, 0, keys, {4096}));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(HasCode(r->status(), StatusCode::kInvalidArgument));
  EXPECT_THAT(r->status().message(), HasSubstr("2 keys but 1 sizes"));
  EXPECT_EQ(EngineCounter(daemon, "engine.reserves"), 0);
  // The client library refuses the same mistake locally.
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  const uint64_t sizes[] = {4096};
  auto reservation = client->Reserve(0, keys, sizes);
  EXPECT_TRUE(HasCode(reservation.status(), StatusCode::kInvalidArgument));
  EXPECT_THAT(reservation.status().message(), HasSubstr("differ in length"));
  ExpectDaemonServes(daemon);
}

TEST(BadInput, CommitWithoutReserveIsPerKeyFailedPrecondition) {
  TestDaemon daemon;
  RawConnection raw = HelloRaw(daemon);
  RawConnection other = HelloRaw(daemon);
  const auto keys = TestKeys(TestNamespace(), 2, 7);
  // keys[1] is reserved, but by another connection.
  auto reserved = RoundTrip(other, ReserveReq(40, 0, std::span(keys).subspan(1), {4096}));
  ASSERT_TRUE(reserved.ok()) << reserved.status().ToString();
  ASSERT_TRUE(HasCode(reserved->reserve().slots(0).status(), StatusCode::kOk));

  auto r = RoundTrip(raw, CommitReq(41, 0, keys, {4096, 4096}));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(HasCode(r->status(), StatusCode::kOk)) << "per-key outcomes, not a request error";
  ASSERT_EQ(r->commit().statuses_size(), 2);
  for (const auto& s : r->commit().statuses()) {
    EXPECT_TRUE(HasCode(s, StatusCode::kFailedPrecondition));
    EXPECT_THAT(s.message(), HasSubstr("Commit without Reserve"));
  }
  r = RoundTrip(raw, LookupReq(42, 0, keys));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->lookup().prefix_blocks(), 0u);
  ExpectDaemonServes(daemon);
}

TEST(BadInput, CommitSizeMismatchDropsTheReservation) {
  TestDaemon daemon;
  RawConnection raw = HelloRaw(daemon);
  const auto keys = TestKeys(TestNamespace(), 1, 8);
  const uint64_t used_before = daemon.host().used_bytes();
  auto r = RoundTrip(raw, ReserveReq(50, 0, keys, {8192}));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(HasCode(r->reserve().slots(0).status(), StatusCode::kOk));
  EXPECT_GT(daemon.host().used_bytes(), used_before);

  r = RoundTrip(raw, CommitReq(51, 0, keys, {4096}));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->commit().statuses_size(), 1);
  EXPECT_TRUE(HasCode(r->commit().statuses(0), StatusCode::kInvalidArgument));
  EXPECT_THAT(r->commit().statuses(0).message(), HasSubstr("reserved 8192 bytes, committed 4096"));

  r = RoundTrip(raw, LookupReq(52, 0, keys));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->lookup().prefix_blocks(), 0u) << "a failed commit must not publish";
  EXPECT_EQ(daemon.host().used_bytes(), used_before) << "the reservation's space must return";
  EXPECT_EQ(EngineCounter(daemon, "engine.reserved_blocks"), 0);
  // The reservation is gone: the right size no longer commits.
  r = RoundTrip(raw, CommitReq(53, 0, keys, {8192}));
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(HasCode(r->commit().statuses(0), StatusCode::kFailedPrecondition));
  ExpectDaemonServes(daemon);
}

TEST(BadInput, DoubleReleaseIsNotFound) {
  TestDaemon daemon;
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  const auto keys = TestKeys(TestNamespace(), 1, 9);
  ASSERT_TRUE(client->Put(0, keys[0], Block(keys[0], 4096)).ok());
  auto views = client->Pin(0, keys);
  ASSERT_TRUE(views[0].ok()) << views[0].status().ToString();
  const uint64_t lease = views[0]->lease();
  Status first = client->Release(lease);
  EXPECT_TRUE(first.ok()) << first.ToString();
  Status second = client->Release(lease);
  EXPECT_TRUE(HasCode(second, StatusCode::kNotFound));
  EXPECT_THAT(second.message(), HasSubstr("lease " + std::to_string(lease) + " is not held"));
  EXPECT_EQ(StatsCounter(*client, "engine.pinned_blocks"), 0);
  EXPECT_EQ(StatsCounter(*client, "engine.leases"), 0);
  ExpectDaemonServes(daemon);
}

// A fire-and-forget Release (no_reply) of a good and an unknown lease: the
// daemon answers nothing, counts the bad lease, releases the good one, and
// the very next frame on the connection is the answer to the next request.
TEST(BadInput, UnansweredReleaseOfUnknownLeaseIsCountedNotAnswered) {
  TestDaemon daemon;
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  const auto keys = TestKeys(TestNamespace(), 1, 13);
  ASSERT_TRUE(client->Put(0, keys[0], Block(keys[0], 4096)).ok());
  RawConnection raw = HelloRaw(daemon);
  auto pinned = RoundTrip(raw, PinReq(2, 0, keys));
  ASSERT_TRUE(pinned.ok()) << pinned.status().ToString();
  const uint64_t lease = pinned->pin().blocks(0).lease();
  ASSERT_NE(lease, 0u);
  const int64_t failures_before = EngineCounter(daemon, "engine.release_failures");

  const std::vector<uint64_t> leases = {lease, lease + 1000};
  ASSERT_TRUE(raw.SendFrame(WithId(3, wire::MakeReleaseNoReply(leases))).ok());
  auto next = RoundTrip(raw, StatsReq(4));
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(next->id(), 4u) << "no_reply Release must not be answered";
  EXPECT_TRUE(HasCode(next->status(), StatusCode::kOk));
  EXPECT_EQ(EngineCounter(daemon, "engine.release_failures"), failures_before + 1);
  EXPECT_EQ(EngineCounter(daemon, "engine.leases"), 0);
  EXPECT_EQ(EngineCounter(daemon, "engine.pinned_blocks"), 0);
  ExpectDaemonServes(daemon);
}

TEST(BadInput, ReleaseOfForeignLeaseIsPermissionDenied) {
  TestDaemon daemon;
  auto a = daemon.Connect();
  auto b = daemon.Connect();
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  const auto keys = TestKeys(TestNamespace(), 1, 10);
  ASSERT_TRUE(a->Put(0, keys[0], Block(keys[0], 4096)).ok());
  auto views = a->Pin(0, keys);
  ASSERT_TRUE(views[0].ok()) << views[0].status().ToString();
  Status stolen = b->Release(views[0]->lease());
  EXPECT_TRUE(HasCode(stolen, StatusCode::kPermissionDenied));
  EXPECT_THAT(stolen.message(), HasSubstr("belongs to another connection"));
  EXPECT_EQ(StatsCounter(*a, "engine.pinned_blocks"), 1) << "A's pin must survive";
  EXPECT_TRUE(CheckBlockBytes(keys[0], 0, views[0]->data()));
  EXPECT_TRUE(views[0]->Release().ok());
  EXPECT_EQ(StatsCounter(*a, "engine.pinned_blocks"), 0);
  ExpectDaemonServes(daemon);
}

// Child side of ClientKilledBetweenReserveAndCommit: reserves, writes half
// of each block, reports on `ready_fd`, then waits on `release_fd` until the
// parent kills it (or dies itself). Returns an exit code only on failure.
int ReserveThenHang(const ClientOptions& options, const std::vector<BlockKey>& keys, uint64_t block_bytes, int ready_fd,
                    int release_fd) {
  auto client = Client::Connect(options);
  if (!client.ok()) return 2;
  std::vector<uint64_t> sizes(keys.size(), block_bytes);
  auto reservation = (*client)->Reserve(0, keys, sizes);
  if (!reservation.ok()) return 3;
  for (auto& b : reservation->blocks()) {
    if (!b.status.ok()) return 4;
    std::memset(b.data.data(), 0xAB, b.data.size() / 2);
  }
  if (::write(ready_fd, "r", 1) != 1) return 5;
  char byte;
  (void)!::read(release_fd, &byte, 1);  // blocks until killed or the parent exits
  ::raise(SIGKILL);                     // never commit, never abort
  return 6;
}

constexpr uint64_t kChildBlockBytes = 256 << 10;
constexpr uint32_t kChildKeySeed = 11;

// The child is this test binary re-executed (a fresh process: forking the
// multi-threaded test process and running the client there can deadlock
// under sanitizers). It recognizes itself by KVTIER_TEST_CHILD before main.
const bool kIsReserveChild = [] {
  const char* spec = std::getenv("KVTIER_TEST_CHILD");
  if (spec == nullptr) return false;
  int ready_fd = -1, release_fd = -1;
  char socket_path[512] = {};
  if (std::sscanf(spec, "reserve:%d:%d:%511s", &ready_fd, &release_fd, socket_path) != 3) ::_exit(7);
  ClientOptions options;
  options.socket_path = socket_path;
  options.namespaces = {TestNamespace()};
  ::_exit(
      ReserveThenHang(options, TestKeys(TestNamespace(), 4, kChildKeySeed), kChildBlockBytes, ready_fd, release_fd));
}();

// Kills and reaps a forked child on every exit path of the test.
struct ChildGuard {
  pid_t pid = -1;
  ~ChildGuard() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
};

TEST(BadInput, ClientKilledBetweenReserveAndCommitLeavesNothingBehind) {
  TestDaemon daemon;
  const auto keys = TestKeys(TestNamespace(), 4, kChildKeySeed);
  constexpr uint64_t kBlockBytes = kChildBlockBytes;
  const uint64_t used_before = daemon.host().used_bytes();
  int ready[2], release[2];
  ASSERT_EQ(::pipe(ready), 0);
  ASSERT_EQ(::pipe(release), 0);
  std::string spec = "KVTIER_TEST_CHILD=reserve:" + std::to_string(ready[1]) + ":" + std::to_string(release[0]) + ":" +
                     daemon.socket_path();
  char* child_argv[] = {const_cast<char*>("kvtier_integration_tests"), nullptr};
  char* child_env[] = {spec.data(), nullptr};
  ChildGuard child;
  child.pid = ::fork();
  ASSERT_GE(child.pid, 0) << std::strerror(errno);
  if (child.pid == 0) {
    ::execve("/proc/self/exe", child_argv, child_env);  // async-signal-safe
    ::_exit(8);
  }
  ::close(ready[1]);
  ::close(release[0]);
  pollfd p{ready[0], POLLIN, 0};
  char byte = 0;
  const bool reported = ::poll(&p, 1, 10000) == 1 && ::read(ready[0], &byte, 1) == 1;
  ::close(ready[0]);
  if (!reported) {
    int status = 0;
    ::waitpid(child.pid, &status, 0);
    child.pid = -1;
    ::close(release[1]);
    FAIL() << "the child did not reserve (exit status " << status << ")";
  }
  EXPECT_EQ(EngineCounter(daemon, "engine.reserved_blocks"), 4);
  EXPECT_GT(daemon.host().used_bytes(), used_before);

  ASSERT_EQ(::kill(child.pid, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child.pid, &status, 0), child.pid);
  child.pid = -1;
  ::close(release[1]);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;

  EXPECT_TRUE(EventuallyTrue([&] {
    return EngineCounter(daemon, "engine.reserved_blocks") == 0 && daemon.host().used_bytes() == used_before;
  })) << "reserved_blocks "
      << EngineCounter(daemon, "engine.reserved_blocks") << ", used " << daemon.host().used_bytes() << " (baseline "
      << used_before << ")";

  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  auto hit = client->Lookup(0, keys);
  ASSERT_TRUE(hit.ok()) << hit.status().ToString();
  EXPECT_EQ(hit->prefix_blocks, 0u) << "uncommitted blocks must never become visible";
  std::vector<std::byte> dst(kBlockBytes);
  for (const BlockKey& key : keys) {
    Status put = client->Put(0, key, Block(key, kBlockBytes, 11));
    ASSERT_TRUE(put.ok()) << put.ToString();
    auto got = client->Get(0, key, dst);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, kBlockBytes);
    EXPECT_TRUE(CheckBlockBytes(key, 11, dst));
  }
  ExpectDaemonServes(daemon);
}

// Waits for `future` for up to `limit`. A call still running then means the
// daemon hangs; the future's destructor would block on it forever, so the
// test process ends here with a failure instead.
template <typename T>
T GetOrDie(std::future<T>& future, std::chrono::seconds limit, const char* what) {
  if (future.wait_for(limit) != std::future_status::ready) {
    ADD_FAILURE() << what << " did not complete within " << limit.count() << " s";
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(1);
  }
  return future.get();
}

TEST(BadInput, PutIntoArenaFullOfPinnedBlocksFailsPromptlyWithNoSpace) {
  TestDaemonOptions options;
  options.arena_bytes = 8 << 20;
  TestDaemon daemon(options);
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  constexpr uint64_t kBlockBytes = kMiBBlock;
  const auto keys = FillArenaWithMiBBlocks(daemon, *client, 12, /*extra=*/1);
  const size_t fit = keys.size() - 1;
  ASSERT_EQ(daemon.host().used_bytes(), daemon.host().capacity_bytes());
  ASSERT_EQ(EngineCounter(daemon, "engine.evictions"), 0);
  auto views = client->Pin(0, std::span(keys).first(fit));
  for (auto& v : views) ASSERT_TRUE(v.ok()) << v.status().ToString();

  auto extra = std::async(std::launch::async, [&] { return client->Put(0, keys[fit], Block(keys[fit], kBlockBytes)); });
  Status full = GetOrDie(extra, std::chrono::seconds(10), "Put into a pinned-full arena");
  EXPECT_TRUE(HasCode(full, StatusCode::kNoSpace));
  EXPECT_THAT(full.message(), HasSubstr("pinned"));
  EXPECT_EQ(client->Lookup(0, std::span(keys).first(fit))->prefix_blocks, fit) << "pinned blocks stay";

  for (auto& v : views) EXPECT_TRUE(v->Release().ok());
  Status put = client->Put(0, keys[fit], Block(keys[fit], kBlockBytes));
  EXPECT_TRUE(put.ok()) << put.ToString();
  EXPECT_GE(EngineCounter(daemon, "engine.evictions"), 1);
  std::vector<std::byte> dst(kBlockBytes);
  auto got = client->Get(0, keys[fit], dst);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(CheckBlockBytes(keys[fit], 0, dst));
  ExpectDaemonServes(daemon);
}

TEST(BadInput, BlockLargerThanArenaOrEmptyIsInvalidArgument) {
  TestDaemonOptions options;
  options.arena_bytes = 8 << 20;
  TestDaemon daemon(options);
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  const auto keys = TestKeys(TestNamespace(), 2, 13);
  const uint64_t sizes[] = {daemon.host().capacity_bytes() + 1, 0};
  auto reservation = client->Reserve(0, keys, sizes);
  ASSERT_TRUE(reservation.ok()) << reservation.status().ToString();
  for (const auto& b : reservation->blocks()) {
    EXPECT_TRUE(HasCode(b.status, StatusCode::kInvalidArgument));
    EXPECT_THAT(b.status.message(), HasSubstr("can never fit the host tier (8388608-byte arena"));
  }
  EXPECT_TRUE(HasCode(client->Put(0, keys[1], {}), StatusCode::kInvalidArgument));
  EXPECT_EQ(EngineCounter(daemon, "engine.reserved_blocks"), 0);
  EXPECT_EQ(daemon.host().used_bytes(), 0u);
  ExpectDaemonServes(daemon);
}

// A block no larger than the arena whose size class is (8.5 MiB rounds up to
// the 10 MiB class in a 9 MiB arena) can never be stored either. It must be
// refused like an oversized block, not answered NoSpace after evicting every
// cached block for nothing.
TEST(BadInput, BlockWhoseSizeClassExceedsArenaIsInvalidArgumentAndEvictsNothing) {
  TestDaemonOptions options;
  options.arena_bytes = 9 << 20;
  TestDaemon daemon(options);
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  const auto keys = TestKeys(TestNamespace(), 5, 14);
  for (size_t i = 0; i < 4; ++i) ASSERT_TRUE(client->Put(0, keys[i], Block(keys[i], 1 << 20)).ok());
  const uint64_t sizes[] = {(8 << 20) + (512 << 10)};
  auto reservation = client->Reserve(0, std::span(keys).subspan(4), sizes);
  ASSERT_TRUE(reservation.ok()) << reservation.status().ToString();
  EXPECT_TRUE(HasCode(reservation->blocks()[0].status, StatusCode::kInvalidArgument));
  EXPECT_EQ(EngineCounter(daemon, "engine.evictions"), 0) << "nothing may be evicted for it";
  EXPECT_EQ(client->Lookup(0, keys)->prefix_blocks, 4u);
  ExpectDaemonServes(daemon);
}

TEST(BadInput, BatchOverTheFrameCapIsClientSideInvalidArgument) {
  TestDaemonOptions options;
  options.max_frame_bytes = kSmallFrameCap;
  TestDaemon daemon(options);
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  std::vector<BlockKey> keys(100000);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = BlockKey{i + 1, ~i};
  // Erase always travels (a Lookup of uncached keys is settled by the block
  // directory without a frame).
  auto r = client->Erase(0, keys);
  EXPECT_TRUE(HasCode(r.status(), StatusCode::kInvalidArgument));
  EXPECT_THAT(r.status().message(), HasSubstr("exceeds the frame cap of 65536 bytes"));
  EXPECT_EQ(ServerCounter(daemon, "server.oversized_frames"), 0) << "nothing oversized was sent";
  // The same connection still works.
  const auto real = TestKeys(TestNamespace(), 1, 15);
  ASSERT_TRUE(client->Put(0, real[0], Block(real[0], 4096)).ok());
  std::vector<std::byte> dst(4096);
  auto got = client->Get(0, real[0], dst);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(CheckBlockBytes(real[0], 0, dst));
  ExpectDaemonServes(daemon);
}

}  // namespace
}  // namespace kvtier::testing

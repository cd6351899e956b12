// Hostile clients: what one connection could do to everyone else before the
// per-connection limits (ConnectionLimits), the frame reader's memory bound,
// the accept back-off and the protobuf log routing. Each case checks the
// daemon keeps serving a well-behaved client throughout.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <poll.h>
#include <sstream>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>

#include "common/framing.h"
#include "common/unix_socket.h"
#include "proto/wire.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/protocol_checks.h"
#include "tests/testing/raw_connection.h"
#include "tests/testing/test_daemon.h"

namespace kvtier::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using ::testing::HasSubstr;

TestDaemonOptions WithLimits(const ConnectionLimits& limits) {
  TestDaemonOptions options;
  options.limits = limits;
  return options;
}

// Bytes a connection sends to start a frame of `announced` bytes: its header
// and the first `body` bytes.
std::vector<uint8_t> FrameStart(uint32_t announced, size_t body) {
  std::vector<uint8_t> bytes = FrameHeader(announced);
  bytes.resize(bytes.size() + body, 0x5a);
  return bytes;
}

TEST(HostileClient, HeadersAnnouncingWholeFramesCostNothingUntilTheBytesCome) {
  TestDaemon daemon;
  std::vector<RawConnection> raws(200);
  for (RawConnection& raw : raws) {
    ASSERT_TRUE(raw.Connect(daemon.socket_path()).ok());
    ASSERT_TRUE(raw.SendRawBytes(FrameHeader(1u << 20)).ok());
  }
  ExpectDaemonServes(daemon);  // every header above has been read by now or is queued behind nothing
  EXPECT_TRUE(EventuallyTrue([&] { return ServerCounter(daemon, "server.connections_open") >= 200; }));
  EXPECT_EQ(ServerCounter(daemon, "server.partial_frame_bytes"), 0)
      << "a header alone must not make the daemon allocate the frame it announces";
  // 64 KiB of each body: the buffers grow with what came, at most twice it.
  for (RawConnection& raw : raws) ASSERT_TRUE(raw.SendRawBytes(std::vector<uint8_t>(64u << 10, 1)).ok());
  ExpectDaemonServes(daemon);
  EXPECT_TRUE(EventuallyTrue([&] { return ServerCounter(daemon, "server.partial_frame_bytes") > 0; }));
  EXPECT_LE(ServerCounter(daemon, "server.partial_frame_bytes"), 200 * 2 * (64 << 10));
}

TEST(HostileClient, PartialFramesOfAllConnectionsStayWithinTheBudget) {
  ConnectionLimits limits;
  limits.partial_frame_bytes = 1u << 20;
  TestDaemon daemon(WithLimits(limits));
  std::vector<RawConnection> raws(8);
  for (RawConnection& raw : raws) {
    ASSERT_TRUE(raw.Connect(daemon.socket_path()).ok());
    raw.SendRawBytes(FrameStart(1u << 20, 512u << 10)).IgnoreError();  // may be cut while sending
  }
  EXPECT_TRUE(EventuallyTrue([&] { return ServerCounter(daemon, "server.frame_memory_refused") > 0; }));
  EXPECT_LE(ServerCounter(daemon, "server.partial_frame_bytes"), 1 << 20);
  int refused = 0;
  for (RawConnection& raw : raws) {
    pollfd ready{raw.fd(), POLLIN, 0};
    if (::poll(&ready, 1, 200) != 1) continue;  // still waiting for the rest of its frame
    auto answer = raw.ReadResponse();
    if (!answer.ok()) continue;  // cut before the answer arrived
    EXPECT_TRUE(HasCode(answer->status(), StatusCode::kBusy));
    EXPECT_THAT(answer->status().message(), HasSubstr("server.partial_frame_bytes"));
    EXPECT_TRUE(raw.IsClosedByPeer());
    ++refused;
  }
  EXPECT_GT(refused, 0) << "connections whose frames would pass the budget are answered Busy and closed";
  ExpectDaemonServes(daemon);
}

TEST(HostileClient, AFrameThatDoesNotArriveInTimeClosesTheConnection) {
  ConnectionLimits limits;
  limits.frame_timeout = milliseconds(300);
  TestDaemon daemon(WithLimits(limits));
  RawConnection slow = HelloRaw(daemon);
  ASSERT_TRUE(slow.SendRawBytes(FrameStart(1000, 10)).ok());
  EXPECT_TRUE(slow.IsClosedByPeer(seconds(5)));
  EXPECT_EQ(ServerCounter(daemon, "server.frame_timeouts"), 1);
  // A frame sent in pieces that arrives whole in time is served.
  RawConnection patient = HelloRaw(daemon);
  std::string frame;
  v1::Request stats = StatsReq(7);
  frame.resize(kFrameHeaderBytes);
  EncodeFrameHeader(static_cast<uint32_t>(stats.ByteSizeLong()), reinterpret_cast<uint8_t*>(frame.data()));
  frame += stats.SerializeAsString();
  for (char c : frame) {
    ASSERT_TRUE(patient.SendRawBytes(std::span(reinterpret_cast<const uint8_t*>(&c), 1)).ok());
    std::this_thread::sleep_for(milliseconds(2));
  }
  auto answer = patient.ReadResponse();
  ASSERT_TRUE(answer.ok()) << answer.status().ToString();
  EXPECT_EQ(answer->id(), 7u);
  ExpectDaemonServes(daemon);
}

// A connection that never sends a request is closed after
// first_request_timeout, long before the idle timeout; one that said Hello
// is not.
TEST(HostileClient, AConnectionThatSendsNothingIsClosedAfterTheFirstRequestTimeout) {
  ConnectionLimits limits;
  limits.first_request_timeout = milliseconds(300);
  limits.idle_timeout = seconds(600);
  TestDaemon daemon(WithLimits(limits));
  RawConnection silent;
  ASSERT_TRUE(silent.Connect(daemon.socket_path()).ok());
  RawConnection spoke = HelloRaw(daemon);
  EXPECT_TRUE(silent.IsClosedByPeer(seconds(10)));  // a failure bound, not a timing
  EXPECT_EQ(ServerCounter(daemon, "server.first_request_timeouts"), 1);
  EXPECT_FALSE(spoke.IsClosedByPeer(milliseconds(600))) << "it sent a request: only the idle timeout applies";
  ExpectDaemonServes(daemon);
}

TEST(HostileClient, AnIdleConnectionIsClosedUnlessItHoldsALease) {
  ConnectionLimits limits;
  limits.idle_timeout = seconds(1);
  TestDaemon daemon(WithLimits(limits));
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  const BlockKey key = TestKeys(TestNamespace(), 1, 77)[0];
  ASSERT_TRUE(client->Put(0, key, Block(key, 4096)).ok());

  RawConnection idle = HelloRaw(daemon);
  RawConnection holding = HelloRaw(daemon);
  auto pinned = RoundTrip(holding, PinReq(2, 0, std::span(&key, 1)));
  ASSERT_TRUE(pinned.ok());
  ASSERT_TRUE(HasCode(pinned->pin().blocks(0).status(), StatusCode::kOk));
  EXPECT_TRUE(idle.IsClosedByPeer(seconds(5)));
  EXPECT_FALSE(holding.IsClosedByPeer(milliseconds(2500))) << "its lease keeps it open";
  v1::Request release = WithId(3, wire::MakeRelease(std::vector<LeaseId>{pinned->pin().blocks(0).lease()}));
  auto released = RoundTrip(holding, release);
  ASSERT_TRUE(released.ok());
  EXPECT_TRUE(HasCode(released->release().statuses(0), StatusCode::kOk));
  EXPECT_TRUE(holding.IsClosedByPeer(seconds(5))) << "holding nothing, it is idle now";
  EXPECT_GE(ServerCounter(daemon, "server.idle_closed"), 2);
  // The library client was idle too: its next call reconnects.
  std::vector<std::byte> dst(4096);
  EXPECT_TRUE(EventuallyTrue([&] { return client->Get(0, key, dst).ok(); }));
  EXPECT_TRUE(CheckBlockBytes(key, 0, dst));
}

TEST(HostileClient, LeasesPerConnectionAreCapped) {
  ConnectionLimits limits;
  limits.max_leases = 8;
  TestDaemon daemon(WithLimits(limits));
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  const BlockKey key = TestKeys(TestNamespace(), 1, 78)[0];
  ASSERT_TRUE(client->Put(0, key, Block(key, 4096)).ok());

  RawConnection greedy = HelloRaw(daemon);
  const std::vector<BlockKey> same(20, key);
  auto pinned = RoundTrip(greedy, PinReq(2, 0, same));
  ASSERT_TRUE(pinned.ok());
  ASSERT_EQ(pinned->pin().blocks_size(), 20);
  std::vector<LeaseId> leases;
  for (int i = 0; i < 20; ++i) {
    const auto& block = pinned->pin().blocks(i);
    EXPECT_TRUE(HasCode(block.status(), i < 8 ? StatusCode::kOk : StatusCode::kBusy)) << i;
    if (i < 8) leases.push_back(block.lease());
  }
  // Released leases make room again; unheld ones make none.
  auto released =
      RoundTrip(greedy, WithId(3, wire::MakeRelease(std::vector<LeaseId>{leases[0], leases[0] + (1u << 20)})));
  ASSERT_TRUE(released.ok());
  EXPECT_TRUE(HasCode(released->release().statuses(0), StatusCode::kOk));
  EXPECT_TRUE(HasCode(released->release().statuses(1), StatusCode::kNotFound));
  auto again = RoundTrip(greedy, PinReq(4, 0, std::vector<BlockKey>(2, key)));
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(HasCode(again->pin().blocks(0).status(), StatusCode::kOk));
  EXPECT_TRUE(HasCode(again->pin().blocks(1).status(), StatusCode::kBusy));
  // Another connection has its own allowance.
  std::vector<std::byte> dst(4096);
  EXPECT_TRUE(client->Get(0, key, dst).ok());
  ExpectDaemonServes(daemon);
}

TEST(HostileClient, AnswersAPeerDoesNotReadCountAsItsClientMemory) {
  // A block of 512 layers committed with its layer checksums: a layer Pin
  // answer carries all 512, so pinning it 1,000 times is an answer of about
  // 4.6 MB.
  NamespaceDescriptor ns = TestNamespace();
  ns.layer_count = 512;
  ns.block_tokens = 16;
  ns.bytes_per_token_per_layer = 8;
  ConnectionLimits limits;
  limits.client_memory_bytes = 8 << 20;
  limits.max_client_memory_per_connection = 8 << 20;
  limits.max_leases = 1 << 20;
  TestDaemon daemon(WithLimits(limits));
  auto client = daemon.Connect({ns});
  ASSERT_NE(client, nullptr);
  const BlockKey key = TestKeys(ns, 1, 91)[0];
  RawConnection writer;
  ASSERT_TRUE(writer.Connect(daemon.socket_path()).ok());
  ASSERT_TRUE(writer.Hello({ns}).ok());
  auto reserved = RoundTrip(writer, ReserveReq(2, 0, std::span(&key, 1), {ns.BlockBytes()}));
  ASSERT_TRUE(reserved.ok() && HasCode(reserved->reserve().slots(0).status(), StatusCode::kOk));
  v1::Request commit = CommitReq(3, 0, std::span(&key, 1), {ns.BlockBytes()});
  commit.mutable_commit()->add_checksums(0x1234);
  for (uint32_t layer = 0; layer < ns.layer_count; ++layer)
    commit.mutable_commit()->add_layer_checksums(0xabcdef0123456789 + layer);
  auto committed = RoundTrip(writer, commit);
  ASSERT_TRUE(committed.ok() && HasCode(committed->commit().statuses(0), StatusCode::kOk));

  RawConnection greedy;
  ASSERT_TRUE(greedy.Connect(daemon.socket_path()).ok());
  ASSERT_TRUE(greedy.Hello({ns}).ok());
  const std::vector<BlockKey> same(1000, key);
  v1::Request pin = PinReq(2, 0, same);
  pin.mutable_pin()->set_last_layer(ns.layer_count);  // a layer read: its answer names each layer's checksum
  ASSERT_TRUE(greedy.SendFrame(pin).ok());            // never read while we look
  // The answer waits in kvtierd for the peer to read it, charged to the
  // connection's party: what it holds passes the answer's size.
  const int64_t answer_bytes = 1000 * 512 * 8;
  EXPECT_TRUE(EventuallyTrue([&] { return StatsCounter(*client, "server.client_memory_bytes") > answer_bytes; }))
      << StatsCounter(*client, "server.client_memory_bytes");
  // So the rest of the bound is all another connection of the party gets:
  // a queue hint of 12,000 keys (3.84 MB charged) does not fit now ...
  std::vector<BlockKey> chain;
  for (uint64_t i = 0; i < 12000; ++i) chain.push_back(BlockKey{i + 1, 77});
  const auto soon = std::chrono::steady_clock::now();
  const Status refused = client->Enqueue(1, 0, chain, soon);
  EXPECT_EQ(refused.code(), StatusCode::kBusy) << refused.ToString();
  EXPECT_THAT(refused.message(), HasSubstr("server.client_memory_bytes"));
  // ... and does once the peer has read its answer.
  auto answer = greedy.ReadResponse();
  ASSERT_TRUE(answer.ok()) << answer.status().ToString();
  EXPECT_EQ(answer->pin().blocks_size(), 1000);
  EXPECT_EQ(answer->pin().blocks(0).layer_checksums_size(), 512) << answer->ByteSizeLong();
  EXPECT_TRUE(EventuallyTrue([&] { return client->Enqueue(1, 0, chain, soon).ok(); }));
  ExpectDaemonServes(daemon);
}

TEST(HostileClient, ReservedBytesPerConnectionAreCapped) {
  ConnectionLimits limits;
  limits.max_reserved_bytes = 64u << 10;
  TestDaemon daemon(WithLimits(limits));
  RawConnection greedy = HelloRaw(daemon);
  const std::vector<BlockKey> keys = TestKeys(TestNamespace(), 4, 79);
  auto reserved = RoundTrip(greedy, ReserveReq(2, 0, keys, std::vector<uint64_t>(4, 32u << 10)));
  ASSERT_TRUE(reserved.ok());
  ASSERT_EQ(reserved->reserve().slots_size(), 4);
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(HasCode(reserved->reserve().slots(i).status(), i < 2 ? StatusCode::kOk : StatusCode::kBusy)) << i;
  }
  // Committing frees the allowance.
  auto committed = RoundTrip(greedy, CommitReq(3, 0, std::span(keys).first(2), {32u << 10, 32u << 10}));
  ASSERT_TRUE(committed.ok());
  auto more = RoundTrip(greedy, ReserveReq(4, 0, std::span(keys).subspan(2), {32u << 10, 32u << 10}));
  ASSERT_TRUE(more.ok());
  EXPECT_TRUE(HasCode(more->reserve().slots(0).status(), StatusCode::kOk));
  EXPECT_TRUE(HasCode(more->reserve().slots(1).status(), StatusCode::kOk));
  ExpectDaemonServes(daemon);
}

// With the default limit (server.max_reserved_bytes_per_connection = 0) a
// connection may hold at most half of a small arena reserved, so one that
// reserves all it may still leaves another room to reserve.
TEST(HostileClient, OneConnectionCannotReserveAllOfASmallArena) {
  TestDaemonOptions options;
  options.arena_bytes = 64ull << 20;
  TestDaemon daemon(options);
  constexpr uint64_t kBlock = 1ull << 20;
  RawConnection greedy = HelloRaw(daemon);
  const std::vector<BlockKey> hoard = TestKeys(TestNamespace(), 64, 81);
  auto reserved = RoundTrip(greedy, ReserveReq(2, 0, hoard, std::vector<uint64_t>(hoard.size(), kBlock)));
  ASSERT_TRUE(reserved.ok()) << reserved.status().ToString();
  ASSERT_EQ(reserved->reserve().slots_size(), 64);
  int granted = 0;
  for (const auto& slot : reserved->reserve().slots()) granted += HasCode(slot.status(), StatusCode::kOk) ? 1 : 0;
  EXPECT_EQ(granted, 32) << "half of the 64 MiB arena";
  EXPECT_TRUE(HasCode(reserved->reserve().slots(63).status(), StatusCode::kBusy));

  RawConnection other = HelloRaw(daemon);
  const std::vector<BlockKey> mine = TestKeys(TestNamespace(), 16, 82);
  auto second = RoundTrip(other, ReserveReq(2, 0, mine, std::vector<uint64_t>(mine.size(), kBlock)));
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  ASSERT_EQ(second->reserve().slots_size(), 16);
  for (int i = 0; i < 16; ++i) EXPECT_TRUE(HasCode(second->reserve().slots(i).status(), StatusCode::kOk)) << i;
  ExpectDaemonServes(daemon);
}

TEST(HostileClient, AnAbandonedReservationExpiresAndItsKeyIsFreeAgain) {
  ConnectionLimits limits;
  limits.reservation_timeout = seconds(1);
  TestDaemon daemon(WithLimits(limits));
  const BlockKey key = TestKeys(TestNamespace(), 1, 80)[0];
  RawConnection abandoner = HelloRaw(daemon);
  auto reserved = RoundTrip(abandoner, ReserveReq(2, 0, std::span(&key, 1), {4096}));
  ASSERT_TRUE(reserved.ok());
  ASSERT_TRUE(HasCode(reserved->reserve().slots(0).status(), StatusCode::kOk));

  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  EXPECT_TRUE(EventuallyTrue([&] { return ServerCounter(daemon, "server.reservations_expired") == 1; }));
  ASSERT_TRUE(client->Put(0, key, Block(key, 4096, 5)).ok());
  std::vector<std::byte> dst(4096);
  auto got = client->Get(0, key, dst);
  ASSERT_TRUE(got.ok()) << "the put after the expiry must be readable: " << got.status().ToString();
  EXPECT_TRUE(CheckBlockBytes(key, 5, dst));
  // The abandoner's late commit finds no reservation; the connection stays.
  auto late = RoundTrip(abandoner, CommitReq(3, 0, std::span(&key, 1), {4096}));
  ASSERT_TRUE(late.ok());
  EXPECT_TRUE(HasCode(late->commit().statuses(0), StatusCode::kFailedPrecondition));
}

TEST(HostileClient, ConnectionsPastTheCapAreAnsweredBusyAndClosed) {
  ConnectionLimits limits;
  limits.max_connections = 16;
  TestDaemon daemon(WithLimits(limits));
  std::vector<RawConnection> raws;
  for (int i = 0; i < 16; ++i) raws.push_back(HelloRaw(daemon));
  RawConnection extra;
  ASSERT_TRUE(extra.Connect(daemon.socket_path()).ok());
  auto refusal = extra.ReadResponse();
  ASSERT_TRUE(refusal.ok()) << refusal.status().ToString();
  EXPECT_TRUE(HasCode(refusal->status(), StatusCode::kBusy));
  EXPECT_THAT(refusal->status().message(), HasSubstr("server.max_connections"));
  EXPECT_TRUE(extra.IsClosedByPeer());
  EXPECT_EQ(ServerCounter(daemon, "server.connections_over_limit"), 1);
  raws.pop_back();  // one closes: room for a well-behaved client
  EXPECT_TRUE(EventuallyTrue([&] { return ServerCounter(daemon, "server.connections_open") < 16; }));
  ExpectDaemonServes(daemon);
}

TEST(HostileClient, DescriptorsAttachedByAClientAreNotKeptAndTheArenaCannotShrink) {
  TestDaemon daemon;
  auto count_fds = [] {
    int n = 0;
    for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) n += entry.is_symlink() ? 1 : 0;
    return n;
  };
  RawConnection raw = HelloRaw(daemon);
  const int before = count_fds();
  const int foreign = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(foreign, 0);
  v1::Request stats = StatsReq(5);
  std::string frame(kFrameHeaderBytes, '\0');
  EncodeFrameHeader(static_cast<uint32_t>(stats.ByteSizeLong()), reinterpret_cast<uint8_t*>(frame.data()));
  frame += stats.SerializeAsString();
  for (int i = 0; i < 200; ++i) {
    const int fds[] = {foreign, foreign};
    ASSERT_TRUE(SendWithFds(raw.fd(), frame.data(), frame.size(), fds).ok());
    auto answer = raw.ReadResponse();
    ASSERT_TRUE(answer.ok()) << answer.status().ToString();
  }
  ::close(foreign);
  EXPECT_LE(count_fds(), before + 1) << "descriptors a client attaches must not pile up in the daemon";
  // The arena a client maps is sealed: it cannot shrink it under the daemon.
  EXPECT_NE(::ftruncate(daemon.host().memfd(), 4096), 0);
  ExpectDaemonServes(daemon);
}

// The daemon binary: it is what routes protobuf's log and raises its limits.
TEST(HostileClient, InvalidUtf8DoesNotFillTheLog) {
  DaemonProcess daemon(KVTIERD_PATH, "", "[host]\ncapacity_bytes = \"64MiB\"\n");
  ASSERT_TRUE(daemon.running());
  RawConnection raw;
  ASSERT_TRUE(raw.Connect(daemon.socket_path()).ok());
  v1::Request hello;
  hello.set_id(1);
  hello.mutable_hello()->set_client_name("AAAA");
  std::string bytes = hello.SerializeAsString();
  const size_t at = bytes.find("AAAA");
  ASSERT_NE(at, std::string::npos);
  bytes.replace(at, 4, "\xff\xfe\xfd\xfc");
  std::string frame(kFrameHeaderBytes, '\0');
  EncodeFrameHeader(static_cast<uint32_t>(bytes.size()), reinterpret_cast<uint8_t*>(frame.data()));
  frame += bytes;
  for (int i = 0; i < 2000; ++i) {
    ASSERT_TRUE(raw.SendRawBytes(std::span(reinterpret_cast<const uint8_t*>(frame.data()), frame.size())).ok());
    auto answer = raw.ReadResponse();
    ASSERT_TRUE(answer.ok()) << answer.status().ToString();
    ASSERT_TRUE(HasCode(answer->status(), StatusCode::kProtocolError));
  }
  std::ifstream log(daemon.log_path());
  std::stringstream text;
  text << log.rdbuf();
  size_t lines = 0;
  for (size_t p = text.str().find("UTF-8"); p != std::string::npos; p = text.str().find("UTF-8", p + 1)) ++lines;
  EXPECT_LE(lines, 10u) << "2000 bad frames must not write 2000 lines:\n" << text.str().substr(0, 4000);
  EXPECT_LT(text.str().size(), 64u << 10);
}

// The accept loop at the descriptor limit: EMFILE backs off instead of
// spinning, says so a few times, and clients already connected stay served.
TEST(HostileClient, AcceptAtTheDescriptorLimitBacksOffAndKeepsServing) {
  DaemonProcess daemon(KVTIERD_PATH, "", "[host]\ncapacity_bytes = \"64MiB\"\n", /*max_open_files=*/64);
  ASSERT_TRUE(daemon.running());
  ClientOptions options;
  options.socket_path = daemon.socket_path();
  options.namespaces = {TestNamespace()};
  auto early = Client::Connect(options);
  ASSERT_TRUE(early.ok()) << early.status().ToString();
  const BlockKey key = TestKeys(TestNamespace(), 1, 81)[0];
  ASSERT_TRUE((*early)->Put(0, key, Block(key, 4096)).ok());

  std::vector<int> flood;
  for (int i = 0; i < 100; ++i) {
    auto fd = ConnectUnix(daemon.socket_path());
    ASSERT_TRUE(fd.ok()) << fd.status().ToString();
    flood.push_back(*fd);
  }
  std::this_thread::sleep_for(seconds(2));  // the daemon sits at its limit meanwhile
  std::vector<std::byte> dst(4096);
  auto got = (*early)->Get(0, key, dst);
  ASSERT_TRUE(got.ok()) << "a client connected before must stay served: " << got.status().ToString();
  EXPECT_TRUE(CheckBlockBytes(key, 0, dst));
  const int64_t errors = StatsCounter(**early, "server.accept_errors");
  EXPECT_GT(errors, 0) << "the flood should have reached the limit";
  EXPECT_LT(errors, 100) << "accept must back off at EMFILE, not spin";

  for (int fd : flood) ::close(fd);
  flood.clear();
  // Room again: a new client gets in.
  EXPECT_TRUE(EventuallyTrue([&] { return Client::Connect(options).ok(); }, seconds(10)));
  std::ifstream log(daemon.log_path());
  std::stringstream text;
  text << log.rdbuf();
  size_t lines = 0;
  for (size_t p = text.str().find("accept failed"); p != std::string::npos;
       p = text.str().find("accept failed", p + 1)) {
    ++lines;
  }
  EXPECT_GT(lines, 0u);
  EXPECT_LE(lines, 10u) << text.str().substr(0, 4000);
}

// Ten thousand connections at once (the daemon as a process, so each side
// has its own descriptor table): all are served or refused cleanly, and a
// well-behaved client keeps working.
TEST(HostileClient, TenThousandConnections) {
  constexpr int kConnections = 10000;
  struct rlimit limit {};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &limit), 0);
  if (limit.rlim_max != RLIM_INFINITY && limit.rlim_max < kConnections + 512) {
    GTEST_SKIP() << "the hard open-file limit (" << limit.rlim_max << ") is below " << kConnections + 512;
  }
  const rlim_t soft_before = limit.rlim_cur;
  limit.rlim_cur = limit.rlim_max == RLIM_INFINITY ? kConnections + 512 : limit.rlim_max;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &limit), 0);
  {
    DaemonProcess daemon(KVTIERD_PATH, "max_connections = 12000\nidle_timeout_s = 0\n",
                         "[host]\ncapacity_bytes = \"64MiB\"\n");
    ASSERT_TRUE(daemon.running());
    std::vector<int> fds;
    fds.reserve(kConnections);
    for (int i = 0; i < kConnections; ++i) {
      auto fd = ConnectUnix(daemon.socket_path());
      ASSERT_TRUE(fd.ok()) << i << ": " << fd.status().ToString();
      fds.push_back(*fd);
    }
    ClientOptions options;
    options.socket_path = daemon.socket_path();
    options.namespaces = {TestNamespace()};
    auto client = Client::Connect(options);
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    EXPECT_GE(StatsCounter(**client, "server.connections_open"), kConnections);
    const BlockKey key = TestKeys(TestNamespace(), 1, 82)[0];
    ASSERT_TRUE((*client)->Put(0, key, Block(key, 4096)).ok());
    std::vector<std::byte> dst(4096);
    ASSERT_TRUE((*client)->Get(0, key, dst).ok());
    EXPECT_TRUE(CheckBlockBytes(key, 0, dst));
    // What ten thousand idle connections cost the daemon.
    std::ifstream status("/proc/" + std::to_string(daemon.pid()) + "/status");
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("VmRSS:", 0) == 0) std::printf("kvtierd with %d connections: %s\n", kConnections, line.c_str());
    }
    for (int fd : fds) ::close(fd);
  }
  limit.rlim_cur = soft_before;
  ::setrlimit(RLIMIT_NOFILE, &limit);
}

// Numbers a client chooses freely: layer ranges past the block or empty,
// sizes past the arena (up to 2^64 - 1), plans of absurd sizes, loads with
// a negative or NaN compute time. Each is refused with InvalidArgument
// (per key, or for the request); nothing is reserved or pinned for it, and
// the connection stays usable.
TEST(HostileClient, OutOfRangeLayersSizesAndPlansAreRefused) {
  TestDaemon daemon;
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  const BlockKey key = TestKeys(TestNamespace(), 1, 91)[0];
  ASSERT_TRUE(client->Put(0, key, Block(key, 4096)).ok());
  RawConnection raw = HelloRaw(daemon);
  uint64_t id = 2;

  const std::vector<std::pair<uint32_t, uint32_t>> ranges = {
      {5, 3}, {1, 1}, {0, 0xffffffffu}, {0xfffffff0u, 0xffffffffu}, {2, 0}};
  for (const auto& [first, last] : ranges) {
    v1::Request pin = PinReq(id++, 0, std::span(&key, 1));
    pin.mutable_pin()->set_first_layer(first);
    pin.mutable_pin()->set_last_layer(last);
    auto answer = RoundTrip(raw, pin);
    ASSERT_TRUE(answer.ok()) << answer.status().ToString();
    const bool refused =
        HasCode(answer->status(), StatusCode::kInvalidArgument) ||
        (answer->pin().blocks_size() == 1 && HasCode(answer->pin().blocks(0).status(), StatusCode::kInvalidArgument));
    EXPECT_TRUE(refused) << "layers [" << first << ", " << last << "): " << answer->ShortDebugString();
  }

  const std::vector<BlockKey> fresh = TestKeys(TestNamespace(), 4, 92);
  const uint64_t arena = TestDaemonOptions{}.arena_bytes;
  auto reserved = RoundTrip(raw, ReserveReq(id++, 0, fresh, {UINT64_MAX, arena + 1, 0, uint64_t{1} << 63}));
  ASSERT_TRUE(reserved.ok()) << reserved.status().ToString();
  ASSERT_EQ(reserved->reserve().slots_size(), 4);
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(HasCode(reserved->reserve().slots(i).status(), StatusCode::kInvalidArgument)) << i;
  }

  v1::Request plan;
  plan.set_id(id++);
  plan.mutable_preload_plan()->set_source_tier(2);
  plan.mutable_preload_plan()->set_bytes_per_layer(UINT64_MAX);
  plan.mutable_preload_plan()->set_compute_us_per_layer(-1);
  plan.mutable_preload_plan()->set_layers(0);
  auto planned = RoundTrip(raw, plan);
  ASSERT_TRUE(planned.ok()) << planned.status().ToString();
  EXPECT_TRUE(HasCode(planned->status(), StatusCode::kInvalidArgument)) << planned->ShortDebugString();

  for (double compute : {-1.0, std::nan(""), 1e300}) {
    v1::Request load;
    load.set_id(id++);
    load.mutable_begin_load()->set_ns(0);
    load.mutable_begin_load()->add_keys(key.hi);
    load.mutable_begin_load()->add_keys(key.lo);
    load.mutable_begin_load()->set_compute_us_per_layer(compute);
    auto began = RoundTrip(raw, load);
    ASSERT_TRUE(began.ok()) << began.status().ToString();
    EXPECT_TRUE(HasCode(began->status(), StatusCode::kInvalidArgument)) << compute << ": " << began->ShortDebugString();
  }

  EXPECT_EQ(EngineCounter(daemon, "engine.reserved_blocks"), 0);
  EXPECT_EQ(EngineCounter(daemon, "engine.leases"), 0);
  auto lookup = RoundTrip(raw, LookupReq(id++, 0, std::span(&key, 1)));
  ASSERT_TRUE(lookup.ok()) << "the connection was closed: " << lookup.status().ToString();
  EXPECT_TRUE(HasCode(lookup->status(), StatusCode::kOk));
  ExpectDaemonServes(daemon);
}

}  // namespace
}  // namespace kvtier::testing

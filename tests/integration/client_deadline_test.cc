// Client deadlines and frame bounds: a daemon that never answers, stalls
// after Hello or inside a frame, or announces a huge frame costs a call at
// most its timeout and a clean Status (never a hang, never an allocation of
// the announced length); and the largest reply a legal request can draw
// never tears the connection down.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <sys/resource.h>
#include <vector>

#include "proto/wire.h"
#include "tests/testing/fake_daemon.h"
#include "tests/testing/test_daemon.h"

namespace kvtier::testing {
namespace {

using ::testing::HasSubstr;

// The timeouts under test: short, so a test waits little for them.
constexpr std::chrono::milliseconds kShortTimeout{200};
// How long a test lets a call run that should end by kShortTimeout. Not a
// timing assertion: it only turns a call that ignores its deadline into a
// failure instead of a hung test.
constexpr std::chrono::seconds kHangGuard{30};

// Runs `call` on another thread and returns its result. If it has not
// returned after kHangGuard, fails the test and destroys `fake` (which ends
// every wait on it), then collects the result.
template <typename Fn>
auto RunGuarded(std::unique_ptr<FakeDaemon>& fake, Fn call) -> decltype(call()) {
  auto future = std::async(std::launch::async, std::move(call));
  if (future.wait_for(kHangGuard) != std::future_status::ready) {
    ADD_FAILURE() << "the call ignored its deadline: still waiting after " << kHangGuard.count() << " s";
    fake.reset();
  }
  return future.get();
}

// A client of `fake` with `call_timeout`; null (and a test failure) if the
// Hello fails.
std::unique_ptr<Client> ConnectTo(std::unique_ptr<FakeDaemon>& fake, std::chrono::milliseconds call_timeout) {
  ClientOptions options = fake->Options();
  options.connect_timeout = std::chrono::seconds(10);
  options.call_timeout = call_timeout;
  auto client = RunGuarded(fake, [&options] { return Client::Connect(options); });
  if (!client.ok()) {
    ADD_FAILURE() << "Connect: " << client.status().ToString();
    return nullptr;
  }
  return std::move(*client);
}

// A connection failed by a timeout fails every later call at once, with
// Unavailable naming the cause.
void ExpectFailedFast(std::unique_ptr<FakeDaemon>& fake, Client& client) {
  const auto keys = TestKeys(TestNamespace(), 2, 3);
  const Status stats = RunGuarded(fake, [&client] { return client.Stats().status(); });
  EXPECT_EQ(stats.code(), StatusCode::kUnavailable) << stats.ToString();
  EXPECT_THAT(stats.message(), HasSubstr("call_timeout"));
  const Status lookup = RunGuarded(fake, [&] { return client.Lookup(0, keys).status(); });
  EXPECT_EQ(lookup.code(), StatusCode::kUnavailable) << lookup.ToString();
  const Status put = RunGuarded(fake, [&] { return client.Put(0, keys[0], Block(keys[0], 4096)); });
  EXPECT_EQ(put.code(), StatusCode::kUnavailable) << put.ToString();
}

TEST(ClientDeadline, ConnectTimesOutWhenHelloIsNeverAnswered) {
  auto fake = std::make_unique<FakeDaemon>(FakeDaemon::Behavior::kSilent);
  ClientOptions options = fake->Options();
  options.connect_timeout = kShortTimeout;
  auto client = RunGuarded(fake, [&options] { return Client::Connect(options); });
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), StatusCode::kTimedOut) << client.status().ToString();
  EXPECT_THAT(client.status().message(), HasSubstr("connect_timeout"));
}

TEST(ClientDeadline, CallTimesOutWhenTheDaemonStopsAnsweringAfterHello) {
  auto fake = std::make_unique<FakeDaemon>(FakeDaemon::Behavior::kHelloThenSilent);
  auto client = ConnectTo(fake, kShortTimeout);
  ASSERT_NE(client, nullptr);
  const auto keys = TestKeys(TestNamespace(), 4, 1);
  const Status lookup = RunGuarded(fake, [&] { return client->Lookup(0, keys).status(); });
  EXPECT_EQ(lookup.code(), StatusCode::kTimedOut) << lookup.ToString();
  EXPECT_THAT(lookup.message(), HasSubstr("call_timeout"));
  ExpectFailedFast(fake, *client);
}

// The daemon stops inside a response frame: the call times out, and the
// half-read frame is never resumed (later calls fail at once, nothing is
// parsed from a stream that lost its frame boundary). A call of the async
// API waiting at the same time fails with the connection.
TEST(ClientDeadline, CallTimesOutInsideAHalfSentFrame) {
  auto fake = std::make_unique<FakeDaemon>(FakeDaemon::Behavior::kHelloThenHalfFrame);
  auto client = ConnectTo(fake, kShortTimeout);
  ASSERT_NE(client, nullptr);
  const auto keys = TestKeys(TestNamespace(), 4, 2);
  auto waiting = client->LookupAsync(0, keys);  // the first request: half of its answer comes
  const Status stats = RunGuarded(fake, [&] { return client->Stats().status(); });
  EXPECT_EQ(stats.code(), StatusCode::kTimedOut) << stats.ToString();
  const Status async = RunGuarded(fake, [&waiting] { return waiting.get().status(); });
  EXPECT_EQ(async.code(), StatusCode::kTimedOut) << async.ToString();
  ExpectFailedFast(fake, *client);
}

int64_t PeakRssKiB() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss;
}

// A Hello answer announcing a ~4 GiB frame is refused on its header: the
// client must not allocate (and zero) the announced length first.
TEST(ClientDeadline, HugeHelloFrameIsAProtocolErrorWithoutAllocatingIt) {
  auto fake = std::make_unique<FakeDaemon>(FakeDaemon::Behavior::kHugeHelloHeader);
  ClientOptions options = fake->Options();
  options.connect_timeout = std::chrono::seconds(10);
  const int64_t peak_before_kib = PeakRssKiB();
  auto client = RunGuarded(fake, [&options] { return Client::Connect(options); });
  const int64_t grew_kib = PeakRssKiB() - peak_before_kib;
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), StatusCode::kProtocolError) << client.status().ToString();
  EXPECT_THAT(client.status().message(), HasSubstr("frame cap"));
  EXPECT_LT(grew_kib, int64_t{1} << 20) << "peak RSS grew by " << grew_kib
                                        << " KiB: the announced frame length was allocated";
}

// The largest `count` in [0, keys) whose request, built by `request_bytes`,
// fits the frame cap with room for the id Connection::Call adds (<= 10
// bytes).
template <typename RequestBytes>
size_t LargestBatch(size_t keys, uint32_t max_frame_bytes, RequestBytes request_bytes) {
  size_t lo = 0, hi = keys;  // request_bytes(lo) fits; find the last that does
  while (lo < hi) {
    const size_t mid = lo + (hi - lo + 1) / 2;
    if (request_bytes(mid) + 10 <= max_frame_bytes)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// `count` distinct keys.
std::vector<BlockKey> ManyKeys(size_t count) {
  std::vector<BlockKey> keys;
  keys.reserve(count);
  for (size_t i = 0; i < count; ++i) keys.push_back(BlockKey{0x6b76746965720000ull + i, i * 0x9e3779b97f4a7c15ull});
  return keys;
}

// Bytes of a response carrying one record per status in `statuses`, the
// way kvtierd answers a Reserve (to check the reply really is that big).
size_t ReserveReplyBytes(const std::vector<WritableBlock>& blocks) {
  v1::Response response;
  response.set_id(1);
  wire::ToProto(Status::Ok(), response.mutable_status());
  for (const auto& b : blocks) wire::ToProto(b.status, response.mutable_reserve()->add_slots()->mutable_status());
  return response.ByteSizeLong();
}

// The largest legal Reserve of blocks that can never fit: each key (16 +
// 4 bytes of request) draws a ~100-byte InvalidArgument, a reply of more
// than 5 times the frame cap. It arrives whole and the connection serves on.
TEST(ClientFrameBound, LargestReserveOfUnfittableBlocksKeepsTheConnection) {
  TestDaemonOptions daemon_options;
  daemon_options.arena_bytes = 8 << 20;
  TestDaemon daemon(daemon_options);
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  const uint32_t cap = daemon.Options().max_frame_bytes;
  const std::vector<BlockKey> all_keys = ManyKeys(cap / 16);
  const std::vector<uint64_t> all_sizes(all_keys.size(), daemon.host().capacity_bytes() + 1);
  const size_t n = LargestBatch(all_keys.size(), cap, [&](size_t k) {
    return wire::MakeReserve(0, std::span(all_keys).first(k), std::span(all_sizes).first(k)).ByteSizeLong();
  });
  ASSERT_GT(n, 1000u);

  auto reservation = client->Reserve(0, std::span(all_keys).first(n), std::span(all_sizes).first(n));
  ASSERT_TRUE(reservation.ok()) << reservation.status().ToString();
  ASSERT_EQ(reservation->blocks().size(), n);
  size_t refused = 0;
  for (const auto& b : reservation->blocks()) refused += b.status.code() == StatusCode::kInvalidArgument ? 1 : 0;
  EXPECT_EQ(refused, n) << "first: " << reservation->blocks()[0].status.ToString();
  EXPECT_GT(ReserveReplyBytes(reservation->blocks()), size_t{5} * cap) << "the reply is not as large as claimed";
  auto hit = client->Lookup(0, std::span(all_keys).first(1));
  ASSERT_TRUE(hit.ok()) << hit.status().ToString();
  EXPECT_EQ(hit->prefix_blocks, 0u);
}

// The largest legal GetLayers of a cached block with a layer range outside
// it (the same key over and over): each 16-byte key draws an
// InvalidArgument naming the range and the key, nearly 6 times the frame
// cap in all.
TEST(ClientFrameBound, LargestGetLayersWithABadRangeKeepsTheConnection) {
  TestDaemon daemon;
  auto client = daemon.ConnectSocketOnly();  // the directory would settle the range locally
  ASSERT_NE(client, nullptr);
  const NamespaceDescriptor ns = TestNamespace();
  const BlockKey key = TestKeys(ns, 1, 4)[0];
  std::vector<std::byte> block = Block(key, ns.BlockBytes());
  ASSERT_TRUE(client->Put(0, key, block).ok());
  const uint32_t cap = daemon.Options().max_frame_bytes;
  const uint32_t first_layer = 0, last_layer = ns.layer_count + 1;
  const std::vector<BlockKey> all_keys(cap / 16, key);
  const size_t n = LargestBatch(all_keys.size(), cap, [&](size_t k) {
    return wire::MakePinLayers(0, std::span(all_keys).first(k), first_layer, last_layer).ByteSizeLong();
  });
  ASSERT_GT(n, 1000u);

  const std::vector<std::span<std::byte>> dst(n, std::span<std::byte>(block));  // never written
  auto got = client->GetLayers(0, std::span(all_keys).first(n), first_layer, last_layer, dst);
  ASSERT_EQ(got.size(), n);
  size_t refused = 0;
  for (const auto& r : got) refused += r.status().code() == StatusCode::kInvalidArgument ? 1 : 0;
  EXPECT_EQ(refused, n) << "first: " << got[0].status().ToString();
  EXPECT_THAT(got[0].status().message(), HasSubstr("layer range"));
  std::vector<std::byte> whole(block.size());
  auto read = client->Get(0, key, whole);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_TRUE(CheckBlockBytes(key, 0, whole));
}

}  // namespace
}  // namespace kvtier::testing

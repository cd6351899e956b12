#include "tests/testing/protocol_checks.h"

#include <gmock/gmock.h>

#include <atomic>
#include <thread>

#include "common/framing.h"
#include "proto/wire.h"

namespace kvtier::testing {

using ::testing::HasSubstr;

::testing::AssertionResult HasCode(StatusCode got, const std::string& message, StatusCode want) {
  if (got == want) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "got " << StatusCodeName(got) << " (\"" << message << "\"), want "
                                       << StatusCodeName(want);
}
::testing::AssertionResult HasCode(const Status& s, StatusCode want) { return HasCode(s.code(), s.message(), want); }
::testing::AssertionResult HasCode(const v1::Status& s, StatusCode want) {
  return HasCode(static_cast<StatusCode>(s.code()), s.message(), want);
}

bool EventuallyTrue(const std::function<bool()>& done, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

void ExpectDaemonServes(const TestDaemon& daemon) {
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr) << "the daemon stopped accepting clients";
  static std::atomic<uint32_t> next_seed{9001};  // a fresh block per call
  const BlockKey key = TestKeys(TestNamespace(), 1, next_seed++)[0];
  Status put = client->Put(0, key, Block(key, 4096, 42));
  ASSERT_TRUE(put.ok()) << put.ToString();
  std::vector<std::byte> dst(4096);
  auto got = client->Get(0, key, dst);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, dst.size());
  EXPECT_TRUE(CheckBlockBytes(key, 42, dst));
}

RawConnection HelloRaw(const TestDaemon& daemon) {
  RawConnection raw;
  Status connected = raw.Connect(daemon.socket_path());
  EXPECT_TRUE(connected.ok()) << connected.ToString();
  auto hello = raw.Hello({TestNamespace()});
  EXPECT_TRUE(hello.ok()) << hello.status().ToString();
  if (hello.ok()) {
    EXPECT_TRUE(HasCode(hello->status(), StatusCode::kOk));
  }
  EXPECT_EQ(raw.received_fd_count(), 2) << "Hello must carry the arena and block directory fds";
  return raw;
}

Result<v1::Response> RoundTrip(RawConnection& raw, const v1::Request& request) {
  if (Status s = raw.SendFrame(request); !s.ok()) return s;
  return raw.ReadResponse();
}

std::vector<uint8_t> FrameHeader(uint32_t payload_bytes) {
  std::vector<uint8_t> header(kFrameHeaderBytes);
  EncodeFrameHeader(payload_bytes, header.data());
  return header;
}

v1::Request WithId(uint64_t id, v1::Request r) {
  r.set_id(id);
  return r;
}
v1::Request LookupReq(uint64_t id, uint32_t ns, std::span<const BlockKey> keys) {
  return WithId(id, wire::MakeLookup(ns, keys));
}
v1::Request ReserveReq(uint64_t id, uint32_t ns, std::span<const BlockKey> keys, std::vector<uint64_t> sizes) {
  return WithId(id, wire::MakeReserve(ns, keys, sizes));
}
v1::Request CommitReq(uint64_t id, uint32_t ns, std::span<const BlockKey> keys, std::vector<uint64_t> sizes) {
  return WithId(id, wire::MakeCommit(ns, keys, sizes));
}
v1::Request PinReq(uint64_t id, uint32_t ns, std::span<const BlockKey> keys) {
  return WithId(id, wire::MakePin(ns, keys));
}
v1::Request EraseReq(uint64_t id, uint32_t ns, std::span<const BlockKey> keys) {
  return WithId(id, wire::MakeErase(ns, keys));
}
v1::Request StatsReq(uint64_t id) { return WithId(id, wire::MakeStats()); }

void ExpectConnectionError(RawConnection& raw, const std::string& message_part) {
  auto r = raw.ReadResponse();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->id(), 0u);
  EXPECT_TRUE(HasCode(r->status(), StatusCode::kProtocolError));
  EXPECT_THAT(r->status().message(), HasSubstr(message_part));
  EXPECT_TRUE(raw.IsClosedByPeer()) << "the daemon must close after a framing error";
}

}  // namespace kvtier::testing

// Checks for protocol tests: exact status codes, a daemon that still
// serves, raw connections that said Hello, and the request builders of the
// client library with the ids a raw connection sets. Shared by the bad-input
// and hostile-client tests.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kvtier/block_key.h"
#include "kvtier/status.h"
#include "kvtier/v1/kvtier.pb.h"
#include "tests/testing/raw_connection.h"
#include "tests/testing/test_daemon.h"

namespace kvtier::testing {

::testing::AssertionResult HasCode(StatusCode got, const std::string& message, StatusCode want);
::testing::AssertionResult HasCode(const Status& s, StatusCode want);
::testing::AssertionResult HasCode(const v1::Status& s, StatusCode want);

// Polls `done` every 10 ms for up to `limit`: cleanup after a peer dies is
// asynchronous and has no event to wait on from here.
bool EventuallyTrue(const std::function<bool()>& done, std::chrono::milliseconds limit = std::chrono::seconds(5));

// The daemon still serves: a fresh Client connects and round-trips a block.
void ExpectDaemonServes(const TestDaemon& daemon);

// A raw connection that has said Hello with TestNamespace() registered.
RawConnection HelloRaw(const TestDaemon& daemon);

Result<v1::Response> RoundTrip(RawConnection& raw, const v1::Request& request);
std::vector<uint8_t> FrameHeader(uint32_t payload_bytes);

// The client library's request builders, with the id a raw connection sets.
v1::Request WithId(uint64_t id, v1::Request r);
v1::Request LookupReq(uint64_t id, uint32_t ns, std::span<const BlockKey> keys);
v1::Request ReserveReq(uint64_t id, uint32_t ns, std::span<const BlockKey> keys, std::vector<uint64_t> sizes);
v1::Request CommitReq(uint64_t id, uint32_t ns, std::span<const BlockKey> keys, std::vector<uint64_t> sizes);
v1::Request PinReq(uint64_t id, uint32_t ns, std::span<const BlockKey> keys);
v1::Request EraseReq(uint64_t id, uint32_t ns, std::span<const BlockKey> keys);
v1::Request StatsReq(uint64_t id);

// Expects a connection-level error: id 0, ProtocolError, then the close.
void ExpectConnectionError(RawConnection& raw, const std::string& message_part);

}  // namespace kvtier::testing

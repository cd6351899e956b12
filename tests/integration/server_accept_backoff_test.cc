// The server's accept backoff (daemon/server/server.h) on the daemon's
// fake clock: an accept that fails (EMFILE: this process at its descriptor
// limit) waits 1 ms of that clock before the next, twice that after a
// second failure in a row, and accepting resumes once the clock passed the
// wait and descriptors are free again. The test moves the clock; it never
// sleeps. (One test per process under ctest, so the lowered limit touches
// nothing else; it is restored before the test ends.)
#include <gtest/gtest.h>

#include <unistd.h>

#include "common/unix_socket.h"
#include "tests/testing/counter_of.h"
#include "tests/testing/descriptor_limit.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/test_daemon.h"

namespace kvtier::testing {
namespace {

TEST(ServerAcceptBackoff, AFailedAcceptWaitsOnTheDaemonsClockDoublingPerFailure) {
  FakeClock clock;
  TestDaemonOptions options;
  options.clock = &clock;
  TestDaemon daemon(options);
  ASSERT_EQ(CounterOf(daemon.server(), "server.accept_errors"), 0);
  // One client per io thread first: each io context has made its own
  // descriptors (asio's reactor) before descriptors run out.
  auto early = daemon.Connect();
  auto early_too = daemon.Connect();
  ASSERT_NE(early, nullptr);
  ASSERT_NE(early_too, nullptr);

  TightDescriptorLimit limit(1);  // room for the client's socket only
  ASSERT_TRUE(limit.ok());
  // Queued; its accept finds no descriptor left.
  const Result<int> waiting = ConnectUnix(daemon.socket_path());
  ASSERT_TRUE(waiting.ok()) << waiting.status().ToString();
  const uint64_t first_failure_us = clock.NowUs();
  const uint64_t first_wait_end = clock.AwaitWaiter();
  EXPECT_EQ(first_wait_end, first_failure_us + 1'000) << "1 ms after the first failure";
  EXPECT_EQ(CounterOf(daemon.server(), "server.accept_errors"), 1) << "no accept again before the wait ended";
  clock.SetUs(first_wait_end);
  const uint64_t second_wait_end = clock.AwaitWaiter();
  EXPECT_EQ(second_wait_end, first_wait_end + 2'000) << "doubled after the second failure in a row";
  EXPECT_EQ(CounterOf(daemon.server(), "server.accept_errors"), 2);

  ASSERT_TRUE(limit.Restore());
  clock.SetUs(second_wait_end);
  auto client = daemon.Connect();  // accepted once the wait ended: the queued one first, then this
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(CounterOf(daemon.server(), "server.accept_errors"), 2);
  ::close(*waiting);
}

}  // namespace
}  // namespace kvtier::testing

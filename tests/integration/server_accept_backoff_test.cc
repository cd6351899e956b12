// The server's accept backoff (daemon/server/server.h) on the daemon's
// fake clock: an accept that fails (EMFILE: this process at its descriptor
// limit) waits 1 ms of that clock before the next, twice that after a
// second failure in a row, and accepting resumes once the clock passed the
// wait and descriptors are free again. The test moves the clock; it never
// sleeps. (One test per process under ctest, so the lowered limit touches
// nothing else; it is restored before the test ends.)
#include <gtest/gtest.h>

#include <sys/socket.h>
#include <sys/time.h>
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

// The io threads make their descriptors (asio's reactor: epoll, eventfd,
// timerfd) when the server starts, not when a connection first lands on
// them: descriptors that run out later fail an accept, which backs off,
// and never the io thread. Before, the second connection's io context made
// its reactor at that accept, asio threw from the accept loop, and the
// daemon stopped accepting or aborted.
// An oversized frame on `fd`: the daemon answers an error and closes.
// True once the answer and the close came (within 10 s).
bool AnsweredAndClosed(int fd) {
  const timeval timeout{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  const uint32_t oversized = 0xffffffffu;
  if (::write(fd, &oversized, sizeof(oversized)) != static_cast<ssize_t>(sizeof(oversized))) return false;
  char reply[4096];
  ssize_t got = 0, total = 0;
  while ((got = ::read(fd, reply, sizeof(reply))) > 0) total += got;
  return got == 0 && total > 0;
}

TEST(ServerAcceptBackoff, DescriptorsThatRunOutWhenAConnectionLandsOnAFreshIoThreadFailOnlyTheAccept) {
  // On the system clock: an accept that finds the limit (Linux takes the
  // descriptor before it looks for a connection, so the accept after the
  // second one fails while the limit stands) backs off 1 ms, which this
  // test need not drive.
  TestDaemonOptions options;
  options.io_threads = 2;
  TestDaemon daemon(options);

  {
    // Room for two clients' sockets and the two accepted ones, nothing
    // more. The first connection lands on the first io thread (the
    // acceptor's), the second on the second io thread, which no connection
    // has used yet: it must not need a descriptor of its own then.
    TightDescriptorLimit limit(4);
    ASSERT_TRUE(limit.ok());
    const Result<int> first = ConnectUnix(daemon.socket_path());
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    const Result<int> second = ConnectUnix(daemon.socket_path());
    ASSERT_TRUE(second.ok()) << second.status().ToString();
    EXPECT_TRUE(AnsweredAndClosed(*second)) << "the connection on the second io thread is served";
    EXPECT_TRUE(AnsweredAndClosed(*first)) << "the connection on the first io thread is served";
    ::close(*first);
    ::close(*second);
    ASSERT_TRUE(limit.Restore());
  }
  // The accept loop is alive and both io threads serve: two clients, one
  // on each, each with a round trip.
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < 2; ++i) {
    clients.push_back(daemon.Connect());
    ASSERT_NE(clients.back(), nullptr) << "client " << i;
    EXPECT_TRUE(clients.back()->Lookup(0, std::vector<BlockKey>{BlockKey{1, 2}}).ok()) << "client " << i;
  }
  EXPECT_EQ(CounterOf(daemon.server(), "server.connections_accepted"), 4);
}

}  // namespace
}  // namespace kvtier::testing

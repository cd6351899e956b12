// The metrics listener's pause after a failed accept (metrics_server.h) on
// the daemon's clock: an accept that fails (EMFILE: this process at its
// descriptor limit) waits 100 ms of that clock before the next, and the
// connection that waited is served once the clock passed the pause and
// descriptors are free again. The test moves the clock; it never sleeps.
// (One test per process under ctest, so the lowered limit touches nothing
// else; it is restored before the test ends.)
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "daemon/server/metrics_server.h"
#include "tests/testing/descriptor_limit.h"
#include "tests/testing/fake_clock.h"

namespace kvtier::testing {
namespace {

TEST(MetricsAcceptPause, AFailedAcceptPausesTheListenerOnTheDaemonsClock) {
  FakeClock clock;
  MetricsOptions options;
  options.clock = &clock;
  auto server = MetricsServer::Start(options, [](MetricsView) { return std::string("kvtier_up 1\n"); });
  ASSERT_TRUE(server.ok()) << server.status().ToString();

  TightDescriptorLimit limit(1);  // room for the client's socket only
  ASSERT_TRUE(limit.ok());
  const int client = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons((*server)->port());
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  // Queued in the backlog; the listener's accept finds no descriptor left.
  const bool connected = client >= 0 && ::connect(client, reinterpret_cast<sockaddr*>(&to), sizeof(to)) == 0;
  const uint64_t failed_at = clock.NowUs();
  const uint64_t pause_end = connected ? clock.AwaitWaiter() : 0;
  ASSERT_TRUE(limit.Restore());
  ASSERT_TRUE(connected);
  EXPECT_EQ(pause_end, failed_at + 100'000) << "100 ms of the daemon's clock";

  clock.SetUs(pause_end);  // the listener accepts again: the connection that waited is served
  timeval timeout{10, 0};
  ASSERT_EQ(::setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout)), 0);
  const std::string request = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_EQ(::send(client, request.data(), request.size(), 0), static_cast<ssize_t>(request.size()));
  char reply[256] = {};
  const ssize_t got = ::recv(client, reply, sizeof(reply) - 1, 0);
  ::close(client);
  ASSERT_GT(got, 0) << "no answer after the pause";
  EXPECT_EQ(std::string(reply, static_cast<size_t>(got)).rfind("HTTP/1.1 200", 0), 0u) << reply;
}

}  // namespace
}  // namespace kvtier::testing

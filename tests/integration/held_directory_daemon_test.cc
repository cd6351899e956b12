// HeldDirectory (subscriber/held_directory.h) following a real kvtierd's
// KV events over tcp, as the peer tier does: what the daemon's host tier
// stores shows up, a second subscriber past events.max_subscribers is
// refused and stays unknown (not known with a snapshot that never moves),
// and a daemon restarted on the same endpoints is synced afresh.
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <thread>

#include "subscriber/held_directory.h"
#include "tests/testing/daemon_clients.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/redis_cluster.h"
#include "tests/testing/test_daemon.h"

namespace kvtier::testing {
namespace {

using namespace std::chrono_literals;

constexpr size_t kBlockBytes = 64 << 10;  // TestNamespace()'s whole block

std::string EventsToml(int pub, int replay) {
  return "[host]\ncapacity_bytes = \"16MiB\"\nlock_memory = \"off\"\n"
         "[events]\nendpoint = \"tcp://127.0.0.1:" +
         std::to_string(pub) + "\"\nreplay_endpoint = \"tcp://127.0.0.1:" + std::to_string(replay) +
         "\"\nmax_subscribers = 1\n"
         "[metrics]\nenabled = false\n";
}

// Waits (at most 10 s) until `check` holds.
template <typename F>
bool Eventually(F check) {
  for (auto until = std::chrono::steady_clock::now() + 10s; std::chrono::steady_clock::now() < until;) {
    if (check()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return false;
}

int64_t CounterOfDirectory(const events::HeldDirectory& d, std::string_view name) {
  CounterCollector c;
  d.VisitCounters(c);
  for (const auto& [n, v] : c.counters()) {
    if (n == name) return v;
  }
  return -1;
}

TEST(HeldDirectoryDaemon, FollowsADaemonsEventsRefusesPastItsCapAndSyncsAfterARestart) {
  const std::vector<int> ports = FreeLoopbackPorts(2);
  const std::string pub = "tcp://127.0.0.1:" + std::to_string(ports[0]);
  const std::string replay = "tcp://127.0.0.1:" + std::to_string(ports[1]);
  auto daemon = std::make_unique<DaemonProcess>(KVTIERD_PATH, "", EventsToml(ports[0], ports[1]));
  ASSERT_TRUE(daemon->running());
  auto client = ConnectTo(*daemon);
  ASSERT_NE(client, nullptr);

  events::HeldDirectory directory({.max_blocks = 1000, .retry = 100ms, .answer_timeout = 2000ms, .open = {}});
  directory.Follow("x", pub, replay);
  const auto keys = TestKeys(TestNamespace(), 6, 31);
  ASSERT_TRUE(Eventually([&] { return directory.Leading("x", keys) == 0u; })) << LogOf(*daemon);
  for (const auto& k : keys) ASSERT_TRUE(client->Put(0, k, Block(k, kBlockBytes)).ok());
  ASSERT_TRUE(Eventually([&] { return directory.Leading("x", keys) == keys.size(); })) << LogOf(*daemon);
  EXPECT_EQ(CounterOfDirectory(directory, "peer_events.failures"), 0);

  // One subscriber is all the daemon takes: a second one is refused and never known.
  directory.Follow("y", pub, replay);
  ASSERT_TRUE(Eventually([&] { return CounterOfDirectory(directory, "peer_events.failures") >= 1; }));
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(directory.Leading("y", keys), std::nullopt);
  EXPECT_EQ(directory.Leading("x", keys), keys.size());
  directory.Unfollow("y");

  // The daemon restarts on the same endpoints, its host tier empty: x is synced afresh.
  client.reset();
  ASSERT_EQ(daemon->SignalAndWait(SIGKILL, 5000), -1);
  daemon = std::make_unique<DaemonProcess>(KVTIERD_PATH, "", EventsToml(ports[0], ports[1]));
  ASSERT_TRUE(daemon->running());
  client = ConnectTo(*daemon);
  ASSERT_NE(client, nullptr);
  const auto later = TestKeys(TestNamespace(), 3, 32);
  for (const auto& k : later) ASSERT_TRUE(client->Put(0, k, Block(k, kBlockBytes)).ok());
  ASSERT_TRUE(Eventually([&] { return directory.Leading("x", later) == later.size(); })) << LogOf(*daemon);
  EXPECT_EQ(directory.Leading("x", keys), 0u);
  EXPECT_EQ(CounterOfDirectory(directory, "peer_events.blocks"), static_cast<int64_t>(later.size()));
}

}  // namespace
}  // namespace kvtier::testing

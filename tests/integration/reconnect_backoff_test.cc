// Tests of the client's reconnect backoff (client_lib/reconnect.h) on a
// fake clock: after a failed attempt the next one waits for its backoff
// (drawn from [d/2, d], d doubling per failure) on the Reconnector's
// clock, not a moment less, whatever the daemon does meanwhile; once the
// clock passed it, one attempt reconnects. No test sleeps.
#include "client_lib/reconnect.h"

#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "tests/testing/fake_clock.h"
#include "tests/testing/fake_daemon.h"
#include "tests/testing/test_daemon.h"

namespace kvtier::internal {
namespace {

using ::kvtier::testing::FakeClock;
using ::kvtier::testing::FakeDaemon;

constexpr uint64_t kMs = 1000;

class ReconnectBackoffTest : public ::testing::Test {
 protected:
  ReconnectBackoffTest() : dir_(::kvtier::testing::MakeTempDir()), path_(dir_ + "/kvtierd.sock") {}
  ~ReconnectBackoffTest() override {
    daemon_.reset();
    ::kvtier::testing::RemoveTree(dir_);
  }

  // A daemon at the socket path (a restarted one, as far as the client can tell).
  void StartDaemon() { daemon_.emplace(FakeDaemon::Behavior::kHelloThenSilent, path_); }
  // Connects to it, then stops it: the connection's peer closed.
  std::shared_ptr<Connection> ConnectThenStop(ClientOptions& options) {
    StartDaemon();
    options = daemon_->Options();
    options.reconnect = true;
    options.reconnect_min_backoff = std::chrono::milliseconds(1000);
    options.reconnect_max_backoff = std::chrono::milliseconds(4000);
    auto first = Connection::Open(options);
    EXPECT_TRUE(first.ok()) << first.status().ToString();
    daemon_.reset();
    if (!first.ok()) return nullptr;
    // The hang-up is an event the connection sees at its next liveness poll.
    while ((*first)->Alive()) std::this_thread::yield();
    return *first;
  }

  const std::string dir_;
  const std::string path_;
  std::optional<FakeDaemon> daemon_;
  FakeClock clock_;
};

TEST_F(ReconnectBackoffTest, AFailedAttemptWaitsItsBackoffOnTheClockThenReconnects) {
  ClientOptions options;
  std::shared_ptr<Connection> first = ConnectThenStop(options);
  ASSERT_NE(first, nullptr);
  Reconnector link(options, first, clock_);
  EXPECT_EQ(link.Current(), first) << "the first attempt finds no daemon";
  StartDaemon();                    // back at once: only the backoff keeps the next attempt off
  clock_.AdvanceUs(500 * kMs - 1);  // the shortest draw of the first backoff, less a microsecond
  EXPECT_EQ(link.Current(), first) << "no attempt before its backoff passed";
  EXPECT_EQ(link.reconnects(), 0u);
  clock_.AdvanceUs(500 * kMs + 1);  // the longest draw passed
  std::shared_ptr<Connection> fresh = link.Current();
  EXPECT_NE(fresh, first);
  EXPECT_EQ(link.reconnects(), 1u);
  EXPECT_EQ(link.Current(), fresh);
}

TEST_F(ReconnectBackoffTest, TheBackoffDoublesPerFailedAttempt) {
  ClientOptions options;
  std::shared_ptr<Connection> first = ConnectThenStop(options);
  ASSERT_NE(first, nullptr);
  Reconnector link(options, first, clock_);
  EXPECT_EQ(link.Current(), first);  // attempt 1 fails: [500, 1000] ms
  clock_.AdvanceUs(1000 * kMs);
  EXPECT_EQ(link.Current(), first);  // attempt 2 fails: [1000, 2000] ms
  StartDaemon();
  clock_.AdvanceUs(1000 * kMs - 1);
  EXPECT_EQ(link.Current(), first) << "the second backoff is at least twice the first's shortest";
  EXPECT_EQ(link.reconnects(), 0u);
  clock_.AdvanceUs(1000 * kMs + 1);
  EXPECT_NE(link.Current(), first);
  EXPECT_EQ(link.reconnects(), 1u);
}

}  // namespace
}  // namespace kvtier::internal

// Zero-copy handles outliving their Client: a BlockView keeps its pin (and
// so its exact bytes) and a Reservation its space after the Client is
// destroyed, their Release/Commit still reach the daemon, and the connection
// closes once the last of them is gone.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <thread>
#include <utility>
#include <vector>

#include "tests/testing/test_daemon.h"

namespace kvtier::testing {
namespace {

// Polls `done` every 10 ms for up to 5 s: a closed socket is handled by the
// daemon asynchronously, with no event a test could wait on.
bool EventuallyTrue(const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

// An 8 MiB arena: filling it with MiB blocks reuses any extent not pinned.
TestDaemonOptions SmallArena() {
  TestDaemonOptions options;
  options.arena_bytes = 8 << 20;
  return options;
}

// Puts block A (a MiB, salt 7) through a fresh client, pins it and destroys
// that client. Returns the view; the test fails if any step does.
BlockView PinThenDestroyClient(TestDaemon& daemon, const BlockKey& a) {
  auto client = daemon.Connect();
  if (client == nullptr) return {};
  Status put = client->Put(0, a, Block(a, kMiBBlock, 7));
  EXPECT_TRUE(put.ok()) << put.ToString();
  auto views = client->Pin(0, std::span(&a, 1));
  EXPECT_TRUE(views[0].ok()) << views[0].status().ToString();
  if (!views[0].ok()) return {};
  return std::move(*views[0]);
}  // the Client goes here; the view stays

TEST(ViewLifetime, ViewOutlivingItsClientKeepsItsBytesAndItsPin) {
  TestDaemon daemon(SmallArena());
  const BlockKey a = TestKeys(TestNamespace(), 1, 31)[0];
  BlockView view = PinThenDestroyClient(daemon, a);
  ASSERT_TRUE(view.valid());

  // Another client fills the arena: every extent that is not pinned is
  // evicted and written over with other blocks.
  auto other = daemon.Connect();
  ASSERT_NE(other, nullptr);
  FillArenaWithMiBBlocks(daemon, *other, 32, /*extra=*/0);
  EXPECT_TRUE(CheckBlockBytes(a, 7, view.data())) << "the view shows another block's bytes";
  EXPECT_EQ(EngineCounter(daemon, "engine.leases"), 1) << "the pin died with the Client";
  auto hit = other->Lookup(0, std::span(&a, 1));
  ASSERT_TRUE(hit.ok()) << hit.status().ToString();
  EXPECT_EQ(hit->prefix_blocks, 1u) << "a pinned block was evicted";

  Status released = view.Release();
  EXPECT_TRUE(released.ok()) << released.ToString();
  EXPECT_FALSE(view.valid());
  EXPECT_EQ(EngineCounter(daemon, "engine.leases"), 0);
  EXPECT_EQ(EngineCounter(daemon, "engine.pinned_blocks"), 0);
  // The released view was the connection's last user: it closes.
  EXPECT_TRUE(EventuallyTrue([&] { return ServerCounter(daemon, "server.connections_open") == 1; }))
      << "the first client's connection stayed open";
}

// Dropping the last view of a destroyed Client releases the pin (its
// deferred release, or the closing socket) and closes the connection.
TEST(ViewLifetime, DroppingTheLastViewOfADestroyedClientClosesItsConnection) {
  TestDaemon daemon(SmallArena());
  const BlockKey a = TestKeys(TestNamespace(), 1, 33)[0];
  {
    BlockView view = PinThenDestroyClient(daemon, a);
    ASSERT_TRUE(view.valid());
    EXPECT_EQ(EngineCounter(daemon, "engine.leases"), 1);
  }
  EXPECT_TRUE(EventuallyTrue([&] { return EngineCounter(daemon, "engine.leases") == 0; }));
  EXPECT_TRUE(EventuallyTrue([&] { return ServerCounter(daemon, "server.connections_open") == 0; }));
}

// A Reservation keeps its space after its Client is destroyed, and its
// Commit still publishes the block.
TEST(ViewLifetime, ReservationOutlivingItsClientStillCommits) {
  TestDaemon daemon(SmallArena());
  const auto keys = TestKeys(TestNamespace(), 2, 34);
  const std::vector<uint64_t> sizes = {kMiBBlock, 4096};
  Result<Reservation> reservation = InvalidArgument("not reserved");
  {
    auto client = daemon.Connect();
    ASSERT_NE(client, nullptr);
    reservation = client->Reserve(0, keys, sizes);
  }  // the Client goes here
  ASSERT_TRUE(reservation.ok()) << reservation.status().ToString();
  for (auto& b : reservation->blocks()) {
    ASSERT_TRUE(b.status.ok()) << b.status.ToString();
    FillBlockBytes(b.key, 5, b.data);
  }
  for (const Status& s : reservation->Commit()) EXPECT_TRUE(s.ok()) << s.ToString();

  auto other = daemon.Connect();
  ASSERT_NE(other, nullptr);
  std::vector<std::byte> dst(kMiBBlock);
  for (size_t i = 0; i < keys.size(); ++i) {
    auto got = other->Get(0, keys[i], dst);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, sizes[i]);
    EXPECT_TRUE(CheckBlockBytes(keys[i], 5, std::span(dst).first(*got)));
  }
}

}  // namespace
}  // namespace kvtier::testing

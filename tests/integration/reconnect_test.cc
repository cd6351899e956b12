// Client reconnect (ClientOptions::reconnect): kvtierd, a child process,
// is SIGKILLed and started again on the same socket under a running
// Client. Calls meanwhile fail fast with Unavailable, later calls work
// again on the same Client and NamespaceIds, and handles from before the
// restart stay safe (their bytes stay mapped) without reaching the new
// daemon.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <fcntl.h>
#include <fstream>
#include <map>
#include <spawn.h>
#include <string>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include "tests/testing/test_daemon.h"

extern char** environ;

namespace kvtier::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

constexpr size_t kBlockBytes = 64 << 10;

// The kvtierd binary on a fixed socket path in a temp dir, which can be
// killed and started again on that same path (DaemonProcess makes a new
// path per daemon).
class RestartableKvtierd {
 public:
  RestartableKvtierd() : dir_(MakeTempDir()) {
    socket_path_ = dir_ + "/kvtierd.sock";
    config_path_ = dir_ + "/kvtierd.toml";
    std::ofstream(config_path_) << "[server]\nsocket_path = \"" << socket_path_ << "\"\n"
                                << "[host]\ncapacity_bytes = \"64MiB\"\nlock_memory = \"off\"\n"
                                << "[metrics]\nport = 0\n";
    Start();
  }
  ~RestartableKvtierd() {
    Kill();
    RemoveTree(dir_);
  }

  const std::string& socket_path() const { return socket_path_; }
  bool running() const { return pid_ > 0; }

  // Spawns kvtierd and waits (up to 10 s) until its socket accepts.
  void Start() {
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    const std::string log = dir_ + "/kvtierd.log";
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_CREAT | O_WRONLY | O_APPEND, 0600);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    std::vector<std::string> args = {KVTIERD_PATH, "--config", config_path_};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = -1;
    const int err = ::posix_spawn(&pid, KVTIERD_PATH, &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    ASSERT_EQ(err, 0) << "posix_spawn kvtierd";
    pid_ = pid;
    // A probe with a short connect_timeout: a Client that connects.
    ClientOptions probe;
    probe.socket_path = socket_path_;
    probe.connect_timeout = milliseconds(1000);
    probe.reconnect = false;
    for (int i = 0; i < 200; ++i) {
      if (Client::Connect(probe).ok()) return;
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        FAIL() << "kvtierd exited early; log in " << log;
      }
      std::this_thread::sleep_for(milliseconds(50));
    }
    FAIL() << "kvtierd did not start listening; log in " << log;
  }

  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  std::string dir_;
  std::string socket_path_;
  std::string config_path_;
  pid_t pid_ = -1;
};

ClientOptions ReconnectingOptions(const RestartableKvtierd& daemon) {
  ClientOptions options;
  options.socket_path = daemon.socket_path();
  options.namespaces = {TestNamespace("other"), TestNamespace()};  // NamespaceId 1 is TestNamespace()
  options.call_timeout = std::chrono::seconds(30);
  options.connect_timeout = std::chrono::seconds(5);
  options.reconnect_min_backoff = milliseconds(10);
  options.reconnect_max_backoff = milliseconds(100);
  return options;
}

// Polls Stats (every ~5 ms, up to 10 s) until it succeeds.
Status StatsEventually(Client& client) {
  const auto deadline = steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    auto r = client.Stats();
    if (r.ok() || steady_clock::now() > deadline) return r.status();
    std::this_thread::sleep_for(milliseconds(5));
  }
}

std::map<std::string, int64_t> Counters(Client& client) {
  std::map<std::string, int64_t> out;
  auto r = client.Stats();
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (r.ok()) {
    for (const auto& c : *r) out[c.name] = c.value;
  }
  return out;
}

// A put/get loop keeps running while kvtierd is killed and started again:
// every answer is byte-exact or a miss, calls while it is down fail with
// Unavailable far sooner than call_timeout, and afterwards the same Client
// (same NamespaceIds) works again.
TEST(Reconnect, PutGetLoopSurvivesADaemonRestart) {
  RestartableKvtierd daemon;
  ASSERT_TRUE(daemon.running());
  const ClientOptions options = ReconnectingOptions(daemon);
  auto connected = Client::Connect(options);
  ASSERT_TRUE(connected.ok()) << connected.status().ToString();
  Client& client = **connected;
  constexpr NamespaceId kNs = 1;

  std::atomic<bool> stop{false};
  std::atomic<int64_t> ok_rounds{0}, unavailable{0}, misses{0}, wrong{0}, other_errors{0};
  std::atomic<int64_t> slowest_failure_us{0};
  std::string first_other_error;
  std::thread loop([&] {
    std::vector<std::byte> got(kBlockBytes);
    for (uint32_t i = 0; !stop.load(); ++i) {
      const BlockKey key = TestKeys(TestNamespace(), 1, 1000 + i)[0];
      const auto started = steady_clock::now();
      Status put = client.Put(kNs, key, Block(key, kBlockBytes, i));
      Status outcome = put;
      if (put.ok()) {
        auto get = client.Get(kNs, key, got);
        if (get.ok()) {
          if (*get != kBlockBytes || !CheckBlockBytes(key, i, got)) wrong.fetch_add(1);
        } else {
          outcome = get.status();
        }
      }
      const int64_t took_us =
          std::chrono::duration_cast<std::chrono::microseconds>(steady_clock::now() - started).count();
      if (outcome.ok()) {
        ok_rounds.fetch_add(1);
        continue;
      }
      if (took_us > slowest_failure_us.load()) slowest_failure_us.store(took_us);
      if (outcome.code() == StatusCode::kUnavailable) {
        unavailable.fetch_add(1);
      } else if (outcome.code() == StatusCode::kNotFound) {
        misses.fetch_add(1);  // put on the old daemon, got from the new one
      } else {
        if (other_errors.fetch_add(1) == 0) first_other_error = outcome.ToString();
      }
      std::this_thread::sleep_for(milliseconds(1));  // the daemon is down: do not spin
    }
  });
  auto wait_for = [](const std::atomic<int64_t>& counter, int64_t at_least) {
    const auto deadline = steady_clock::now() + std::chrono::seconds(20);
    while (counter.load() < at_least && steady_clock::now() < deadline) std::this_thread::sleep_for(milliseconds(5));
    return counter.load() >= at_least;
  };
  EXPECT_TRUE(wait_for(ok_rounds, 20)) << "the loop made no progress before the restart";
  daemon.Kill();
  EXPECT_TRUE(wait_for(unavailable, 5)) << "calls while kvtierd is down did not fail with Unavailable";
  const int64_t ok_before = ok_rounds.load();
  daemon.Start();
  ASSERT_TRUE(daemon.running());
  EXPECT_TRUE(wait_for(ok_rounds, ok_before + 20)) << "calls did not work again after the restart";
  stop = true;
  loop.join();

  EXPECT_EQ(wrong.load(), 0) << "a get returned bytes other than the put's";
  EXPECT_EQ(other_errors.load(), 0) << first_other_error;
  EXPECT_GE(unavailable.load(), 5);
  // Far below call_timeout (30 s): nothing waited for an answer that could
  // not come. Not a speed assertion (a reconnect attempt may take up to
  // connect_timeout, which is 5 s here and never needed that long).
  EXPECT_LT(slowest_failure_us.load(), 5'000'000) << "a failing call waited";
  EXPECT_EQ(client.reconnects(), 1u);

  // Both namespaces are registered again under their ids: bytes are exact.
  for (NamespaceId ns : {NamespaceId{0}, kNs}) {
    const BlockKey key = TestKeys(options.namespaces[ns], 2, 77)[1];
    ASSERT_TRUE(client.Put(ns, key, Block(key, kBlockBytes, ns)).ok());
    std::vector<std::byte> got(kBlockBytes);
    auto get = client.Get(ns, key, got);
    ASSERT_TRUE(get.ok()) << get.status().ToString();
    EXPECT_TRUE(CheckBlockBytes(key, ns, got));
    auto hit = client.Lookup(ns, std::span<const BlockKey>(&key, 1));
    ASSERT_TRUE(hit.ok()) << hit.status().ToString();
    EXPECT_EQ(hit->prefix_blocks, 1u);
  }
  EXPECT_EQ(client.namespaces().size(), 2u);
}

// A BlockView pinned before the restart still shows its bytes (the old
// arena stays mapped while it lives); its Release fails without reaching
// the new daemon. A Reservation from before cannot be committed into the
// new daemon, and its span stays writable memory. A layer-wise load from
// before ends with Unavailable.
TEST(Reconnect, HandlesFromBeforeARestartStaySafe) {
  RestartableKvtierd daemon;
  ASSERT_TRUE(daemon.running());
  auto connected = Client::Connect(ReconnectingOptions(daemon));
  ASSERT_TRUE(connected.ok()) << connected.status().ToString();
  Client& client = **connected;
  constexpr NamespaceId kNs = 1;
  const auto keys = TestKeys(TestNamespace(), 4, 5);
  const uint64_t whole = TestNamespace().BlockBytes();
  ASSERT_TRUE(client.Put(kNs, keys[0], Block(keys[0], kBlockBytes, 1)).ok());
  ASSERT_TRUE(client.Put(kNs, keys[3], Block(keys[3], whole, 3)).ok());
  auto pinned = client.Pin(kNs, std::span<const BlockKey>(keys.data(), 1));
  ASSERT_TRUE(pinned[0].ok()) << pinned[0].status().ToString();
  BlockView old_view = std::move(*pinned[0]);
  auto dropped = client.Pin(kNs, std::span<const BlockKey>(keys.data(), 1));  // destroyed after the restart
  ASSERT_TRUE(dropped[0].ok());
  const uint64_t sizes[] = {kBlockBytes};
  auto reserved = client.Reserve(kNs, std::span<const BlockKey>(&keys[1], 1), sizes);
  ASSERT_TRUE(reserved.ok()) << reserved.status().ToString();
  Reservation old_reservation = std::move(*reserved);
  ASSERT_TRUE(old_reservation.blocks()[0].status.ok());
  auto loaded = client.BeginLoad(kNs, std::span<const BlockKey>(&keys[3], 1));
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  LayerLoad old_load = std::move(*loaded);
  ASSERT_TRUE(old_load.WaitAll().ok());

  daemon.Kill();
  daemon.Start();
  ASSERT_TRUE(daemon.running());
  ASSERT_TRUE(StatsEventually(client).ok());
  EXPECT_EQ(client.reconnects(), 1u);

  // The new daemon's own pin, before the old handles end: had an old lease
  // reached the new daemon, it could have ended this one.
  ASSERT_TRUE(client.Put(kNs, keys[2], Block(keys[2], kBlockBytes, 2)).ok());
  auto fresh = client.Pin(kNs, std::span<const BlockKey>(&keys[2], 1));
  ASSERT_TRUE(fresh[0].ok()) << fresh[0].status().ToString();
  const auto before = Counters(client);

  // The old view still reads its bytes: the old arena is still mapped.
  ASSERT_TRUE(old_view.valid());
  EXPECT_TRUE(CheckBlockBytes(keys[0], 1, old_view.data()));
  const Status released = old_view.Release();
  EXPECT_EQ(released.code(), StatusCode::kUnavailable) << released.ToString();
  dropped.clear();  // a deferred release: dropped with its connection

  // The old reservation: writable memory, but nothing gets committed.
  WritableBlock& slot = old_reservation.blocks()[0];
  FillBlockBytes(keys[1], 9, slot.data);
  const std::vector<Status> committed = old_reservation.Commit();
  ASSERT_EQ(committed.size(), 1u);
  EXPECT_EQ(committed[0].code(), StatusCode::kUnavailable) << committed[0].ToString();
  auto lookup = client.Lookup(kNs, std::span<const BlockKey>(&keys[1], 1));
  ASSERT_TRUE(lookup.ok()) << lookup.status().ToString();
  EXPECT_EQ(lookup->prefix_blocks, 0u) << "a reservation of the old daemon was committed into the new one";

  // The old load: its board and bytes are in the old mapping, still
  // readable; it ends with Unavailable.
  auto layer = old_load.TryLayerSpan(0, 0);
  ASSERT_TRUE(layer.ok()) << layer.status().ToString();
  EXPECT_EQ(layer->size(), old_load.layer_bytes());
  EXPECT_EQ(old_load.End().code(), StatusCode::kUnavailable);
  EXPECT_EQ(old_load.TryLayerSpan(0, 0).status().code(), StatusCode::kFailedPrecondition);

  // None of it reached the new daemon: no release, commit or load end came
  // in (the Stats request itself carries anything deferred).
  const auto after = Counters(client);
  for (const char* name : {"engine.releases", "engine.release_failures", "engine.commits", "engine.commit_failures",
                           "engine.leases", "engine.loads_open"}) {
    if (before.count(name) == 0) continue;
    EXPECT_EQ(after.at(name), before.at(name)) << name;
  }
  // The new daemon's pin is intact and ends normally.
  ASSERT_TRUE(fresh[0].ok());
  EXPECT_TRUE(CheckBlockBytes(keys[2], 2, fresh[0]->data()));
  EXPECT_TRUE(fresh[0]->Release().ok());
}

// The raw Release(lease) goes to the current connection: a lease number
// from the old daemon, handed to the new one, must end nothing there, even
// when the new daemon pinned the same block for this client (same shard,
// and with lease numbers counted from the same start, the same number).
TEST(Reconnect, ARawLeaseFromBeforeARestartEndsNothing) {
  RestartableKvtierd daemon;
  ASSERT_TRUE(daemon.running());
  auto connected = Client::Connect(ReconnectingOptions(daemon));
  ASSERT_TRUE(connected.ok()) << connected.status().ToString();
  Client& client = **connected;
  constexpr NamespaceId kNs = 1;
  const auto keys = TestKeys(TestNamespace(), 1, 8);
  ASSERT_TRUE(client.Put(kNs, keys[0], Block(keys[0], kBlockBytes, 1)).ok());
  auto old_pin = client.Pin(kNs, keys);
  ASSERT_TRUE(old_pin[0].ok()) << old_pin[0].status().ToString();
  const uint64_t old_lease = old_pin[0]->lease();

  daemon.Kill();
  daemon.Start();
  ASSERT_TRUE(daemon.running());
  ASSERT_TRUE(StatsEventually(client).ok());
  ASSERT_TRUE(client.Put(kNs, keys[0], Block(keys[0], kBlockBytes, 2)).ok());
  auto fresh = client.Pin(kNs, keys);
  ASSERT_TRUE(fresh[0].ok()) << fresh[0].status().ToString();
  EXPECT_NE(fresh[0]->lease(), old_lease) << "lease numbers must not repeat across daemon starts";
  EXPECT_EQ(client.Release(old_lease).code(), StatusCode::kNotFound);
  EXPECT_EQ(Counters(client).at("engine.leases"), 1) << "the old number ended the new daemon's pin";
  EXPECT_TRUE(CheckBlockBytes(keys[0], 2, fresh[0]->data()));
  EXPECT_TRUE(fresh[0]->Release().ok());
  old_pin.clear();  // its release went with the old connection
}

// With reconnect off the Client stays failed after the restart, as
// before: Unavailable at once, every time; a new Client works.
TEST(Reconnect, OffKeepsTheClientFailed) {
  RestartableKvtierd daemon;
  ASSERT_TRUE(daemon.running());
  ClientOptions options = ReconnectingOptions(daemon);
  options.reconnect = false;
  auto connected = Client::Connect(options);
  ASSERT_TRUE(connected.ok()) << connected.status().ToString();
  Client& client = **connected;
  const BlockKey key = TestKeys(TestNamespace(), 1, 9)[0];
  ASSERT_TRUE(client.Put(1, key, Block(key, kBlockBytes)).ok());
  daemon.Kill();
  daemon.Start();
  ASSERT_TRUE(daemon.running());
  for (int i = 0; i < 20; ++i) {  // well past any backoff
    EXPECT_EQ(client.Stats().status().code(), StatusCode::kUnavailable);
    std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_EQ(client.Put(1, key, Block(key, kBlockBytes)).code(), StatusCode::kUnavailable);
  EXPECT_EQ(client.reconnects(), 0u);
  auto fresh = Client::Connect(options);
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  EXPECT_TRUE((*fresh)->Put(1, key, Block(key, kBlockBytes)).ok());
}

}  // namespace
}  // namespace kvtier::testing

// The host tier outlives kvtierd (docs/OPERATIONS.md "Restarts"): the real
// binary under a descriptor store that does what systemd's does
// (support/fd_store.h): it stores its arena and journal at start, is
// killed with -9, and the next kvtierd adopts them: every block put before
// the kill is a host hit again, byte-exact. A start with another arena
// size starts empty and replaces the pair in the store; tenants' arenas
// are kept apart, and a tenant gone from the configuration has its pair
// dropped while the others' blocks survive.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sys/socket.h>

#include <algorithm>
#include <csignal>
#include <fstream>
#include <chrono>
#include <map>
#include <thread>

#include "daemon/server/systemd_notify.h"
#include "daemon/server/takeover.h"
#include "daemon/setup/host_keep.h"
#include "common/unix_socket.h"
#include "kvtier/client.h"
#include "support/fd_store.h"
#include "support/process.h"
#include "support/servers.h"
#include "tests/testing/test_daemon.h"

namespace kvtier::testing {
namespace {

constexpr uint64_t kBlockBytes = 64 * 1024;  // TestNamespace's blocks

BlockKey Key(uint64_t i) { return BlockKey{0x4e57a47, i}; }

std::map<std::string, int64_t> Counters(Client& client) {
  std::map<std::string, int64_t> out;
  auto stats = client.Stats();
  EXPECT_TRUE(stats.ok()) << stats.status().ToString();
  if (stats.ok()) {
    for (const Counter& c : *stats) out[c.name] = c.value;
  }
  return out;
}

std::unique_ptr<Client> Connect(const std::string& socket_path) {
  ClientOptions options;
  options.socket_path = socket_path;
  options.namespaces = {TestNamespace()};
  options.use_directory = false;  // Lookup reports the tier
  options.reconnect = false;
  auto client = Client::Connect(options);
  EXPECT_TRUE(client.ok()) << client.status().ToString();
  return client.ok() ? std::move(*client) : nullptr;
}

// Waits until the restart has checked every kept block.
void WaitAdopted(Client& client) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (Counters(client)["host.adopt.pending"] > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(Counters(client)["host.adopt.pending"], 0);
}

Tier TierOf(Client& client, const BlockKey& key) {
  auto found = client.Lookup(0, {&key, 1});
  if (!found.ok() || found->prefix_blocks != 1 || found->tiers.empty()) return Tier::kNone;
  return found->tiers[0];
}

bool HostHitWithItsBytes(Client& client, uint64_t i) {
  if (TierOf(client, Key(i)) != Tier::kHost) return false;
  std::vector<std::byte> got(kBlockBytes);
  auto n = client.Get(0, Key(i), got);
  return n.ok() && *n == kBlockBytes && CheckBlockBytes(Key(i), 0, got);
}

class HostRestartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    auto store = support::FdStore::Open(dir_ + "/notify.sock");
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(*store);
  }
  void TearDown() override {
    server_.reset();
    store_.reset();
    RemoveTree(dir_);
  }

  // Starts kvtierd under the store with a host arena of `arena_bytes` and `toml`.
  void Start(uint64_t arena_bytes, const std::string& toml = "") {
    server_.reset();
    auto server = support::StartKvtierd(KVTIERD_PATH, dir_, arena_bytes, std::chrono::seconds(60), toml, store_.get());
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::make_unique<support::StartedServer>(std::move(*server));
  }

  // The names of what the store holds for host tiers (kvtierd also keeps
  // its listening socket there, under kListenerName: takeover_test.cc).
  std::vector<std::string> Names() {
    EXPECT_TRUE(store_->Drain().ok());
    std::vector<std::string> names = store_->names();
    std::erase(names, std::string(kListenerName));
    std::sort(names.begin(), names.end());
    return names;
  }

  void Put(Client& client, uint64_t first, uint64_t count) {
    for (uint64_t i = first; i < first + count; ++i) {
      ASSERT_TRUE(client.Put(0, Key(i), Block(Key(i), kBlockBytes)).ok()) << i;
    }
  }

  std::string dir_;
  std::unique_ptr<support::FdStore> store_;
  std::unique_ptr<support::StartedServer> server_;
};

TEST_F(HostRestartTest, KillNineKeepsEveryPutBlockAsAHostHit) {
  Start(32 << 20);
  EXPECT_EQ(Names(), (std::vector<std::string>{"host-arena", "host-journal"}));
  {
    auto client = Connect(server_->socket_path);
    ASSERT_NE(client, nullptr);
    Put(*client, 0, 100);
    EXPECT_EQ(Counters(*client)["host.journal.records"], 100);
  }
  EXPECT_EQ(server_->process.Kill(), "killed by signal 9");
  Start(32 << 20);
  EXPECT_EQ(Names(), (std::vector<std::string>{"host-arena", "host-journal"}));  // the same pair, not a second
  auto client = Connect(server_->socket_path);
  ASSERT_NE(client, nullptr);
  WaitAdopted(*client);
  auto counters = Counters(*client);
  EXPECT_EQ(counters["host.adopt.blocks"], 100);
  EXPECT_EQ(counters["host.adopt.corrupt"], 0);
  for (uint64_t i = 0; i < 100; ++i) EXPECT_TRUE(HostHitWithItsBytes(*client, i)) << i;
  // It goes on: more puts, a clean stop (SIGTERM), a start: all of it again.
  Put(*client, 100, 20);
  client.reset();
  EXPECT_EQ(server_->process.Stop(), "exit status 0");
  Start(32 << 20);
  client = Connect(server_->socket_path);
  ASSERT_NE(client, nullptr);
  WaitAdopted(*client);
  EXPECT_EQ(Counters(*client)["host.adopt.blocks"], 120);
  for (uint64_t i = 0; i < 120; ++i) EXPECT_TRUE(HostHitWithItsBytes(*client, i)) << i;
}

TEST_F(HostRestartTest, AnotherArenaSizeStartsEmptyAndReplacesThePair) {
  Start(32 << 20);
  {
    auto client = Connect(server_->socket_path);
    ASSERT_NE(client, nullptr);
    Put(*client, 0, 10);
  }
  server_->process.Kill();
  Start(48 << 20);
  EXPECT_EQ(Names(), (std::vector<std::string>{"host-arena", "host-journal"}));
  auto client = Connect(server_->socket_path);
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(Counters(*client)["host.adopt.blocks"], 0);
  EXPECT_EQ(Counters(*client)["host.arena.capacity_bytes"], 48 << 20);
  for (uint64_t i = 0; i < 10; ++i) EXPECT_EQ(TierOf(*client, Key(i)), Tier::kNone) << i;
  EXPECT_NE(support::FileTail(server_->log_path).find("starting empty"), std::string::npos)
      << support::FileTail(server_->log_path);
}

// host.keep_across_restarts = false: what the store passed is closed and
// removed from it (its memory freed), and nothing new is stored.
TEST_F(HostRestartTest, KeepingOffDropsWhatTheStoreHeldAndStoresNothing) {
  Start(32 << 20);
  server_->process.Kill();
  ASSERT_EQ(Names().size(), 2u);
  std::vector<PassedFd> passed;
  for (size_t i = 0; i < store_->size(); ++i) {
    if (store_->names()[i] != kListenerName) passed.push_back({::dup(store_->fds()[i]), store_->names()[i]});
  }
  const SystemdNotifier notifier(store_->socket_path(), 0);
  {
    HostKeeper keeper(notifier, std::move(passed), /*enabled=*/false);
    EXPECT_FALSE(keeper.enabled());
    EXPECT_FALSE(keeper.KeptFor("").journal);
  }
  EXPECT_TRUE(Names().empty());
}

// Enabled, a tier that started empty replaces the pair under its names,
// and one that adopted stores nothing new.
TEST_F(HostRestartTest, AKeeperReplacesAStalePairAndLeavesAnAdoptedOne) {
  const SystemdNotifier notifier(store_->socket_path(), 0);
  HostArenaOptions arena;
  arena.capacity_bytes = 1 << 20;
  arena.lock = HostArenaOptions::LockMode::kOff;
  {
    HostKeeper keeper(notifier, {}, /*enabled=*/true);
    auto host = HostTier::Open(arena, 0, keeper.KeptFor(""));
    ASSERT_TRUE(host.ok());
    keeper.Store("", **host);
  }
  ASSERT_EQ(Names(), (std::vector<std::string>{"host-arena", "host-journal"}));
  auto pass = [this] {
    std::vector<PassedFd> passed;
    for (size_t i = 0; i < store_->size(); ++i) passed.push_back({::dup(store_->fds()[i]), store_->names()[i]});
    return passed;
  };
  auto inodes = [this] {
    std::vector<ino_t> out;
    for (int fd : store_->fds()) {
      struct stat st {};
      EXPECT_EQ(::fstat(fd, &st), 0);
      out.push_back(st.st_ino);
    }
    return out;
  };
  const std::vector<ino_t> first = inodes();
  {
    HostKeeper keeper(notifier, pass(), /*enabled=*/true);
    auto host = HostTier::Open(arena, 0, keeper.KeptFor(""));
    ASSERT_TRUE(host.ok());
    EXPECT_TRUE((*host)->adopted());
    keeper.Store("", **host);
  }
  EXPECT_TRUE(store_->Drain().ok());
  EXPECT_EQ(inodes(), first);  // untouched
  arena.capacity_bytes = 2 << 20;
  {
    HostKeeper keeper(notifier, pass(), /*enabled=*/true);
    auto host = HostTier::Open(arena, 0, keeper.KeptFor(""));
    ASSERT_TRUE(host.ok());
    EXPECT_FALSE((*host)->adopted());
    keeper.Store("", **host);
  }
  EXPECT_EQ(Names(), (std::vector<std::string>{"host-arena", "host-journal"}));
  const std::vector<ino_t> second = inodes();
  EXPECT_NE(second[0], first[0]);  // a new pair
  EXPECT_NE(second[1], first[1]);
}

// Auto sizing counts the kept arenas the configuration claims as memory
// the start takes back, by name.
TEST(HostKeeperSizes, TheKeptArenasOfTheNamedTenantsAreCounted) {
  std::vector<PassedFd> passed;
  auto add = [&passed](const std::string& name, off_t bytes) {
    const int fd = ::memfd_create(name.c_str(), MFD_CLOEXEC);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, bytes), 0);
    passed.push_back({fd, name});
  };
  add("host-arena", 3 << 20);
  add("host-journal", 1 << 20);
  add("host-arena.alpha", 5 << 20);
  add("host-journal.alpha", 1 << 20);
  add("host-arenas", 7 << 20);  // not an arena's name
  EXPECT_EQ(HostKeeper::KeptArenaBytes(passed, {""}), uint64_t{3} << 20);
  EXPECT_EQ(HostKeeper::KeptArenaBytes(passed, {"alpha"}), uint64_t{5} << 20);
  EXPECT_EQ(HostKeeper::KeptArenaBytes(passed, {"alpha", "beta"}), uint64_t{5} << 20) << "beta kept nothing";
  EXPECT_EQ(HostKeeper::KeptArenaBytes(passed, {"", "alpha"}), uint64_t{8} << 20);
  for (const PassedFd& p : passed) ::close(p.fd);
}

TEST_F(HostRestartTest, TenantsArenasAreKeptApartAndAGoneTenantsPairIsDropped) {
  const std::string me = std::to_string(::geteuid());
  const std::string alpha = "[[tenant]]\nname = \"alpha\"\nuids = [" + me + "]\nhost_bytes = \"16MiB\"\n";
  const std::string beta = "[[tenant]]\nname = \"beta\"\nuids = [4242424]\nhost_bytes = \"16MiB\"\n";
  Start(32 << 20, alpha + beta);
  EXPECT_EQ(Names(), (std::vector<std::string>{"host-arena.alpha", "host-arena.beta", "host-journal.alpha",
                                               "host-journal.beta"}));
  {
    auto client = Connect(server_->socket_path);
    ASSERT_NE(client, nullptr);
    Put(*client, 0, 30);
  }
  server_->process.Kill();
  Start(32 << 20, alpha);  // beta is gone from the configuration
  EXPECT_EQ(Names(), (std::vector<std::string>{"host-arena.alpha", "host-journal.alpha"}));
  auto client = Connect(server_->socket_path);
  ASSERT_NE(client, nullptr);
  WaitAdopted(*client);
  for (uint64_t i = 0; i < 30; ++i) EXPECT_TRUE(HostHitWithItsBytes(*client, i)) << i;
}

// The pid of the process listening at `socket_path` (SO_PEERCRED); -1 if none.
pid_t ListenerPid(const std::string& socket_path) {
  auto fd = ConnectUnix(socket_path);
  if (!fd.ok()) return -1;
  ucred peer{};
  socklen_t length = sizeof(peer);
  const int got = ::getsockopt(*fd, SOL_SOCKET, SO_PEERCRED, &peer, &length);
  ::close(*fd);
  return got == 0 ? peer.pid : -1;
}

// Waits until a kvtierd other than `old_pid` listens at `socket_path`.
pid_t WaitForNewListener(const std::string& socket_path, pid_t old_pid) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    const pid_t pid = ListenerPid(socket_path);
    if (pid > 0 && pid != old_pid) return pid;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

// `kvtier supervise`, where there is no systemd: its kvtierd is killed with
// -9 twice and started again by it with the kept arena each time, every
// block a host hit; SIGTERM to supervise stops kvtierd and supervise with 0.
TEST(Supervise, RestartsAKilledKvtierdWithItsHostTier) {
  const std::string dir = MakeTempDir();
  const std::string socket_path = dir + "/kvtierd.sock";
  const std::string config = dir + "/kvtierd.toml";
  std::ofstream(config) << "[server]\nsocket_path = \"" << socket_path
                        << "\"\n[host]\ncapacity_bytes = \"32MiB\"\nlock_memory = \"off\"\n[metrics]\nport = 0\n";
  auto supervise = support::ChildProcess::Spawn(
      {KVTIER_TOOL_PATH, "supervise", "--restart-delay-ms", "50", "--", KVTIERD_PATH, "--config", config},
      dir + "/supervise.log");
  ASSERT_TRUE(supervise.ok()) << supervise.status().ToString();
  pid_t kvtierd = WaitForNewListener(socket_path, -1);
  ASSERT_GT(kvtierd, 0) << support::FileTail(dir + "/supervise.log");
  {
    auto client = Connect(socket_path);
    ASSERT_NE(client, nullptr);
    for (uint64_t i = 0; i < 40; ++i) ASSERT_TRUE(client->Put(0, Key(i), Block(Key(i), kBlockBytes)).ok());
  }
  for (int kill = 0; kill < 2; ++kill) {
    ASSERT_EQ(::kill(kvtierd, SIGKILL), 0);
    const pid_t next = WaitForNewListener(socket_path, kvtierd);
    ASSERT_GT(next, 0) << support::FileTail(dir + "/supervise.log");
    kvtierd = next;
    auto client = Connect(socket_path);
    ASSERT_NE(client, nullptr);
    WaitAdopted(*client);
    EXPECT_EQ(Counters(*client)["host.adopt.blocks"], 40);
    for (uint64_t i = 0; i < 40; ++i) EXPECT_TRUE(HostHitWithItsBytes(*client, i)) << i;
  }
  std::string how;
  EXPECT_EQ(supervise->Stop(), "exit status 0") << support::FileTail(dir + "/supervise.log");
  EXPECT_NE(::kill(kvtierd, 0), 0);  // kvtierd went with it
  RemoveTree(dir);
}

}  // namespace
}  // namespace kvtier::testing

// Server::Start with a passed listening socket (ServerOptions::listen_fd,
// what a takeover or systemd's fd store hands over): it serves on it,
// connections queued meanwhile included, and leaves the socket file to
// whoever else serves it (KeepSocketFile). A passed fd that is not a
// listening socket at socket_path, or whose socket file is gone (systemd
// removed the runtime directory), is closed and a fresh socket bound.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "common/unix_socket.h"
#include "daemon/engine/engine.h"
#include "daemon/server/server.h"
#include "tests/testing/test_daemon.h"
#include "tiers/host/host_directory.h"
#include "tiers/host/host_tier.h"

namespace kvtier::testing {
namespace {

using namespace std::chrono_literals;

bool SocketFileExists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode);
}

ino_t InodeOf(int fd) {
  struct stat st {};
  return ::fstat(fd, &st) == 0 ? st.st_ino : 0;
}

// True while `fd` is still the file of `inode` (a closed fd number may be
// reused at once, by the freshly bound socket).
bool StillOpen(int fd, ino_t inode) { return InodeOf(fd) == inode; }

class ServerListenerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    socket_ = dir_ + "/kvtierd.sock";
    const uint64_t arena_bytes = 16ull << 20;
    host_ = OpenTestHostTier(arena_bytes, HostDirectory::DefaultSlots(arena_bytes));
    ASSERT_NE(host_, nullptr);
    auto engine = Engine::Create(EngineOptions{4, EvictionPolicyId::kLru}, *host_, clock_);
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    engine_ = std::move(*engine);
  }
  void TearDown() override {
    engine_.reset();
    host_.reset();
    RemoveTree(dir_);
  }

  std::unique_ptr<Server> Start(int listen_fd = -1) {
    ServerOptions options{socket_};
    options.listen_fd = listen_fd;
    auto server = Server::Start(options, *engine_, *host_);
    EXPECT_TRUE(server.ok()) << server.status().ToString();
    return server.ok() ? std::move(*server) : nullptr;
  }

  bool Serves() {
    ClientOptions options;
    options.socket_path = socket_;
    options.namespaces = {TestNamespace()};
    return Client::Connect(options).ok();
  }

  std::string dir_, socket_;
  SystemClock clock_;
  std::unique_ptr<HostTier> host_;
  std::unique_ptr<Engine> engine_;
};

TEST_F(ServerListenerTest, APassedListenerServesWhatQueuedMeanwhileAndItsFileStays) {
  auto first = Start();
  ASSERT_NE(first, nullptr);
  const int kept = first->DupListener();
  ASSERT_GE(kept, 0);
  first->KeepSocketFile(true);
  first->Shutdown();
  first->Wait();
  first.reset();
  EXPECT_TRUE(SocketFileExists(socket_));
  // Nobody accepts now; a client connecting waits in the socket's queue.
  std::unique_ptr<Client> early;
  std::thread connecting([&] {
    ClientOptions options;
    options.socket_path = socket_;
    options.namespaces = {TestNamespace()};
    options.connect_timeout = 30s;
    auto client = Client::Connect(options);
    EXPECT_TRUE(client.ok()) << client.status().ToString();
    if (client.ok()) early = std::move(*client);
  });
  std::this_thread::sleep_for(100ms);
  auto second = Start(kept);
  ASSERT_NE(second, nullptr);
  connecting.join();
  ASSERT_NE(early, nullptr);
  const BlockKey key{7, 1};
  EXPECT_TRUE(early->Put(0, key, Block(key, 64 * 1024)).ok());
  early.reset();
  // A passed socket's file is left at the end (another process may serve
  // it still) until the server is told the socket is its own.
  second->Shutdown();
  second->Wait();
  EXPECT_TRUE(SocketFileExists(socket_));
}

TEST_F(ServerListenerTest, OnceToldTheSocketIsItsOwnAPassedListenerRemovesItsFile) {
  auto first = Start();
  ASSERT_NE(first, nullptr);
  const int kept = first->DupListener();
  first->KeepSocketFile(true);
  first.reset();
  auto second = Start(kept);
  ASSERT_NE(second, nullptr);
  EXPECT_TRUE(Serves());
  second->KeepSocketFile(false);
  second.reset();
  EXPECT_FALSE(SocketFileExists(socket_));
}

TEST_F(ServerListenerTest, AListenerWhoseSocketFileIsGoneIsClosedAndAFreshOneBound) {
  auto first = Start();
  ASSERT_NE(first, nullptr);
  const int kept = first->DupListener();
  const ino_t inode = InodeOf(kept);
  first.reset();  // a bound server removes its file
  ASSERT_FALSE(SocketFileExists(socket_));
  auto second = Start(kept);
  ASSERT_NE(second, nullptr);
  EXPECT_FALSE(StillOpen(kept, inode));
  EXPECT_TRUE(Serves());
}

TEST_F(ServerListenerTest, AFdThatIsNoListeningSocketIsClosedAndAFreshOneBound) {
  const int memfd = ::memfd_create("not-a-socket", MFD_CLOEXEC);
  ASSERT_GE(memfd, 0);
  const ino_t inode = InodeOf(memfd);
  auto server = Start(memfd);
  ASSERT_NE(server, nullptr);
  EXPECT_FALSE(StillOpen(memfd, inode));
  EXPECT_TRUE(Serves());
}

TEST_F(ServerListenerTest, AListenerAtAnotherPathIsClosedAndAFreshOneBound) {
  const std::string elsewhere = socket_;
  socket_ = dir_ + "/other.sock";
  auto first = Start();
  ASSERT_NE(first, nullptr);
  const int kept = first->DupListener();
  const ino_t inode = InodeOf(kept);
  first->KeepSocketFile(true);
  first.reset();
  socket_ = elsewhere;
  auto second = Start(kept);
  ASSERT_NE(second, nullptr);
  EXPECT_FALSE(StillOpen(kept, inode));
  EXPECT_TRUE(Serves());
}

}  // namespace
}  // namespace kvtier::testing

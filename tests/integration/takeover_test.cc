// kvtierd --takeover (docs/OPERATIONS.md "Takeover"): a new kvtierd takes
// the listening socket and the host tier from the one running, which
// drains, hands them over and exits once the new one serves. Under load no
// request fails beyond the documented retry (Unavailable on the connection
// the old daemon closed, then a reconnect), and every block acknowledged
// before, during and after is a host hit after, byte-exact. A new daemon
// that fails to start leaves the old one serving again on what it handed
// over; a daemon under a service manager refuses, and keeps its socket in
// the manager's fd store instead, so a restart refuses no connection.
// The protocol's own cases (daemon/server/takeover.h) run in-process.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "common/unix_socket.h"
#include "daemon/server/takeover.h"
#include "kvtier/client.h"
#include "support/fd_store.h"
#include "support/process.h"
#include "support/servers.h"
#include "tests/testing/test_daemon.h"

namespace kvtier::testing {
namespace {

using namespace std::chrono_literals;

constexpr uint64_t kBlockBytes = 64 * 1024;  // TestNamespace's blocks

BlockKey Key(uint64_t i) { return BlockKey{0x7a4e0, i}; }

std::unique_ptr<Client> Connect(const std::string& socket_path, bool reconnect = false) {
  ClientOptions options;
  options.socket_path = socket_path;
  options.namespaces = {TestNamespace()};
  options.use_directory = false;  // Lookup reports the tier
  options.reconnect = reconnect;
  options.reconnect_min_backoff = 5ms;
  options.reconnect_max_backoff = 100ms;
  auto client = Client::Connect(options);
  EXPECT_TRUE(client.ok()) << client.status().ToString();
  return client.ok() ? std::move(*client) : nullptr;
}

std::map<std::string, int64_t> Counters(Client& client) {
  std::map<std::string, int64_t> out;
  auto stats = client.Stats();
  EXPECT_TRUE(stats.ok()) << stats.status().ToString();
  if (stats.ok()) {
    for (const Counter& c : *stats) out[c.name] = c.value;
  }
  return out;
}

// Waits until the new daemon checked every kept block. `label`: a
// tenant's counters' ("{tenant=\"alpha\"}"); empty without tenants.
void WaitAdopted(Client& client, const std::string& label = "") {
  const std::string pending = "host.adopt.pending" + label;
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  std::map<std::string, int64_t> counters = Counters(client);
  ASSERT_TRUE(counters.contains(pending)) << pending;
  while (counters[pending] > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
    counters = Counters(client);
  }
  EXPECT_EQ(counters[pending], 0);
}

bool HostHitWithItsBytes(Client& client, uint64_t i) {
  const BlockKey key = Key(i);
  auto found = client.Lookup(0, {&key, 1});
  if (!found.ok() || found->prefix_blocks != 1 || found->tiers.empty() || found->tiers[0] != Tier::kHost) return false;
  std::vector<std::byte> got(kBlockBytes);
  auto n = client.Get(0, key, got);
  return n.ok() && *n == kBlockBytes && CheckBlockBytes(key, 0, got);
}

// Waits up to `timeout` for `process` to end; how it ended, or "" if it runs on.
std::string WaitExit(support::ChildProcess& process, std::chrono::milliseconds timeout = 30s) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string how;
  while (!process.Exited(&how) && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(10ms);
  return how;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Waits until `path` contains `text`.
bool WaitForText(const std::string& path, const std::string& text, std::chrono::milliseconds timeout = 30s) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (ReadFile(path).find(text) == std::string::npos) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

// One client putting and reading back blocks of its own while the daemon
// changes under it: every answer must be right, a miss (of a block still
// being adopted) or Unavailable (the connection the old daemon closed,
// retried by the reconnect).
class Loader {
 public:
  Loader(const std::string& socket_path, uint64_t first_key) : first_(first_key) {
    client_ = Connect(socket_path, /*reconnect=*/true);
  }
  void Start() {
    thread_ = std::thread([this] { Run(); });
  }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  bool connected() const { return client_ != nullptr; }
  const std::vector<std::string>& failures() const { return failures_; }
  const std::set<uint64_t>& acknowledged() const { return acknowledged_; }
  uint64_t unavailable() const { return unavailable_; }
  uint64_t ok_ops() const { return ok_ops_.load(); }

 private:
  static constexpr uint64_t kKeys = 60;  // with three loaders and 100 seeded: all fit a 32 MiB arena

  void Run() {
    for (uint64_t n = 0; !stop_; ++n) {
      const uint64_t i = first_ + n % kKeys;
      Status put = client_->Put(0, Key(i), Block(Key(i), kBlockBytes));
      if (put.ok() || put.code() == StatusCode::kAlreadyExists) {
        if (put.ok()) acknowledged_.insert(i);
        ok_ops_.fetch_add(1);
      } else if (put.code() == StatusCode::kUnavailable) {
        ++unavailable_;
      } else {
        failures_.push_back("put " + std::to_string(i) + ": " + put.ToString());
      }
      if (acknowledged_.empty()) continue;
      const uint64_t back = *std::next(acknowledged_.begin(), static_cast<long>(n % acknowledged_.size()));
      std::vector<std::byte> got(kBlockBytes);
      auto read = client_->Get(0, Key(back), got);
      if (read.ok()) {
        if (*read != kBlockBytes || !CheckBlockBytes(Key(back), 0, got)) {
          failures_.push_back("get " + std::to_string(back) + ": wrong bytes");
        }
        ok_ops_.fetch_add(1);
      } else if (read.status().code() == StatusCode::kUnavailable) {
        ++unavailable_;
      } else if (read.status().code() != StatusCode::kNotFound) {
        failures_.push_back("get " + std::to_string(back) + ": " + read.status().ToString());
      }
    }
  }

  const uint64_t first_;
  std::unique_ptr<Client> client_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> ok_ops_{0};
  // Only the loader's thread until Stop.
  std::vector<std::string> failures_;
  std::set<uint64_t> acknowledged_;
  uint64_t unavailable_ = 0;
};

class TakeoverTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = MakeTempDir(); }
  void TearDown() override {
    successor_.reset();
    server_.reset();
    RemoveTree(dir_);
  }

  void Start(uint64_t arena_bytes, const std::string& toml = "", support::FdStore* store = nullptr) {
    auto server = support::StartKvtierd(KVTIERD_PATH, dir_, arena_bytes, 60s, toml, store);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::make_unique<support::StartedServer>(std::move(*server));
  }

  // Starts `kvtierd --config <config> --takeover`, logging to `log`.
  void StartSuccessor(const std::string& config, const std::string& log) {
    auto child = support::ChildProcess::Spawn({KVTIERD_PATH, "--config", config, "--takeover"}, dir_ + "/" + log);
    ASSERT_TRUE(child.ok()) << child.status().ToString();
    successor_ = std::make_unique<support::ChildProcess>(std::move(*child));
  }

  std::string config() const { return dir_ + "/kvtierd.toml"; }

  void Put(Client& client, uint64_t first, uint64_t count) {
    for (uint64_t i = first; i < first + count; ++i) {
      ASSERT_TRUE(client.Put(0, Key(i), Block(Key(i), kBlockBytes)).ok()) << i;
    }
  }

  std::string dir_;
  std::unique_ptr<support::StartedServer> server_;
  std::unique_ptr<support::ChildProcess> successor_;
};

TEST_F(TakeoverTest, UnderLoadEveryAcknowledgedBlockStaysAHostHitAndNoRequestFailsBeyondARetry) {
  Start(32 << 20);
  {
    auto client = Connect(server_->socket_path);
    ASSERT_NE(client, nullptr);
    Put(*client, 0, 100);
  }
  std::vector<std::unique_ptr<Loader>> loaders;
  for (uint64_t t = 0; t < 3; ++t) {
    loaders.push_back(std::make_unique<Loader>(server_->socket_path, 1000 + 1000 * t));
    ASSERT_TRUE(loaders.back()->connected());
    loaders.back()->Start();
  }
  std::this_thread::sleep_for(300ms);
  StartSuccessor(config(), "successor.log");
  EXPECT_EQ(WaitExit(server_->process), "exit status 0") << support::FileTail(server_->log_path);
  std::vector<uint64_t> ops_at_exit;
  for (auto& l : loaders) ops_at_exit.push_back(l->ok_ops());
  // Load on the new daemon until every loader got answers from it.
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  for (size_t t = 0; t < loaders.size(); ++t) {
    while (loaders[t]->ok_ops() < ops_at_exit[t] + 50 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(10ms);
    }
  }
  for (auto& l : loaders) l->Stop();
  uint64_t retried = 0;
  for (size_t t = 0; t < loaders.size(); ++t) {
    EXPECT_GE(loaders[t]->ok_ops(), ops_at_exit[t] + 50) << "loader " << t << " got no answers after the takeover";
    EXPECT_TRUE(loaders[t]->failures().empty()) << loaders[t]->failures().front();
    retried += loaders[t]->unavailable();
  }
  std::cout << "requests answered Unavailable (retried) across the takeover: " << retried << "\n";
  ASSERT_TRUE(successor_->running()) << support::FileTail(dir_ + "/successor.log");
  auto client = Connect(server_->socket_path);
  ASSERT_NE(client, nullptr);
  WaitAdopted(*client);
  for (uint64_t i = 0; i < 100; ++i) EXPECT_TRUE(HostHitWithItsBytes(*client, i)) << i;
  for (auto& l : loaders) {
    for (uint64_t i : l->acknowledged()) EXPECT_TRUE(HostHitWithItsBytes(*client, i)) << i;
  }
  EXPECT_EQ(Counters(*client)["host.adopt.corrupt"], 0);
  // The new daemon takes the next takeover in turn.
  auto predecessor = std::move(successor_);
  StartSuccessor(config(), "successor2.log");
  EXPECT_EQ(WaitExit(*predecessor), "exit status 0") << support::FileTail(dir_ + "/successor.log");
  client = Connect(server_->socket_path);
  ASSERT_NE(client, nullptr);
  WaitAdopted(*client);
  for (uint64_t i = 0; i < 100; ++i) EXPECT_TRUE(HostHitWithItsBytes(*client, i)) << i;
}

TEST_F(TakeoverTest, ASuccessorThatFailsToStartLeavesTheOldDaemonServingItsBlocks) {
  Start(32 << 20);
  {
    auto client = Connect(server_->socket_path);
    ASSERT_NE(client, nullptr);
    Put(*client, 0, 40);
  }
  // The successor's metrics port is taken: it fails after it got the socket
  // and the arena (its engines open before its metrics endpoint).
  const int busy = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  ASSERT_EQ(::bind(busy, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(::listen(busy, 1), 0);
  ASSERT_EQ(::getsockname(busy, reinterpret_cast<sockaddr*>(&address), &length), 0);
  std::string text = ReadFile(config());
  const std::string metrics = "[metrics]\nport = 0\n";
  ASSERT_NE(text.find(metrics), std::string::npos);
  text.replace(text.find(metrics), metrics.size(),
               "[metrics]\naddress = \"127.0.0.1\"\nport = " + std::to_string(ntohs(address.sin_port)) + "\n");
  const std::string failing = dir_ + "/failing.toml";
  std::ofstream(failing) << text;
  StartSuccessor(failing, "failing.log");
  EXPECT_EQ(WaitExit(*successor_), "exit status 1") << support::FileTail(dir_ + "/failing.log");
  ::close(busy);
  EXPECT_NE(ReadFile(dir_ + "/failing.log").find("metrics"), std::string::npos) << ReadFile(dir_ + "/failing.log");
  // The old daemon serves again, on the same socket, with its blocks.
  EXPECT_TRUE(WaitForText(server_->log_path, "takeover failed")) << support::FileTail(server_->log_path);
  EXPECT_TRUE(server_->process.running());
  auto client = Connect(server_->socket_path);
  ASSERT_NE(client, nullptr);
  WaitAdopted(*client);
  for (uint64_t i = 0; i < 40; ++i) EXPECT_TRUE(HostHitWithItsBytes(*client, i)) << i;
  client.reset();
  // And hands over to a successor that starts.
  StartSuccessor(config(), "successor.log");
  EXPECT_EQ(WaitExit(server_->process), "exit status 0") << support::FileTail(server_->log_path);
  client = Connect(server_->socket_path);
  ASSERT_NE(client, nullptr);
  WaitAdopted(*client);
  for (uint64_t i = 0; i < 40; ++i) EXPECT_TRUE(HostHitWithItsBytes(*client, i)) << i;
}

TEST_F(TakeoverTest, TenantsArenasEachComeAcross) {
  const std::string me = std::to_string(::geteuid());
  Start(32 << 20, "[[tenant]]\nname = \"alpha\"\nuids = [" + me + "]\nhost_bytes = \"16MiB\"\n" +
                      "[[tenant]]\nname = \"beta\"\nuids = [4242424]\nhost_bytes = \"16MiB\"\n");
  {
    auto client = Connect(server_->socket_path);
    ASSERT_NE(client, nullptr);
    Put(*client, 0, 30);
  }
  StartSuccessor(config(), "successor.log");
  EXPECT_EQ(WaitExit(server_->process), "exit status 0") << support::FileTail(server_->log_path);
  auto client = Connect(server_->socket_path);
  ASSERT_NE(client, nullptr);
  const std::string alpha = "{tenant=\"alpha\"}";
  WaitAdopted(*client, alpha);
  for (uint64_t i = 0; i < 30; ++i) EXPECT_TRUE(HostHitWithItsBytes(*client, i)) << i;
  EXPECT_EQ(Counters(*client)["host.adopt.blocks" + alpha], 30);
  // Beta's arena came across too, as its own (adopted, not allocated anew).
  const std::string log = ReadFile(dir_ + "/successor.log");
  EXPECT_EQ(log.find("starting empty"), std::string::npos) << log;
}

TEST_F(TakeoverTest, UnderAServiceManagerItIsRefusedAndARestartRefusesNoConnection) {
  auto store = support::FdStore::Open(dir_ + "/notify.sock");
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  Start(32 << 20, "", store->get());
  std::vector<std::string> names = (*store)->names();
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"host-arena", "host-journal", std::string(kListenerName)}));
  StartSuccessor(config(), "successor.log");
  EXPECT_EQ(WaitExit(*successor_), "exit status 1");
  EXPECT_NE(ReadFile(dir_ + "/successor.log").find("takeover refused: kvtierd runs under a service manager"),
            std::string::npos)
      << ReadFile(dir_ + "/successor.log");
  ASSERT_TRUE(server_->process.running());
  {
    auto client = Connect(server_->socket_path);
    ASSERT_NE(client, nullptr);
    Put(*client, 0, 20);
  }
  // A crash: the store keeps the socket, so a client connecting meanwhile
  // waits in its queue and is served by the next daemon.
  server_->process.Kill();
  std::unique_ptr<Client> early;
  std::thread connecting([&] {
    ClientOptions options;
    options.socket_path = server_->socket_path;
    options.namespaces = {TestNamespace()};
    options.use_directory = false;
    options.connect_timeout = 60s;
    auto client = Client::Connect(options);
    EXPECT_TRUE(client.ok()) << client.status().ToString();
    if (client.ok()) early = std::move(*client);
  });
  std::this_thread::sleep_for(200ms);  // it is queued before the next daemon starts
  Start(32 << 20, "", store->get());
  connecting.join();
  ASSERT_NE(early, nullptr);
  WaitAdopted(*early);
  for (uint64_t i = 0; i < 20; ++i) EXPECT_TRUE(HostHitWithItsBytes(*early, i)) << i;
}

// The protocol in-process: a listener, a request from a thread.

int MemfdOfSize(size_t bytes) {
  const int fd = ::memfd_create("takeover-test", MFD_CLOEXEC);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(::ftruncate(fd, static_cast<off_t>(bytes)), 0);
  return fd;
}

off_t SizeOf(int fd) {
  struct stat st {};
  EXPECT_EQ(::fstat(fd, &st), 0);
  return st.st_size;
}

class TakeoverProtocolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    socket_ = dir_ + "/k.sock";
  }
  void TearDown() override { RemoveTree(dir_); }

  void Listen(std::string refusal = "") {
    auto listener = TakeoverListener::Start(socket_, std::move(refusal), [this] { requests_.fetch_add(1); });
    ASSERT_TRUE(listener.ok()) << listener.status().ToString();
    listener_ = std::move(*listener);
  }

  // Waits until the listener kept a request; its connection.
  int WaitRequest() {
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (requests_.load() == 0 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
    return listener_->TakeRequest();
  }

  std::string dir_, socket_;
  std::atomic<int> requests_{0};
  std::unique_ptr<TakeoverListener> listener_;
};

TEST_F(TakeoverProtocolTest, HandsEachFdOverWithItsNameThenTheOldSideSeesServing) {
  Listen();
  struct stat st {};
  EXPECT_EQ(::stat(TakeoverPath(socket_).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  std::optional<Result<TakeoverRequest>> asked;
  std::thread asking([&] { asked.emplace(TakeoverRequest::Ask(socket_, 10s)); });
  const int connection = WaitRequest();
  ASSERT_GE(connection, 0);
  const int a = MemfdOfSize(4096), b = MemfdOfSize(8192);
  std::vector<PassedFd> handed{{a, "host-arena"}, {b, "host-journal.alpha"}};
  ASSERT_TRUE(HandOver(connection, handed).ok());
  asking.join();
  ASSERT_TRUE(asked->ok()) << asked->status().ToString();
  std::vector<PassedFd> fds = (*asked)->TakeFds();
  ASSERT_EQ(fds.size(), 2u);
  EXPECT_EQ(fds[0].name, "host-arena");
  EXPECT_EQ(fds[1].name, "host-journal.alpha");
  EXPECT_EQ(SizeOf(fds[0].fd), 4096);  // the same files
  EXPECT_EQ(SizeOf(fds[1].fd), 8192);
  // The new side will not adopt the journal: the old side closes its copy.
  std::thread serving([&] {
    EXPECT_TRUE((*asked)->Release("host-journal.alpha").ok());
    EXPECT_TRUE((*asked)->Serving().ok());
  });
  std::vector<std::string> told;  // the caller lets go of its own mapping first
  EXPECT_EQ(AwaitServing(connection, handed, 10s,
                         [&](const std::string& name) {
                           told.push_back(name);
                           EXPECT_NE(::fcntl(b, F_GETFD), -1) << "told before the handed copy closes";
                         }),
            TakeoverOutcome::kServing);
  serving.join();
  EXPECT_EQ(told, std::vector<std::string>{"host-journal.alpha"});
  ASSERT_EQ(handed.size(), 1u);
  EXPECT_EQ(handed[0].name, "host-arena");
  EXPECT_EQ(::fcntl(b, F_GETFD), -1);  // closed by the release
  for (int fd : {a, fds[0].fd, fds[1].fd, connection}) ::close(fd);
}

TEST_F(TakeoverProtocolTest, ASecondRequestIsRefusedWhileOneIsKept) {
  Listen();
  std::thread first([&] { EXPECT_TRUE(TakeoverRequest::Ask(socket_, 10s).ok()); });
  const int connection = WaitRequest();
  ASSERT_GE(connection, 0);
  auto second = TakeoverRequest::Ask(socket_, 10s);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find("already in progress"), std::string::npos) << second.status().ToString();
  ASSERT_TRUE(HandOver(connection, {}).ok());
  first.join();  // it got its "end" and went away without Serving: the old side resumes
  std::vector<PassedFd> none;
  EXPECT_EQ(AwaitServing(connection, none, 10s), TakeoverOutcome::kFailed);
  ::close(connection);
}

TEST_F(TakeoverProtocolTest, ARefusalIsTheCallersErrorAndNothingIsKept) {
  Listen("kvtierd runs under a service manager");
  auto asked = TakeoverRequest::Ask(socket_, 10s);
  ASSERT_FALSE(asked.ok());
  EXPECT_EQ(asked.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(asked.status().message().find("service manager"), std::string::npos);
  EXPECT_EQ(listener_->TakeRequest(), -1);
}

TEST_F(TakeoverProtocolTest, ACallerThatSaysSomethingElseIsClosedAndTheListenerServesOn) {
  Listen();
  const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const std::string path = TakeoverPath(socket_);
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(::send(fd, "GET / HTTP/1.0", 14, MSG_NOSIGNAL), 14);
  char byte = 0;
  EXPECT_EQ(::recv(fd, &byte, 1, 0), 0);  // closed without an answer
  ::close(fd);
  EXPECT_EQ(listener_->TakeRequest(), -1);
  std::thread asking([&] { EXPECT_TRUE(TakeoverRequest::Ask(socket_, 10s).ok()); });
  const int connection = WaitRequest();
  ASSERT_GE(connection, 0);
  ASSERT_TRUE(HandOver(connection, {}).ok());
  asking.join();
  ::close(connection);
}

TEST_F(TakeoverProtocolTest, NoDaemonIsUnavailableAndClosingRemovesThePath) {
  auto asked = TakeoverRequest::Ask(socket_, 1s);
  EXPECT_EQ(asked.status().code(), StatusCode::kUnavailable);
  Listen();
  listener_->Close();
  struct stat st {};
  EXPECT_NE(::stat(TakeoverPath(socket_).c_str(), &st), 0);
  EXPECT_EQ(TakeoverRequest::Ask(socket_, 1s).status().code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace kvtier::testing

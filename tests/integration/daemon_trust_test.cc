// The client knows its daemon (issue: a tenant that created the socket's
// directory first swapped in its own listener and received another
// tenant's KV bytes while that tenant's puts and gets said OK): Connect
// checks the listening peer's uid before it sends a byte, and kvtierd will
// not start in a directory others may write.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "client_lib/daemon_identity.h"
#include "kvtier/client.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/test_daemon.h"

namespace kvtier {
namespace {

using testing::TestDaemon;

// Sets an environment variable for the scope of the object.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(DaemonTrustTest, TheDefaultTrustsRootAndThisProcesssOwnUid) {
  ScopedEnv unset("KVTIER_TRUSTED_DAEMON_UIDS", nullptr);
  auto uids = internal::DefaultTrustedDaemonUids();
  EXPECT_NE(std::find(uids.begin(), uids.end(), 0u), uids.end());
  EXPECT_NE(std::find(uids.begin(), uids.end(), static_cast<uint32_t>(::geteuid())), uids.end());
  TestDaemon daemon;
  EXPECT_NE(daemon.Connect(), nullptr);  // the daemon runs as this uid
}

TEST(DaemonTrustTest, ADaemonOfAnUntrustedUidIsRefusedWithTheReason) {
  TestDaemon daemon;
  ClientOptions options = daemon.Options();
  options.trusted_daemon_uids = {static_cast<uint32_t>(::geteuid()) + 4242};
  auto client = Client::Connect(options);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(client.status().message().find("runs as uid " + std::to_string(::geteuid())), std::string::npos)
      << client.status().message();
  EXPECT_NE(client.status().message().find("KVTIER_TRUSTED_DAEMON_UIDS"), std::string::npos);
}

TEST(DaemonTrustTest, TheEnvironmentNamesTrustedUidsWhenTheOptionsDoNot) {
  TestDaemon daemon;
  {
    ScopedEnv env("KVTIER_TRUSTED_DAEMON_UIDS", std::to_string(::geteuid() + 4242).c_str());
    auto client = Client::Connect(daemon.Options());
    EXPECT_EQ(client.status().code(), StatusCode::kPermissionDenied);
  }
  {
    ScopedEnv env("KVTIER_TRUSTED_DAEMON_UIDS", ("4242, " + std::to_string(::geteuid())).c_str());
    EXPECT_TRUE(Client::Connect(daemon.Options()).ok());
  }
  {
    ScopedEnv env("KVTIER_TRUSTED_DAEMON_UIDS", "no-such-user-kvtier-test");
    auto client = Client::Connect(daemon.Options());
    EXPECT_EQ(client.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(client.status().message().find("no-such-user-kvtier-test"), std::string::npos);
  }
  {
    ScopedEnv env("KVTIER_TRUSTED_DAEMON_UIDS", "0,,1");
    EXPECT_EQ(Client::Connect(daemon.Options()).status().code(), StatusCode::kInvalidArgument);
  }
}

// The attack itself: a listener of another uid at the socket path. Only a
// root test can be another uid; the listener reports how many bytes the
// client sent it before the refusal (none may arrive).
TEST(DaemonTrustTest, AnImpostorListenerOfAnotherUserNeverSeesAByte) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to listen as another uid";
  ScopedEnv unset("KVTIER_TRUSTED_DAEMON_UIDS", nullptr);
  char pattern[] = "/tmp/kvtier-impostor-XXXXXX";
  ASSERT_NE(::mkdtemp(pattern), nullptr);
  const std::string dir = pattern;
  ASSERT_EQ(::chmod(dir.c_str(), 0777), 0);  // the tenant's own directory, as in the finding
  const std::string path = dir + "/kvtierd.sock";
  int ready[2], report[2];
  ASSERT_EQ(::pipe(ready), 0);
  ASSERT_EQ(::pipe(report), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(2);
    const int listener = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
    if (::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(listener, 4) != 0)
      ::_exit(3);
    char one = 1;
    (void)!::write(ready[1], &one, 1);
    const int conn = ::accept(listener, nullptr, nullptr);
    int64_t total = 0;
    char buffer[4096];
    for (ssize_t n; (n = ::read(conn, buffer, sizeof(buffer))) > 0;) total += n;
    (void)!::write(report[1], &total, sizeof(total));
    ::_exit(0);
  }
  ::close(ready[1]);
  ::close(report[1]);
  char one = 0;
  ASSERT_EQ(::read(ready[0], &one, 1), 1) << "the impostor could not listen";
  ClientOptions options;
  options.socket_path = path;
  options.namespaces = {testing::TestNamespace()};
  options.reconnect = false;
  auto client = Client::Connect(options);
  EXPECT_EQ(client.status().code(), StatusCode::kPermissionDenied) << client.status().ToString();
  EXPECT_NE(client.status().message().find("uid 65534"), std::string::npos) << client.status().message();
  int64_t received = -1;
  EXPECT_EQ(::read(report[0], &received, sizeof(received)), static_cast<ssize_t>(sizeof(received)));
  EXPECT_EQ(received, 0) << "the client sent the impostor bytes before checking it";
  int status = 0;
  ::waitpid(child, &status, 0);
  ::close(ready[0]);
  ::close(report[0]);
  std::filesystem::remove_all(dir);
}

TEST(DaemonTrustTest, KvtierdRefusesToStartInADirectoryOthersMayWrite) {
  char pattern[] = "/tmp/kvtier-opendir-XXXXXX";
  ASSERT_NE(::mkdtemp(pattern), nullptr);
  const std::string dir = pattern;
  ASSERT_EQ(::chmod(dir.c_str(), 0777), 0);
  const std::string config = dir + "/kvtierd.toml";
  std::ofstream(config) << "[server]\nsocket_path = \"" << dir
                        << "/kvtierd.sock\"\n[host]\ncapacity_bytes = \"64MiB\"\n";
  auto result = testing::RunCommand({KVTIERD_PATH, "--config", config});
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.output.find("server.trust_shared_directories"), std::string::npos) << result.output;
  EXPECT_FALSE(std::filesystem::exists(dir + "/kvtierd.sock"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kvtier

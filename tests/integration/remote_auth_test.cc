// The remote tier on one plain (non-cluster) Redis that wants a password:
// with the right one it stores and serves blocks (a plain Redis is one
// node owning every slot); a wrong or missing password stops the tier from
// opening with PermissionDenied, never quoting the secret.
#include <gtest/gtest.h>

#include <future>
#include <unistd.h>

#include "tests/testing/daemon_process.h"
#include "tests/testing/redis_cluster.h"
#include "tests/testing/test_daemon.h"
#include "tiers/remote/remote_tier.h"

namespace kvtier::testing {
namespace {

constexpr char kPassword[] = "kv-s3cret";

class PasswordRedis : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = RedisCluster::Unavailable(); !why.empty()) GTEST_SKIP() << why;
    dir_ = MakeTempDir();
    port_ = std::to_string(FreeLoopbackPort());
    const CommandResult started =
        RunCommand({"/usr/bin/redis-server", "--port", port_, "--bind", "127.0.0.1", "--requirepass", kPassword,
                    "--dir", dir_, "--save", "", "--appendonly", "no", "--daemonize", "yes", "--pidfile",
                    dir_ + "/redis.pid", "--logfile", dir_ + "/redis.log"});
    ASSERT_EQ(started.exit_code, 0) << started.output;
    bool up = false;
    for (int i = 0; i < 100 && !up; ++i) {
      up = RunCommand({"/usr/bin/redis-cli", "-p", port_, "--no-auth-warning", "-a", kPassword, "ping"})
               .output.find("PONG") != std::string::npos;
      if (!up) ::usleep(50'000);
    }
    ASSERT_TRUE(up) << "redis-server did not answer on port " << port_;
  }
  void TearDown() override {
    if (!port_.empty()) {
      RunCommand({"/usr/bin/redis-cli", "-p", port_, "--no-auth-warning", "-a", kPassword, "shutdown", "nosave"});
    }
    if (!dir_.empty()) RemoveTree(dir_);
  }
  RemoteTierOptions Options(const std::string& password) const {
    RemoteTierOptions o;
    o.cluster_secret = std::string(kClusterSecretBytes, 'a');
    o.cluster.seeds = {"127.0.0.1:" + port_};
    o.cluster.password = password;
    o.timeout = std::chrono::milliseconds(2000);
    return o;
  }
  std::string dir_, port_;
  SystemClock clock_;  // the tiers'
};

TEST_F(PasswordRedis, TheRightPasswordStoresAndServesBlocks) {
  auto tier = RemoteTier::Open(Options(kPassword), clock_);
  ASSERT_TRUE(tier.ok()) << tier.status().ToString();
  ASSERT_TRUE((*tier)->available());
  const NamespaceFingerprint ns{3, 4};
  const BlockKey key{5, 6};
  const auto bytes = Block(key, 256 << 10);
  std::promise<Status> wrote;
  ASSERT_TRUE((*tier)->Write(ns, key, 2, bytes, [&](Status s) { wrote.set_value(s); }).ok());
  ASSERT_TRUE(wrote.get_future().get().ok());
  // Another tier (another node) finds it by probing, and reads it back.
  auto other = RemoteTier::Open(Options(kPassword), clock_);
  ASSERT_TRUE(other.ok());
  (*other)->Probe(ns, std::span(&key, 1));
  ASSERT_TRUE((*other)->Find(key).has_value());
  std::vector<std::byte> dst(bytes.size());
  std::promise<Result<size_t>> read;
  ASSERT_TRUE((*other)->Read(key, 0, 2, dst, [&](Result<size_t> r) { read.set_value(std::move(r)); }).ok());
  auto got = read.get_future().get();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(CheckBlockBytes(key, 0, dst));
}

TEST_F(PasswordRedis, AWrongOrMissingPasswordStopsTheTierWithoutQuotingIt) {
  auto wrong = RemoteTier::Open(Options("not-the-password"), clock_);
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), StatusCode::kPermissionDenied) << wrong.status().ToString();
  EXPECT_EQ(wrong.status().message().find("not-the-password"), std::string::npos) << wrong.status().message();
  auto none = RemoteTier::Open(Options(""), clock_);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kPermissionDenied) << none.status().ToString();
  EXPECT_NE(none.status().message().find("password"), std::string::npos) << none.status().message();
}

}  // namespace
}  // namespace kvtier::testing

// The remote tier's tests over a real Redis Cluster: support::RedisCluster
// (support/redis_cluster.h, shared with `kvtier bench remote`) under the
// tests' names, a free port that fails the test when there is none, and a
// fixture that starts a default cluster or skips without Redis.
#pragma once

#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "support/redis_cluster.h"

namespace kvtier::testing {

using support::RedisCluster;

// support::FreeRedisPort; fails the test and returns -1 when none is free.
inline int FreeLoopbackPort() {
  const int port = support::FreeRedisPort();
  if (port < 0) ADD_FAILURE() << "no free loopback port for a redis node";
  return port;
}

// A test with its own default cluster (Options{}), started in SetUp;
// skipped with the reason when Redis is not installed.
class RedisClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = RedisCluster::Unavailable(); !why.empty()) GTEST_SKIP() << why;
    auto cluster = RedisCluster::Start(RedisCluster::Options{});
    ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
    cluster_ = std::move(*cluster);
  }
  std::unique_ptr<RedisCluster> cluster_;
};

}  // namespace kvtier::testing

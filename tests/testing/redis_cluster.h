// The remote tier's tests over a real Redis Cluster: support::RedisCluster
// (support/redis_cluster.h, shared with `kvtier bench remote`) under the
// tests' names, a free port that fails the test when there is none, and a
// fixture that starts a default cluster or skips without Redis.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/ports.h"
#include "support/redis_cluster.h"

namespace kvtier::testing {

using support::RedisCluster;

// support::FreeRedisPort; fails the test and returns -1 when none is free.
inline int FreeLoopbackPort() {
  const int port = support::FreeRedisPort();
  if (port < 0) ADD_FAILURE() << "no free loopback port for a redis node";
  return port;
}

// `n` distinct free loopback ports (held together while drawn, so none
// repeats, as two FreeLoopbackPort calls may); fails the test and returns
// fewer when the range is crowded.
inline std::vector<int> FreeLoopbackPorts(int n) {
  std::vector<int> ports = support::ReserveLoopbackPorts(n, 10000, 22767, /*companion_offset=*/0);
  if (static_cast<int>(ports.size()) < n) ADD_FAILURE() << "fewer than " << n << " free loopback ports";
  return ports;
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

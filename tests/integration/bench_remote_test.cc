// `kvtier bench remote` end to end on a small case: it starts its private
// cluster, measures the tier and redis-benchmark, prints both with their
// ratio, writes the JSON, and stops the cluster.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <unistd.h>

#include "tests/testing/daemon_process.h"
#include "tests/testing/redis_cluster.h"
#include "tests/testing/test_daemon.h"

namespace kvtier::testing {
namespace {

TEST(BenchRemote, MeasuresTheTierBesideRedisBenchmarkOnAPrivateCluster) {
  if (std::string why = RedisCluster::Unavailable(); !why.empty()) GTEST_SKIP() << why;
  if (::access("/usr/bin/redis-benchmark", X_OK) != 0) GTEST_SKIP() << "redis-benchmark is not installed";
  const std::string dir = MakeTempDir();
  const CommandResult run =
      RunCommand({KVTIER_TOOL_PATH, "bench", "remote", "--rounds", "1", "--block-bytes", "1048576", "--bytes-per-case",
                  "16777216", "--node-memory", "256mb", "--json", dir + "/out.json"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("1 MiB"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("n/a"), std::string::npos) << "every ratio measured: " << run.output;
  std::ifstream in(dir + "/out.json");
  const std::string json((std::istreambuf_iterator<char>(in)), {});
  for (const char* field : {"\"tier_put_gbps\"", "\"redis_set_gbps\"", "\"tier_get_gbps\"", "\"redis_get_gbps\""}) {
    EXPECT_NE(json.find(field), std::string::npos) << field << " in " << json;
  }
  EXPECT_NE(json.find("\"errors\": 0"), std::string::npos) << json;
  RemoveTree(dir);
}

}  // namespace
}  // namespace kvtier::testing

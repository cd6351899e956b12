// `kvtier bench startup` end to end on small arenas: it starts a private
// kvtierd per size, reports when each served and when its arena was warm
// beside the synchronous ceiling, writes the JSON, and stops the daemons.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>

#include "tests/testing/daemon_process.h"
#include "tests/testing/test_daemon.h"

namespace kvtier::testing {
namespace {

TEST(BenchStartup, ReportsServeAndWarmBesideTheCeilingPerArenaSize) {
  const std::string dir = MakeTempDir();
  const CommandResult run = RunCommand({KVTIER_TOOL_PATH, "bench", "startup", "--kvtierd", KVTIERD_PATH,
                                        "--arena-bytes", "64MiB,128MiB", "--json", dir + "/out.json"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("serve/ceiling"), std::string::npos) << run.output;
  std::ifstream in(dir + "/out.json");
  const std::string json((std::istreambuf_iterator<char>(in)), {});
  for (const char* field :
       {"\"arena_bytes\": 67108864", "\"arena_bytes\": 134217728", "\"serve_s\"", "\"warm_s\"", "\"ceiling_sync_s\""}) {
    EXPECT_NE(json.find(field), std::string::npos) << field << " in " << json;
  }
  // Each daemon's arena (over one 16 MiB chunk: warmed in the background) got warm.
  EXPECT_EQ(json.find("\"warmed\": false"), std::string::npos) << json;
  EXPECT_NE(json.find("\"warmed\": true"), std::string::npos) << json;
  // Warm is never before serving (both from the daemon's exec).
  for (size_t at = json.find("\"serve_s\": "); at != std::string::npos; at = json.find("\"serve_s\": ", at + 1)) {
    const double serve = std::stod(json.substr(at + 11));
    const size_t warm_at = json.find("\"warm_s\": ", at);
    ASSERT_NE(warm_at, std::string::npos);
    EXPECT_GE(std::stod(json.substr(warm_at + 10)), serve) << json;
    EXPECT_GT(serve, 0.0);
  }
  RemoveTree(dir);
}

}  // namespace
}  // namespace kvtier::testing

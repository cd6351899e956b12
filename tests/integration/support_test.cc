// kvtier_support (support/): the process, temp-dir and port helpers the
// tools and the test fixtures share.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

#include "support/ports.h"
#include "support/process.h"
#include "support/temp_dir.h"

namespace kvtier::support {
namespace {

TEST(SupportProcess, RunCommandReturnsOutputAndExitCode) {
  const Result<CommandOutput> r = RunCommand({"/bin/sh", "-c", "echo out; echo err >&2; exit 3"});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->exit_code, 3);
  EXPECT_EQ(r->output, "out\nerr\n");
  // PATH lookup by default.
  const Result<CommandOutput> sh = RunCommand({"sh", "-c", "exit 0"});
  ASSERT_TRUE(sh.ok()) << sh.status().ToString();
  EXPECT_EQ(sh->exit_code, 0);
}

TEST(SupportProcess, AProgramThatCannotRunIsNotFoundAtOnce) {
  const Result<CommandOutput> r = RunCommand({"/nonexistent/kvtier-no-such-program"});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound) << r.status().ToString();
  // Without PATH lookup a bare name is not found either.
  SpawnOptions options;
  options.search_path = false;
  const Result<pid_t> pid = Spawn({"sh", "-c", "exit 0"}, STDERR_FILENO, options);
  ASSERT_FALSE(pid.ok());
  EXPECT_EQ(pid.status().code(), StatusCode::kNotFound);
}

TEST(SupportProcess, SpawnSetsTheOpenFileLimit) {
  const Result<std::string> dir = MakeTempDir("kvtier-support-test-");
  ASSERT_TRUE(dir.ok()) << dir.status().ToString();
  const std::string log = *dir + "/log";
  SpawnOptions options;
  options.max_open_files = 77;
  Result<ChildProcess> child = ChildProcess::Spawn({"/bin/sh", "-c", "ulimit -n"}, log, options);
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  std::string how;
  for (int i = 0; i < 500 && !child->Exited(&how); ++i) ::usleep(10000);
  EXPECT_EQ(how, "exit status 0");
  EXPECT_EQ(FileTail(log), "77\n");
  RemoveTree(*dir);
  EXPECT_FALSE(std::filesystem::exists(*dir));
}

TEST(SupportProcess, StopEndsARunningChild) {
  Result<ChildProcess> child = ChildProcess::Spawn({"sleep", "30"}, "/dev/null");
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  EXPECT_TRUE(child->running());
  EXPECT_EQ(child->Stop(), "killed by signal 15");
  EXPECT_FALSE(child->running());
}

TEST(SupportPorts, ReservesDistinctFreePortsInTheRange) {
  const std::vector<int> ports = ReserveLoopbackPorts(4, 10000, 22767, 10000);
  ASSERT_EQ(ports.size(), 4u);
  EXPECT_EQ(std::set<int>(ports.begin(), ports.end()).size(), 4u);
  for (int port : ports) {
    EXPECT_GE(port, 10000);
    EXPECT_LE(port, 22767);
  }
}

// A drawn port stays claimed by the drawing process: neither another process
// nor a later draw of its own gets it, though nothing is bound to it (parallel
// tests drew the same port between its check and their daemon's bind).
TEST(SupportPorts, ADrawnPortIsNeverDrawnAgainWhileItsProcessLives) {
  const std::vector<int> ports = ReserveLoopbackPorts(1, 10000, 22767, 0);
  ASSERT_EQ(ports.size(), 1u);
  const int port = ports[0];
  EXPECT_TRUE(ReserveLoopbackPorts(1, port, port, 0).empty());
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(ReserveLoopbackPorts(1, port, port, 0).empty() ? 0 : 1);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "another process drew port " << port;
}

TEST(SupportTempDir, MakesAFreshDirectoryWithThePrefix) {
  const Result<std::string> a = MakeTempDir("kvtier-support-test-");
  const Result<std::string> b = MakeTempDir("kvtier-support-test-");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(*a, *b);
  EXPECT_NE(a->find("/kvtier-support-test-"), std::string::npos) << *a;
  EXPECT_TRUE(std::filesystem::is_directory(*a));
  RemoveTree(*a);
  RemoveTree(*b);
  EXPECT_FALSE(std::filesystem::exists(*a));
}

}  // namespace
}  // namespace kvtier::support

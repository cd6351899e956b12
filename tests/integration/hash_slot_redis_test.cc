// HashSlot (tiers/remote/hash_slot.h) against redis-server's own CLUSTER
// KEYSLOT, for keys of every shape the remote tier and users send: the
// tier routes each command by this number, so one disagreement would send
// a block to the wrong master (a MOVED per request at best). Starts a
// cluster-enabled redis-server on a free loopback port and stops it.
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <sstream>
#include <unistd.h>

#include "tests/testing/daemon_process.h"
#include "tests/testing/redis_cluster.h"
#include "tests/testing/test_daemon.h"
#include "tiers/remote/hash_slot.h"
#include "tiers/remote/remote_value.h"

namespace kvtier::testing {
namespace {

TEST(HashSlotRedis, EveryKeyLandsWhereRedisServerPutsIt) {
  const std::string dir = MakeTempDir();
  const std::string port = std::to_string(FreeLoopbackPort());
  const CommandResult started = RunCommand({"/usr/bin/redis-server",
                                            "--port",
                                            port,
                                            "--bind",
                                            "127.0.0.1",
                                            "--cluster-enabled",
                                            "yes",
                                            "--cluster-config-file",
                                            dir + "/nodes.conf",
                                            "--dir",
                                            dir,
                                            "--save",
                                            "",
                                            "--appendonly",
                                            "no",
                                            "--daemonize",
                                            "yes",
                                            "--pidfile",
                                            dir + "/redis.pid",
                                            "--logfile",
                                            dir + "/redis.log"});
  ASSERT_EQ(started.exit_code, 0) << started.output;
  bool up = false;
  for (int i = 0; i < 100 && !up; ++i) {
    up = RunCommand({"/usr/bin/redis-cli", "-p", port, "ping"}).output.find("PONG") != std::string::npos;
    if (!up) ::usleep(50'000);
  }
  ASSERT_TRUE(up) << "redis-server did not answer on port " << port;

  // Keys: the tier's own names, random ones, and hash tags of every shape.
  std::mt19937_64 random(20261203);
  std::vector<std::string> keys = {"{", "}", "{}", "{a}", "a{b}c", "a{}{b}", "{{x}}", "x{y", "y}x{"};
  for (int i = 0; i < 200; ++i) {
    keys.push_back(RemoteKeyName(NamespaceFingerprint{random(), random()}, BlockKey{random(), random()}));
  }
  const std::string alphabet = "abcXYZ019{}:._-";
  for (int i = 0; i < 300; ++i) {
    std::string key;
    for (size_t n = 1 + random() % 24; n > 0; --n) key += alphabet[random() % alphabet.size()];
    keys.push_back(key);
  }
  std::ofstream(dir + "/commands") << [&] {
    std::string script;
    for (const auto& k : keys) script += "CLUSTER KEYSLOT \"" + k + "\"\n";
    return script;
  }();
  const CommandResult slots =
      RunCommand({"/bin/sh", "-c", "/usr/bin/redis-cli -p " + port + " < " + dir + "/commands"});
  RunCommand({"/usr/bin/redis-cli", "-p", port, "shutdown", "nosave"});
  ASSERT_EQ(slots.exit_code, 0) << slots.output;
  std::istringstream answers(slots.output);
  size_t checked = 0;
  for (const auto& k : keys) {
    long slot = -1;
    ASSERT_TRUE(answers >> slot) << "no answer for key " << k << " in:\n" << slots.output;
    EXPECT_EQ(HashSlot(k), slot) << "key \"" << k << "\"";
    ++checked;
  }
  EXPECT_EQ(checked, keys.size());
  RemoveTree(dir);
}

}  // namespace
}  // namespace kvtier::testing

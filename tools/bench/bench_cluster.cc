#include "tools/bench/bench_cluster.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "support/ports.h"
#include "support/temp_dir.h"

namespace kvtier::tools {

Result<std::unique_ptr<BenchCluster>> BenchCluster::Start(const Options& o) {
  const std::string server = support::FindProgram(o.redis_server), cli = support::FindProgram(o.redis_cli);
  if (server.empty() || cli.empty()) return NotFound((server.empty() ? o.redis_server : o.redis_cli) + " not found");
  auto dir = support::MakeTempDir("kvtier-bench-cluster-");
  if (!dir.ok()) return dir.status();
  std::unique_ptr<BenchCluster> c(new BenchCluster());
  c->dir_ = *dir;
  c->cli_ = cli;
  // Ports below the ephemeral range whose cluster bus port (+10000) is free too.
  const std::vector<int> ports = support::ReserveLoopbackPorts(o.masters, 10000, 21999, 10000);
  if (static_cast<int>(ports.size()) < o.masters) return IoError("no free loopback port for a redis node");
  std::vector<std::string> create = {cli, "--cluster", "create"};
  for (const int port : ports) {
    const std::string node_dir = c->dir_ + "/" + std::to_string(port);
    ::mkdir(node_dir.c_str(), 0700);
    auto child = support::ChildProcess::Spawn(
        {server, "--port", std::to_string(port), "--bind", "127.0.0.1", "--dir", node_dir, "--cluster-enabled",
         "yes", "--cluster-config-file", "nodes.conf", "--cluster-require-full-coverage", "no", "--save", "",
         "--appendonly", "no", "--maxmemory", o.maxmemory, "--maxmemory-policy", "allkeys-lru", "--daemonize", "no"},
        node_dir + "/redis.log");
    if (!child.ok()) return child.status();
    c->nodes_.push_back(std::move(*child));
    c->ports_.push_back(port);
    create.push_back("127.0.0.1:" + std::to_string(port));
  }
  auto cluster_ok = [&](int port) {
    auto r = support::RunCommand({cli, "-p", std::to_string(port), "cluster", "info"});
    return r.ok() && r->output.find("cluster_state:ok") != std::string::npos;
  };
  for (int port : c->ports_) {
    bool up = false;
    for (int i = 0; i < 100 && !up; ++i) {
      auto r = support::RunCommand({cli, "-p", std::to_string(port), "ping"});
      up = r.ok() && r->output.find("PONG") != std::string::npos;
      if (!up) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (!up) return IoError("redis node on port " + std::to_string(port) + " did not start: " +
                            support::FileTail(c->dir_ + "/" + std::to_string(port) + "/redis.log"));
  }
  create.insert(create.end(), {"--cluster-replicas", "0", "--cluster-yes"});
  auto created = support::RunCommand(create);
  if (!created.ok()) return created.status();
  if (created->exit_code != 0) return IoError("redis-cli --cluster create failed: " + created->output);
  for (int port : c->ports_) {
    bool ok = false;
    for (int i = 0; i < 200 && !ok; ++i) {
      ok = cluster_ok(port);
      if (!ok) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (!ok) return TimedOut("redis node on port " + std::to_string(port) + " never reported cluster_state:ok");
  }
  return c;
}

BenchCluster::~BenchCluster() {
  for (support::ChildProcess& node : nodes_) node.Stop(std::chrono::seconds(2));
  if (!dir_.empty()) support::RemoveTree(dir_);
}

void BenchCluster::Flush() {
  for (int port : ports_) support::RunCommand({cli_, "-p", std::to_string(port), "FLUSHALL"}).status().IgnoreError();
}

std::vector<std::string> BenchCluster::Seeds() const {
  std::vector<std::string> out;
  for (int port : ports_) out.push_back("127.0.0.1:" + std::to_string(port));
  return out;
}

}  // namespace kvtier::tools

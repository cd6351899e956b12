#include "tools/bench_cluster.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <random>
#include <thread>

namespace kvtier::tools {
namespace {

// Whether nobody listens on 127.0.0.1:`port` now (bind succeeds).
bool PortFree(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool free = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return free;
}

// A port below the ephemeral range whose cluster bus port (+10000) is free too.
int PickPort(std::mt19937& random) {
  for (int tries = 0; tries < 1000; ++tries) {
    const int port = 10000 + static_cast<int>(random() % 12000);
    if (PortFree(port) && PortFree(port + 10000)) return port;
  }
  return -1;
}

}  // namespace

Result<std::unique_ptr<BenchCluster>> BenchCluster::Start(const Options& o) {
  const std::string server = FindProgram(o.redis_server), cli = FindProgram(o.redis_cli);
  if (server.empty() || cli.empty()) return NotFound((server.empty() ? o.redis_server : o.redis_cli) + " not found");
  auto dir = MakeTempDir("kvtier-bench-cluster-");
  if (!dir.ok()) return dir.status();
  std::unique_ptr<BenchCluster> c(new BenchCluster());
  c->dir_ = *dir;
  c->cli_ = cli;
  std::mt19937 random(static_cast<uint32_t>(::getpid()));
  std::vector<std::string> create = {cli, "--cluster", "create"};
  for (int i = 0; i < o.masters; ++i) {
    const int port = PickPort(random);
    if (port < 0) return IoError("no free loopback port for a redis node");
    const std::string node_dir = c->dir_ + "/" + std::to_string(port);
    ::mkdir(node_dir.c_str(), 0700);
    auto child = ChildProcess::Spawn(
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
    auto r = RunCommand({cli, "-p", std::to_string(port), "cluster", "info"});
    return r.ok() && r->output.find("cluster_state:ok") != std::string::npos;
  };
  for (int port : c->ports_) {
    bool up = false;
    for (int i = 0; i < 100 && !up; ++i) {
      auto r = RunCommand({cli, "-p", std::to_string(port), "ping"});
      up = r.ok() && r->output.find("PONG") != std::string::npos;
      if (!up) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (!up) return IoError("redis node on port " + std::to_string(port) + " did not start: " +
                            FileTail(c->dir_ + "/" + std::to_string(port) + "/redis.log"));
  }
  create.insert(create.end(), {"--cluster-replicas", "0", "--cluster-yes"});
  auto created = RunCommand(create);
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
  for (ChildProcess& node : nodes_) node.Stop(std::chrono::seconds(2));
  if (!dir_.empty()) RemoveTree(dir_);
}

void BenchCluster::Flush() {
  for (int port : ports_) RunCommand({cli_, "-p", std::to_string(port), "FLUSHALL"}).status().IgnoreError();
}

std::vector<std::string> BenchCluster::Seeds() const {
  std::vector<std::string> out;
  for (int port : ports_) out.push_back("127.0.0.1:" + std::to_string(port));
  return out;
}

}  // namespace kvtier::tools

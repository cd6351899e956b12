// BenchCluster: a private Redis Cluster on loopback for `kvtier bench
// remote` when no --nodes are given: `masters` redis-server processes
// (cluster-enabled, no persistence, maxmemory with allkeys-lru, as kvtier's
// cluster should run), joined by `redis-cli --cluster create` and waited
// for (cluster_state:ok on every node). The destructor stops them and
// removes their directory. Thread-compatible.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kvtier/result.h"
#include "support/process.h"

namespace kvtier::tools {

class BenchCluster {
 public:
  struct Options {
    int masters = 3;
    std::string maxmemory = "3gb";  // each node
    std::string redis_server = "redis-server";
    std::string redis_cli = "redis-cli";
  };
  // NotFound when redis-server or redis-cli is missing; IoError or
  // TimedOut (with a node's log) when the cluster does not form.
  static Result<std::unique_ptr<BenchCluster>> Start(const Options& options);
  ~BenchCluster();

  std::vector<std::string> Seeds() const;  // "127.0.0.1:<port>" of every node
  void Flush();  // FLUSHALL on every node
  int first_port() const { return ports_.front(); }

 private:
  BenchCluster() = default;
  std::string dir_;
  std::string cli_;
  std::vector<int> ports_;
  std::vector<support::ChildProcess> nodes_;
};

}  // namespace kvtier::tools

// `kvtier bench remote`: the remote tier's put and get GB/s for whole
// blocks (2 MiB and 32 MiB by default) against a Redis Cluster, each beside
// redis-benchmark SET / GET of values of the same size, with the same
// number of connections, against the same cluster, in the same run, as a
// ratio (the goal: >= 0.8).
//
// The tier runs in-process (the RemoteTier, ClusterClient and RESP code
// kvtierd uses): puts are Writes of fresh keys, --clients in flight, so the
// figure includes the staging copy, the header's checksum and the SET;
// gets are whole-block Reads of those keys, verified (header, length,
// xxh3) into a buffer. redis-benchmark runs in --cluster mode with -c and
// --threads --clients (one thread per connection, as the tier has), -d the
// block size, over a key space of as many keys as requests (the tier's
// puts create values; so do most SETs), which its SET run fills (about 63%)
// before its GET run reads all of it: GET GB/s counts the values returned,
// GETs/s times the expected share of keys present (1 - (1 - 1/K)^n). A private cluster
// is flushed before each redis-benchmark round; an existing one (--nodes)
// keeps redis-benchmark's keys ("key:*") afterwards.
//
// Without --nodes the bench starts a private 3-master cluster on loopback
// (support::RedisCluster, no replicas) and stops it at the end. Exit 0 on success, 1 when the
// cluster cannot be reached or an operation fails.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace kvtier::tools {

struct RemoteBenchOptions {
  std::string nodes;                // "host:port,...": an existing cluster; empty: a private one
  int masters = 3;                  // private cluster
  std::string node_memory = "3gb";  // private cluster: maxmemory of each node
  std::vector<uint64_t> block_bytes = {2ull << 20, 32ull << 20};
  uint32_t clients = 4;                  // operations in flight, and redis-benchmark -c
  uint64_t bytes_per_case = 1ull << 30;  // written per put case (and read per get case)
  uint32_t rounds = 3;                   // medians of tier and redis-benchmark, alternating who goes first
  bool skip_redis = false;
  std::string redis_benchmark = "redis-benchmark";
  std::string json_path;
};

void AddRemoteBenchOptions(CLI::App& app, RemoteBenchOptions& options);
int RunRemoteBench(const RemoteBenchOptions& options);

}  // namespace kvtier::tools

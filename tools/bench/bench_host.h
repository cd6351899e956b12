// `kvtier bench host`: put/get throughput through the client against
// single-thread memcpy, and Lookup rate/latency against redis-benchmark GET,
// each measured in the same run and printed as a ratio.
//
// Unless --socket names a running daemon, the bench starts a private kvtierd
// (fork + exec of the binary, temporary config and socket) and, unless
// --skip-redis, a private redis-server on a unix socket; both are SIGTERMed
// and reaped at the end. Exit 0 on success, 1 if a server cannot be started
// or a measured call fails (the message says which).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace kvtier::tools {

struct HostBenchOptions {
  // Empty: start a private kvtierd (the binary next to this tool) on a
  // temporary socket; otherwise use the daemon listening there.
  std::string socket_path;
  std::string kvtierd_path;           // default: <dir of kvtier>/../daemon/kvtierd
  uint64_t arena_bytes = 2ull << 30;  // private daemon only
  // The private daemon's KV events: "on" (its default: published, nobody
  // subscribed), "off" (events.enabled = false), or "subscribed" (on, with
  // `kvtier events --json` reading every event meanwhile).
  std::string events = "on";
  // Bytes cycled over per block size (arena and caller side each);
  // 0: min(arena / 2, 1 GiB).
  uint64_t working_set_bytes = 0;
  std::vector<uint64_t> block_bytes = {256ull << 10, 2ull << 20, 32ull << 20};
  double seconds_per_case = 2.0;
  std::vector<int> lookup_clients = {1, 4, 16};
  size_t lookup_chain_blocks = 64;
  bool skip_redis = false;
  std::string redis_server = "redis-server";
  std::string redis_benchmark = "redis-benchmark";
  std::string json_path;  // empty: no JSON copy
  // Clients use the daemon's block directory (ClientOptions::use_directory);
  // --no-directory measures the socket path (every get a Pin round trip).
  bool use_directory = true;
  // ClientOptions::verify_checksums of the bench client: gets and pins
  // check the bytes they read (--verify-checksums).
  bool verify_checksums = false;
};

void AddHostBenchOptions(CLI::App& app, HostBenchOptions& options);
int RunHostBench(const HostBenchOptions& options);

}  // namespace kvtier::tools

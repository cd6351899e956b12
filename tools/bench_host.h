// `kvtier bench host`: put/get throughput through the client against
// single-thread memcpy, and Lookup rate/latency against redis-benchmark GET,
// each measured in the same run and printed as a ratio.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace kvtier::tools {

struct HostBenchOptions {
  // Empty: start a private kvtierd (the binary next to this tool) on a
  // temporary socket; otherwise use the daemon listening there.
  std::string socket_path;
  std::string kvtierd_path;        // default: <dir of kvtier>/../daemon/kvtierd
  uint64_t arena_bytes = 2ull << 30;
  double seconds_per_case = 2.0;
  bool skip_redis = false;
};

void AddHostBenchOptions(CLI::App& app, HostBenchOptions& options);
int RunHostBench(const HostBenchOptions& options);

}  // namespace kvtier::tools

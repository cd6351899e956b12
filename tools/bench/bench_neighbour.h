// `kvtier bench neighbour`: how much one connection's huge lookups delay
// another connection's small ones. A private kvtierd (or --socket) holds a
// chain of `huge_keys` 4 KiB blocks and a 64-block chain; `victims`
// connections (opened one after another, so the daemon's round robin puts
// one on each of its io threads: 2 by default) take turns looking up the
// 64-block chain, alone, then while `hogs` connections each send Lookups of
// all `huge_keys` keys, about as large as one 1 MiB frame allows. Printed
// per victim: p50 / p99 / max latency in both phases (the victim on a hog's
// io thread is the one that shows the delay), and the hogs' lookups per
// second. Every client skips the block directory, so every lookup is a
// request to the daemon.
//
// Exit 0 on success, 1 when the daemon cannot start or a call fails.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace kvtier::tools {

struct NeighbourBenchOptions {
  std::string socket_path;   // empty: start a private kvtierd
  std::string kvtierd_path;  // default: <dir of kvtier>/../daemon/kvtierd
  size_t huge_keys = 40000;  // keys per hog Lookup (~0.8 MiB frame)
  int hogs = 1;
  int victims = 2;
  double seconds = 3.0;  // per phase
};

void AddNeighbourBenchOptions(CLI::App& app, NeighbourBenchOptions& options);
int RunNeighbourBench(const NeighbourBenchOptions& options);

}  // namespace kvtier::tools

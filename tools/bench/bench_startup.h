// `kvtier bench startup`: how soon a fresh kvtierd serves, and how long its
// host arena takes to be faulted in and locked behind the socket, beside
// the ceiling: the time the kernel takes to make an arena of that size
// resident and locked at once (memfd, fallocate, MAP_POPULATE, mlock: what
// kvtierd did before it opened its socket until the arena warmed in the
// background), measured in the same run. Per arena size: a private kvtierd
// (lock_memory best_effort, events off) is started; "serve" is the time
// from its exec to the first Hello a client gets answered (the client maps
// the arena without faulting it in), "allocated" until its stats show
// host.arena.allocated_bytes at the arena's size (the host tier can hand out
// all of it), "warm" until they show host.arena.warm_bytes there.
//
// Exit 0 on success, 1 when a daemon cannot start or a step fails.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace kvtier::tools {

struct StartupBenchOptions {
  std::string kvtierd_path;  // default: the kvtierd of this build or install
  std::vector<uint64_t> arena_bytes{uint64_t{1} << 30, uint64_t{4} << 30};
  std::string json_path;  // also write the figures here
  // host.allocate_at_start_bytes of the daemons (0: the whole arena before serving).
  uint64_t allocate_at_start_bytes = 0;
};

void AddStartupBenchOptions(CLI::App& app, StartupBenchOptions& options);
int RunStartupBench(const StartupBenchOptions& options);

}  // namespace kvtier::tools

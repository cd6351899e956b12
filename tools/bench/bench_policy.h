// `kvtier bench policy`: policy operations per second on one core (Google
// Benchmark), against the goal of 1M per second each: eviction (LRU, FIFO,
// queue-aware: insert, access, victim selection with removal; queue-aware
// also the enqueue of a 64-block chain) and admission (all, second_hit,
// dwpd: one decision). Each case runs on a policy already
// tracking --blocks blocks, so the figures include the hash-map and list
// or tree costs at a realistic size. Pure CPU: no daemon, no I/O.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace kvtier::tools {

struct PolicyBenchOptions {
  uint64_t blocks = 1'000'000;  // blocks each eviction policy tracks
  double min_seconds = 0.5;     // Google Benchmark's min time per case
  std::string json_path;        // also write Google Benchmark's JSON here
};

void AddPolicyBenchOptions(CLI::App& app, PolicyBenchOptions& options);
// Exit 0 when every case ran (goals are printed, not enforced).
int RunPolicyBench(const PolicyBenchOptions& options);

}  // namespace kvtier::tools

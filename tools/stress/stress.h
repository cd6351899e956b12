// `kvtier stress`: N clients (threads, each with its own kvtier::Client)
// run a mixed workload against a kvtierd for a bounded time, and every
// read is checked: a miss or byte-exact (stress_values.h). Puts (PutBatch,
// Reserve + Commit, layer-wise saves), gets, zero-copy pins, lookups,
// erases, layer-wise loads, layer-range reads and queue hints
// (stress_workload.h), over a bounded key space of prefix chains in a few
// namespaces sized so the host tier evicts to the tiers below.
//
// Against a running daemon (--socket) or a private one (--spawn: a
// kvtierd child with a small arena and an NVMe file in a temporary
// directory, and the remote tier with --redis; stopped at the end).
//
// --crash-loop N (with --spawn; stress_crash.h): N times start the daemon
// on the same NVMe file, check what survived the last kill, run the load,
// and kill -9 it at a random moment.
//
// Reports operations, blocks, misses, refusals, errors and latency
// percentiles per kind, and the violations (text; JSON with --json).
// The seed is printed: --seed reruns the same key space and choices.
// Exit status: 0 clean; 1 violations, the daemon died or could not be
// reached; 3 no violations but unexpected statuses (errors); 2 bad usage.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace kvtier::tools {

struct StressOptions {
  std::string socket_path;   // a running kvtierd; or
  bool spawn = false;        // a private one
  std::string kvtierd_path;  // default: <dir of kvtier>/../daemon/kvtierd
  std::string dir;           // the private daemon's files: a new directory under this (default $TMPDIR or /tmp)
  uint64_t arena_bytes = 16ull << 20;
  uint64_t nvme_bytes = 128ull << 20;  // 0: no NVMe tier
  uint64_t region_bytes = 2ull << 20;
  bool sync_index = false;    // nvme.sync_index
  int reinsert_percent = -1;  // nvme.reinsert_percent; < 0: the daemon's default
  std::string redis;          // host:port of a Redis (Cluster) for the remote tier; empty: none
  uint32_t clients = 4;
  double seconds = 10;
  uint64_t seed = 0;  // 0: drawn, printed
  uint32_t namespaces = 3;
  uint32_t chains = 16;
  uint32_t chain_blocks = 8;
  std::string mix;        // kind=weight,... over the defaults
  std::string json_path;  // "-": stdout
  // Crash loops (--spawn only): cycles, and the load time scale of one.
  uint32_t crash_cycles = 0;
  double cycle_seconds = 1.0;
  bool keep_host = false;  // the host tier survives each kill (stress_crash.h)
};

void AddStressOptions(CLI::App& app, StressOptions& options);
int RunStress(const StressOptions& options);

}  // namespace kvtier::tools

// `kvtier replay`: hit-rate studies of block traces through kvtier's own
// policies (docs/REPLAY.md has the semantics and the command-line contract).
//
// Exit codes: 0 done; 2 bad input (an unknown or malformed option, a bad
// capacity, a trace line that does not parse: the message names the file
// and line); 1 an output file could not be written.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "policy/option_defaults.h"

namespace kvtier::tools {

struct ReplayCliOptions {
  std::vector<std::string> traces;
  std::string format = "auto";
  uint32_t block_tokens = 512;
  std::string capacity;  // host=CAP[,nvme=CAP][,remote=CAP]
  uint64_t bytes_per_token = 0;
  std::vector<std::string> policies = {"lru"};
  std::string admission = "all";
  // The remote tier's admission per node (kvtierd's remote.admission and
  // remote.write_rate). remote_admission_given: either option was on the
  // command line; the reports then carry the remote admission's fields,
  // and without them they are as they were before the options existed.
  std::string remote_admission = "all";  // all | second_hit | rate
  std::string remote_write_rate;         // bytes/s, e.g. 4GiB; empty: 4 GiB (rate only)
  bool remote_admission_given = false;
  // The NVMe log and the engine's queue-driven moves (kvtierd's nvme.* and
  // engine.* options of the same names).
  std::string nvme_eviction;  // empty: each run's policy
  std::string nvme_region;    // bytes, e.g. 64MiB; empty: 64 MiB or a 16th of the device
  int reinsert_percent = defaults::kNvmeReinsertPercent;
  int prefetch_percent = defaults::kPrefetchPercent;
  uint32_t prefetch_min_blocks = defaults::kPrefetchMinBlocks;
  uint64_t lookahead_ms = defaults::kLookaheadMs;
  // DWPD (with --admission dwpd): the drive's bytes (default: the NVMe
  // tier's capacity in bytes), its rating, and the share kvtier may use.
  std::string drive_bytes;
  double dwpd = defaults::kDwpd;
  double dwpd_share = defaults::kDwpdShare;
  double warranty_years = defaults::kDwpdWarrantyYears;
  double planned_years = defaults::kDwpdPlannedYears;
  double warmup = 0;
  uint32_t engines = 0;         // the engine model: off at 0
  double prefill_tps = 0;       // tokens/s per engine
  std::string read_bandwidth;   // host=BW,nvme=BW,remote=BW (bytes/s, e.g. 20GB)
  std::string write_bandwidth;  // the same for demotions into a tier
  // Several nodes sharing the remote tier (replay_sim.h, Router): host and
  // NVMe capacities are per node. nodes_given: --nodes was on the command
  // line; the reports then carry the node fields (for N=1 too), and
  // without it they are as they were before the option existed.
  uint32_t nodes = 1;
  bool nodes_given = false;
  std::string router = "prefix_affinity";  // round_robin | prefix_affinity
  uint32_t affinity_blocks = 1;            // prefix_affinity: the leading blocks hashed
  // kv_aware (replay_router.h): its KV events' delay and loss rate, the
  // loss's seed; and the engine model's fetch (serial | overlap; empty:
  // overlap for kv_aware, serial otherwise). Given kv_aware or --kv-fetch,
  // the reports carry the fetch model, the event figures and TTFT p50/p99
  // in the printed table; without them they are as before the options.
  double event_delay_ms = 10;
  double event_loss = 0;
  uint64_t event_seed = 1;
  std::string kv_fetch;
  // The peer tier (ReplayOptions::peer; several nodes): off unless
  // --peer; its bandwidth is --read-bandwidth's peer= entry. Given
  // --peer, the reports carry the peer tier's fields and columns; without
  // it they are as before the option.
  bool peer = false;
  uint64_t peer_rtt_us = 50;
  bool peer_rtt_given = false;
  std::string sweep;     // CAP,CAP,... (host capacities)
  unsigned threads = 0;  // sweep threads; 0: one per core
  std::string json_path;
  std::string csv_path;
  std::string plot_path;
  bool live = false;        // drive a running kvtierd (replay_live.h)
  std::string socket_path;  // live: the daemon's socket
};

void AddReplayOptions(CLI::App& app, ReplayCliOptions& options);
int RunReplay(const ReplayCliOptions& options);

}  // namespace kvtier::tools

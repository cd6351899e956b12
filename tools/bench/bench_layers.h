// `kvtier bench layers`: layer-wise load and save of one prefix through the
// client (Client::BeginLoad / LayerLoad, Client::BeginSave / LayerSave),
// each figure beside what it is judged against, measured in the same run
// (docs/POLICIES.md, docs/BENCHMARKS.md):
//
//   1. Time to the first layer (BeginLoad .. WaitLayer(0)) against time to
//      the whole prefix (.. WaitAll), zero-copy, from the host tier and from
//      the NVMe tier; t_read = whole / layers.
//   2. The share of the load time hidden by layer-wise loading behind a
//      synthetic per-layer compute (a calibrated busy loop of t_comp =
//      factor x t_read) against load-then-compute, beside what the preload
//      formula predicts (the load's PreloadPlan: 1 - stall / (L t_read)).
//   3. Layer-wise save GB/s (BeginSave, SaveLayer per layer, FinishSave)
//      and whole-prefix PutBatch GB/s, beside memcpy of the same bytes.
//
// Every trial uses fresh keys (a load promotes its blocks into the host
// tier) and erases them afterwards. A prefix is put on the NVMe tier alone
// by putting it, then putting filler blocks until every prefix block was
// evicted and Lookup reports it in the NVMe tier; the filler is erased
// before the load is timed.
//
// Unless --socket names a running daemon, the bench starts a private
// kvtierd (fork + exec, temporary config; its NVMe file in --dir,
// O_DIRECT, nvme.admission = "all", engine.eviction = "lru") and stops it
// at the end. Exit 0 on success, 1 when kvtierd cannot start or a measured
// call fails (the message says which).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace kvtier::tools {

struct LayersBenchOptions {
  // Empty: start a private kvtierd; otherwise use the daemon listening here
  // (its NVMe part runs only if that daemon has an NVMe tier).
  std::string socket_path;
  std::string kvtierd_path;              // default: <dir of kvtier>/../daemon/kvtierd
  std::string dir = "/work/main/build";  // the private daemon's NVMe file goes here
  uint64_t arena_bytes = 256ull << 20;   // private daemon's host tier
  uint64_t nvme_bytes = 4ull << 30;      // private daemon's NVMe file
  // The prefix: blocks x layers; a block is block_tokens x layers x
  // bytes_per_token_per_layer bytes, layer-major.
  uint32_t blocks = 32;
  uint32_t block_tokens = 16;
  uint32_t layers = 36;
  uint64_t bytes_per_token_per_layer = 4096;
  uint32_t trials = 5;   // per load case (medians)
  double seconds = 2.0;  // timed seconds per save op, on average over the three (at least `trials` ops each)
  std::vector<double> compute_factors = {1.5, 1.0, 0.5};  // t_comp / t_read
  bool skip_nvme = false;
  // ClientOptions::verify_checksums of the bench client: every layer a
  // load hands out is checked (--verify-checksums).
  bool verify_checksums = false;
  std::string json_path;  // empty: no JSON copy
};

void AddLayersBenchOptions(CLI::App& app, LayersBenchOptions& options);
int RunLayersBench(const LayersBenchOptions& options);

}  // namespace kvtier::tools

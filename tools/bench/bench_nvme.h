// `kvtier bench nvme`: the NVMe tier's write and read GB/s for whole blocks
// (1 MiB and 32 MiB by default) and its random-read IOPS for 64 KiB blocks,
// at queue depth 32, each beside fio (io_uring, O_DIRECT, a file of the same
// size in the same directory, same block size and depth) run in the same
// invocation, printed as a ratio. Each case runs --rounds rounds of tier
// and fio back to back, alternating which goes first, and reports medians.
//
// The tier runs in-process on a fresh file and index in --dir (removed at
// the end): the same NvmeTier, BlockDevice and staging code kvtierd uses,
// so the figures include record headers, checksums, the staging copy and
// index updates. Exit 0 on success, 1 if the tier or fio fails.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace kvtier::tools {

struct NvmeBenchOptions {
  std::string dir = ".";             // the file system under test
  uint64_t file_bytes = 2ull << 30;  // tier file and fio file, each
  std::vector<uint64_t> block_bytes = {1ull << 20, 32ull << 20};
  uint64_t random_read_bytes = 64ull << 10;
  uint32_t queue_depth = 32;
  // Tier region size; 0: nvme.region_bytes's default (64 MiB).
  uint64_t region_bytes = 0;
  uint32_t io_threads = 1;
  double seconds = 3.0;  // per case, round and side
  // Rounds per case: tier and fio back to back, alternating which runs
  // first; the medians are reported (this VM's disk swings between runs).
  uint32_t rounds = 3;
  std::string fio = "fio";
  bool skip_fio = false;
  std::string json_path;
};

void AddNvmeBenchOptions(CLI::App& app, NvmeBenchOptions& options);
int RunNvmeBench(const NvmeBenchOptions& options);

}  // namespace kvtier::tools

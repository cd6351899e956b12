// `kvtier bench restart`: what a restart costs at scale. Per block count N:
//
//   host  a private kvtierd under a descriptor store (support/fd_store.h,
//         as systemd's), its arena sized for N blocks, is filled with N
//         blocks, killed with -9 and started again: the time to serve, the
//         time until every kept block is checked and visible
//         (host.adopt.pending 0), the daemon's anonymous memory per block
//         (RssAnon filled minus empty, over N: the index and the policy;
//         the arena and the journal are shared memory), and a lookup's
//         round trip. Beside them, measured in the same run: an empty
//         daemon's time to serve, and hashing the same bytes in this
//         process (the adoption's work, on one thread).
//   nvme  (--nvme) a private kvtierd with a 16 MiB arena over an NVMe file
//         sized for N blocks is filled until its NVMe tier holds N, killed
//         with -9 and started again: the time to serve (the RocksDB index
//         reopened), nvme.recovery_loaded, anonymous memory per record,
//         and a lookup's round trip, beside an empty daemon's.
//   takeover  (--takeover) a private kvtierd (no descriptor store) filled
//         with N host blocks is replaced by `kvtierd --takeover`: the time
//         until the old one exits (the new one serves), until every block
//         is visible again, and the longest a client asking all along
//         waited between two answers (with its calls answered Unavailable).
//
// Exit 0 on success, 1 when a daemon cannot start or a step fails.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace kvtier::tools {

struct RestartBenchOptions {
  std::string kvtierd_path;  // default: the kvtierd of this build or install
  std::vector<uint64_t> blocks{100'000, 1'000'000};
  uint64_t block_bytes = 4096;
  bool nvme = false;      // also the NVMe rows
  bool takeover = false;  // also the takeover rows
  std::string dir;        // where the daemons' files go (default $TMPDIR or /tmp)
  std::string json_path;  // also write the figures here
};

void AddRestartBenchOptions(CLI::App& app, RestartBenchOptions& options);
int RunRestartBench(const RestartBenchOptions& options);

}  // namespace kvtier::tools

// `kvtier bench peer`: the peer tier's pulls between two processes on this
// machine, each beside ucx_perftest's one-sided gets (ucp_get) of the same
// size over the same transport (UCX_TLS, default tcp), in the same run, as
// a ratio (the goal: >= 0.8).
//
// ucx_perftest runs with as many gets in flight as the bench's reads
// (--in-flight for whole blocks, 256 for the prefix, whose reads are all
// issued at once).
//
// The bench starts a copy of itself as the serving node (a PeerServer over
// blocks in plain memory, the code kvtierd serves with, its source
// excepted) and reads from it with the PeerTier kvtierd reads with: the
// handshake, a probe, then each read a pin (shared by the reads of one
// block), a get into the reader's buffer and the verification of each
// layer against the checksum the server sent.
//   - Whole blocks (--block-bytes, 2 MiB and 32 MiB by default, one layer
//     each), --in-flight reads at once, for --seconds: GB/s.
//   - A prefix of --prefix-blocks blocks of --layers layers of
//     --layer-bytes (Qwen3-8B's 36 layers of 64 KiB per 16-token block by
//     default), read layer by layer as a layer-wise load does: layer 0 of
//     every block first. Time to the first layer of every block against
//     time to the whole prefix, and the prefix's GB/s beside ucx_perftest
//     at the layer size.
// Exit 0 on success, 1 when the server or a read fails.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace kvtier::tools {

struct PeerBenchOptions {
  std::string transport = "tcp";  // UCX_TLS for both ends (and ucx_perftest's)
  std::vector<uint64_t> block_bytes = {2ull << 20, 32ull << 20};
  uint32_t in_flight = 4;
  double seconds = 2;
  uint32_t layers = 36;
  uint64_t layer_bytes = 64 << 10;
  uint32_t prefix_blocks = 128;
  uint32_t rounds = 3;  // medians
  bool skip_perftest = false;
  std::string ucx_perftest = "ucx_perftest";
  std::string json_path;
  // The serving copy (internal): its port, and the shape of what it holds.
  int serve_port = 0;
};

void AddPeerBenchOptions(CLI::App& app, PeerBenchOptions& options);
int RunPeerBench(const PeerBenchOptions& options);

}  // namespace kvtier::tools

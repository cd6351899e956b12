// Lookup rate and latency of a fully cached 64-block chain with 1..N client
// threads (one Client connection each), beside redis-benchmark GET against a
// redis-server with the same number of clients, measured in the same run.
#pragma once

#include <string>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/client.h"
#include "kvtier/result.h"

namespace kvtier::tools {

struct LookupBenchConfig {
  std::string kvtier_socket;       // the daemon to measure
  NamespaceDescriptor ns;          // registered by every bench client
  size_t chain_blocks = 64;        // keys per Lookup, all committed
  std::vector<int> client_counts;  // e.g. {1, 4, 16}
  double seconds_per_case = 2.0;
  bool use_directory = true;  // ClientOptions::use_directory of the bench clients
  // redis-benchmark and the socket of a running redis-server; either empty:
  // no redis figures (`redis_missing_reason` says why).
  std::string redis_benchmark;
  std::string redis_socket;
  std::string redis_missing_reason;
};

struct LookupRow {
  int clients = 0;
  uint64_t ops = 0;
  double seconds = 0;
  double ops_per_s = 0;
  double p50_us = 0;
  double p99_us = 0;
  // redis-benchmark -t get -c clients; ran == false: `note` says why not.
  bool redis_ran = false;
  std::string redis_note;
  uint64_t redis_requests = 0;
  double redis_rps = 0;
  double redis_p50_us = -1;  // -1: not in this redis-benchmark's output
  double redis_p99_us = -1;
  double ratio() const { return redis_ran && redis_rps > 0 ? ops_per_s / redis_rps : 0; }
};

// Commits `chain_blocks` blocks (keys from a ChainHasher over fixed tokens,
// ns.BlockBytes() bytes each) through `setup`, then per client count runs
// the kvtier case and the redis case back to back, and erases the chain.
// Every Lookup must return the whole chain (else Internal). Errors from
// connecting, putting or running redis-benchmark are returned; a missing
// redis only leaves redis_ran false.
Result<std::vector<LookupRow>> RunLookupBench(Client& setup, NamespaceId ns, const LookupBenchConfig& config);

// Parses `redis-benchmark --csv` output: the "GET" row's rps, and its p50/p99
// (ms in the output, us here) when the header names them. InvalidArgument
// if no GET row is found.
Status ParseRedisBenchmarkCsv(const std::string& output, LookupRow& row);

}  // namespace kvtier::tools

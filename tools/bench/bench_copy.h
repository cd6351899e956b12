// Copy throughput of the host tier through the client, each figure beside a
// single-thread memcpy of the same block size over the same footprint,
// measured in the same run (docs/BENCHMARKS.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvtier/client.h"
#include "kvtier/result.h"

namespace kvtier::tools {

struct CopyBenchConfig {
  std::vector<uint64_t> block_bytes;  // one case per size
  // Bytes cycled over per case: floor(working_set_bytes / block) blocks
  // (at least 1) live in the arena at once, and as many caller buffers.
  uint64_t working_set_bytes = 0;
  double seconds_per_case = 2.0;  // per op (memcpy, nt copy, put, put x16, put zc, get, get x16, pin+sum) per size
  uint64_t key_salt = 0;          // makes this run's keys unique in the daemon
};

// One measured op at one block size. GB/s are 1e9 bytes per second.
struct CopyRow {
  std::string op;  // "put", "get", "pin+sum"
  uint64_t block_bytes = 0;
  uint64_t blocks = 0;  // blocks in the working set
  uint64_t ops = 0;     // blocks moved while timed
  double seconds = 0;   // time those took
  double gbps = 0;
  double memcpy_gbps = 0;  // the same-run ceiling for this size
  double ratio() const { return memcpy_gbps > 0 ? gbps / memcpy_gbps : 0; }
};

// Runs every case against `client` (namespace `ns` registered) and erases
// its blocks afterwards. What is timed:
//   memcpy   memcpy(caller buffer i -> scratch buffer i), both the size of
//            the working set, i cycling over it; one thread.
//   nt copy  the same copy with non-temporal stores, as the put writes the
//            arena: put's second ceiling (glibc's memcpy streams only above
//            its x86_non_temporal_threshold).
//   put      Client::Put(key i, caller buffer i): Reserve, copy into the
//            arena computing the checksum, Commit with it. The Erase of the
//            previous pass's keys that makes room runs outside the clock.
//   put x16  Client::PutBatch of 16 consecutive blocks (one Reserve and one
//            Commit a batch); otherwise as put.
//   put zc   Client::Reserve, memcpy into the slot, Reservation::Commit
//            without a checksum (the daemon hashes the block at Commit):
//            the zero-copy put, and the copying put before issue 12.
//   get      Client::Get(key i, caller buffer i): Pin, memcpy arena -> caller
//            buffer, Release (sent without waiting).
//   pin+sum  Client::Pin(key i), a sum of every 8-byte word of the view
//            (reads each byte once, writes nothing), BlockView::Release.
// Ops alternate in two rounds so that drift hits all of them alike. Rows
// come per size in the order nt copy, put, put x16, put zc, get, get x16,
// pin+sum. NoSpace if the arena cannot
// hold the working set; any failed call is returned as its Status.
Result<std::vector<CopyRow>> RunCopyBench(Client& client, NamespaceId ns, const CopyBenchConfig& config);

}  // namespace kvtier::tools

// The figures of a `kvtier stress` run (stress.h) and of its crash loops
// (stress_crash.h), their text table and JSON copy, and the exit status
// they make. Thread-compatible plain data.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvtier/client.h"
#include "kvtier/status.h"
#include "tools/stress/stress_tally.h"

namespace kvtier::tools {

// One kill -9 cycle: what the restart before it found, what its load did.
struct CrashCycle {
  uint32_t cycle = 0;
  double start_ms = 0;  // kvtierd start until Hello answered
  // What the NVMe tier's Open reported (Stats: nvme.recovery_*), and the
  // index failures counted since.
  int64_t recovery_loaded = 0;
  int64_t recovery_dropped_stale = 0;
  int64_t recovery_dropped_corrupt = 0;
  // After the restart, over the whole key space: Lookup said NVMe, and
  // reads that came back byte-exact.
  uint64_t nvme_resident = 0;
  uint64_t verified = 0;  // distinct blocks
  // The blocks the checkpoint before the last kill acknowledged as durable
  // (Lookup: NVMe, with no demotion in flight): found byte-exact, or
  // missing. `strict`: the kill followed the checkpoint with no load
  // between, so a missing one is a lost acknowledged block (a violation).
  bool strict = false;
  uint64_t acked = 0;
  uint64_t acked_survived = 0;
  uint64_t acked_missing = 0;
  uint64_t acked_missing_erased = 0;       // of those, erased by the load after the checkpoint
  int64_t reclaims_at_checkpoint = -1;     // NVMe regions reclaimed by then since that daemon started
  int64_t nvme_blocks_at_checkpoint = -1;  // the NVMe tier's blocks then (Stats nvme.blocks); -1: no checkpoint
  double load_ms = 0;                      // load before the kill, both phases
  uint64_t ops = 0;                        // operations of this cycle's load
  uint64_t violations = 0;                 // of this cycle's verification (the load's are in the tally)
  // --keep-host: the blocks Lookup placed in the host tier at the
  // checkpoint, and how many were host hits again after the restart; the
  // restart's adoption (Stats host.adopt.*).
  uint64_t host_acked = 0;
  uint64_t host_survived = 0;
  int64_t host_adopted = 0;
  int64_t host_adopt_corrupt = 0;
};

struct CrashLoopReport {
  std::vector<CrashCycle> cycles;  // the last one is the final clean start (not killed)
  uint64_t blocks_verified = 0;
  uint64_t acked = 0;
  uint64_t acked_survived = 0;
  // Acknowledged, missing after a kill under load (reported missing, never
  // wrong): the load erased them after the checkpoint, or the NVMe tier
  // reclaimed their region (or they were lost: the loop cannot tell those
  // two apart once load ran after the checkpoint).
  uint64_t lost_but_reported = 0;
  uint64_t lost_erased_by_load = 0;
  uint64_t durability_violations = 0;  // lost after a strict checkpoint, or an index that lost entries
  uint64_t repairs = 0;                // restarts whose recovery dropped entries (stale or corrupt)
  // --keep-host: blocks in the host tier at a checkpoint, host hits after
  // the restart, missing after a lenient one (load ran after the
  // checkpoint: evicted or erased meanwhile), and missing after a strict
  // one (a violation); kept blocks whose bytes failed their check.
  bool keep_host = false;
  uint64_t host_acked = 0;
  uint64_t host_survived = 0;
  uint64_t host_lost_but_reported = 0;
  uint64_t host_violations = 0;
  int64_t host_adopt_corrupt = 0;
  uint64_t verify_violations = 0;
  uint64_t verify_errors = 0;
  uint64_t verify_refused = 0;        // reads after a restart answered NoSpace or Busy (not checked)
  std::vector<std::string> problems;  // one line each
  double seconds = 0;
};

struct StressReport {
  uint64_t seed = 0;
  uint32_t clients = 0;
  double seconds = 0;  // of load, measured
  std::string daemon;  // what it ran against
  std::string key_space;
  std::string mix;
  StressTally tally;
  bool daemon_died = false;
  std::string daemon_problem;            // why, or how the private daemon ended
  std::vector<Counter> daemon_counters;  // a few of note, read at the end
  bool crash_loop = false;
  CrashLoopReport crash;
};

// 0 clean; 1 violations, the daemon died or a crash loop found a
// problem; 3 unexpected statuses only.
int StressExitCode(const StressReport& report);
void PrintStressReport(const StressReport& report);
// `path` "-" writes to stdout. IoError if it cannot be written.
Status WriteStressJson(const std::string& path, const StressReport& report);

}  // namespace kvtier::tools

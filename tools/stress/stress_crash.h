// `kvtier stress --crash-loop N` (stress.h): N cycles of
//
//   1. start kvtierd on the same NVMe file and index (a private daemon);
//   2. read what its NVMe tier's recovery did (Stats nvme.recovery_*: a
//      recovery that dropped entries, stale or corrupt, is a "repair");
//   3. verify: every block the last checkpoint acknowledged as durable is
//      there (Lookup, before any read moves blocks) or is missing (missing
//      after a strict checkpoint, or an index with fewer entries than then,
//      is a lost acknowledged block), and every block of the key space
//      reads back as a miss or byte-exact;
//   4. stress load (stress_workload.h) for a random time, then a
//      checkpoint: the load pauses, the daemon settles (no demotion or
//      promotion in flight, NVMe counters still), and the blocks Lookup
//      reports in the NVMe tier are acknowledged as durable (their index
//      entries are written before the tier shows them); with probability
//      1/3 the kill follows at once (strict), else the load resumes for a
//      random time;
//   5. kill -9.
//
// With --keep-host kvtierd runs under a descriptor store (support/
// fd_store.h, as systemd's), so its host tier survives each kill: the
// checkpoint also notes the blocks Lookup places in the host tier, and
// after the restart has adopted the kept arena (host.adopt.pending 0) each
// must be a host hit again (after a strict checkpoint; missing after a
// lenient one is counted, not a violation), and no kept block may fail
// its check.
//
// Then one last start, verification and clean stop. "Acknowledged
// durable" is what the client API can observe: there is no per-block
// flush or sync call. It holds for process crashes (the index's log is in
// the page cache); for power loss the daemon needs nvme.sync_index
// (--sync-index), which this loop does not simulate.
#pragma once

#include <string>

#include "tools/stress/stress.h"
#include "tools/stress/stress_report.h"
#include "tools/stress/stress_values.h"
#include "tools/stress/stress_workload.h"

namespace kvtier::tools {

// Runs the loop with `kvtierd` on `dir` (its config gets `extra_toml`: the
// NVMe tier). Fills report.crash and report.tally. Returns 0 (the report
// says how it went), 1 when the first start fails.
int RunCrashLoop(const StressOptions& options, const KeySpace& space, const WorkloadMix& mix,
                 const std::string& kvtierd, const std::string& dir, const std::string& extra_toml,
                 StressReport& report);

}  // namespace kvtier::tools

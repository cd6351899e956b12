// What the operations of a StressWorker (stress_workload.h) share across
// its files (stress_workload.cc, stress_writes.cc, stress_reads.cc): the
// clock they time themselves with, and which statuses are refusals.
// Private to tools/stress.
#pragma once

#include <chrono>
#include <cstdint>

#include "kvtier/status.h"

namespace kvtier::tools::stress_ops {

using Clock = std::chrono::steady_clock;

inline uint64_t NsSince(Clock::time_point t0) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
}

// NoSpace, Busy, AlreadyExists: the daemon declined, nothing is wrong.
inline bool IsRefusal(StatusCode code) {
  return code == StatusCode::kNoSpace || code == StatusCode::kBusy || code == StatusCode::kAlreadyExists;
}

}  // namespace kvtier::tools::stress_ops

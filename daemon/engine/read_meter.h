// ReadMeter: the read bandwidth a tier delivers while it is busy, and the
// reads queued on it now. A tier's bandwidth is bytes over the time it had
// a read in flight, not each read's own rate (reads in flight together
// each take longer than the tier's rate says): one sample per busy period,
// taken when the tier goes idle or every kSampleBytes of a long one, into
// a BandwidthEstimate (policy/prefetch_planner.h) whose mean the
// prefetcher and whose low percentile the preload planner and the ready
// estimate (ready_estimator.h) use. The reads started and not yet ended,
// with the bytes they asked for (`in_flight`), are what a new read of the
// tier waits behind.
//
// Every read Started calls Ended once, with the bytes it was started with
// and those it read (0: it failed). Thread-safe: one mutex, a leaf.
#pragma once

#include <cstdint>

#include "common/mutex.h"
#include "policy/prefetch_planner.h"

namespace kvtier {

class ReadMeter {
 public:
  static constexpr uint64_t kSampleBytes = 64ull << 20;
  // The estimate until the first sample.
  explicit ReadMeter(double initial_bytes_per_s) : estimate_(initial_bytes_per_s) {}

  // A read of `bytes` was handed to the tier at `now_us`.
  void Started(uint64_t bytes, uint64_t now_us) EXCLUDES(mu_);
  // A read Started with `started_bytes` ended at `now_us` having read
  // `read_bytes` (0: it failed).
  void Ended(uint64_t started_bytes, uint64_t read_bytes, uint64_t now_us) EXCLUDES(mu_);
  // The estimate now (a copy).
  BandwidthEstimate estimate() const EXCLUDES(mu_);
  // Reads started and not ended, and the bytes they were started with.
  struct InFlight {
    int64_t reads = 0;
    uint64_t bytes = 0;
  };
  InFlight in_flight() const EXCLUDES(mu_);
  // When the latest sample was taken, and whether there was one.
  uint64_t last_sample_us() const EXCLUDES(mu_);
  bool sampled() const EXCLUDES(mu_);

 private:
  mutable Mutex mu_;
  BandwidthEstimate estimate_ GUARDED_BY(mu_);
  int64_t reads_in_flight_ GUARDED_BY(mu_) = 0;
  uint64_t bytes_in_flight_ GUARDED_BY(mu_) = 0;  // as the reads in flight were started with
  uint64_t busy_since_us_ GUARDED_BY(mu_) = 0;    // the busy period's start (or last sample)
  uint64_t busy_bytes_ GUARDED_BY(mu_) = 0;       // read since then
  uint64_t last_sample_us_ GUARDED_BY(mu_) = 0;
  bool sampled_ GUARDED_BY(mu_) = false;
};

}  // namespace kvtier

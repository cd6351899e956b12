// LogRateLimiter: keeps a log line that a peer or a library can trigger at
// will (a failing accept, a library's complaint about a bad message) from
// filling the disk. At most `lines_per_period` lines pass per period; the
// first line let through after some were held back says how many.
//
// Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>

#include "common/mutex.h"

namespace kvtier {

class LogRateLimiter {
 public:
  using Clock = std::chrono::steady_clock;

  LogRateLimiter(uint32_t lines_per_period, std::chrono::milliseconds period)
      : lines_per_period_(lines_per_period), period_(period) {}

  // Whether a line may be written at `now`. When true, `suppressed` is the
  // number of lines refused since the last one allowed (0: none), to be
  // mentioned in this one.
  bool Allow(Clock::time_point now, uint64_t& suppressed) EXCLUDES(mu_);
  bool Allow(uint64_t& suppressed) { return Allow(Clock::now(), suppressed); }

  // Lines refused so far in all.
  uint64_t total_suppressed() const EXCLUDES(mu_);

 private:
  const uint32_t lines_per_period_;
  const std::chrono::milliseconds period_;
  mutable Mutex mu_;
  Clock::time_point period_start_ GUARDED_BY(mu_){};
  uint32_t lines_in_period_ GUARDED_BY(mu_) = 0;
  uint64_t suppressed_since_line_ GUARDED_BY(mu_) = 0;
  uint64_t total_suppressed_ GUARDED_BY(mu_) = 0;
};

}  // namespace kvtier

#include "common/log_rate_limiter.h"

namespace kvtier {

bool LogRateLimiter::Allow(Clock::time_point now, uint64_t& suppressed) {
  MutexLock lock(mu_);
  if (lines_in_period_ == 0 || now - period_start_ >= period_) {
    period_start_ = now;
    lines_in_period_ = 0;
  }
  if (lines_in_period_ >= lines_per_period_) {
    ++suppressed_since_line_;
    ++total_suppressed_;
    return false;
  }
  ++lines_in_period_;
  suppressed = suppressed_since_line_;
  suppressed_since_line_ = 0;
  return true;
}

uint64_t LogRateLimiter::total_suppressed() const {
  MutexLock lock(mu_);
  return total_suppressed_;
}

}  // namespace kvtier

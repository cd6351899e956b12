#include "common/clock.h"

#include <algorithm>

namespace kvtier {
namespace {

// The longest one steady-clock sleep of WaitUntilUs (it may return early;
// its callers loop), so that far times do not overflow the steady clock.
constexpr uint64_t kMaxSleepUs = uint64_t{3600} * 1'000'000;

}  // namespace

void Clock::WaitUntilUs(Mutex& mu, CondVar& cv, uint64_t when_us) const {
  const uint64_t now = NowUs();
  if (now >= when_us) return;
  cv.WaitFor(mu, std::chrono::microseconds(std::min(when_us - now, kMaxSleepUs)));
}

void SleepUntilUs(const Clock& clock, uint64_t when_us) {
  Mutex mu;
  CondVar cv;  // nobody notifies it: only the clock wakes this wait
  MutexLock lock(mu);
  while (clock.NowUs() < when_us) clock.WaitUntilUs(mu, cv, when_us);
}

}  // namespace kvtier

// Clock: the injected source of time. Policies take time as an argument;
// components that need "now" hold a Clock& (tests pass a FakeClock), and
// those that wait for a time wait through it (WaitUntilUs), so a test
// that moves a fake clock wakes them.
#pragma once

#include <chrono>
#include <cstdint>

#include "common/mutex.h"

namespace kvtier {

// Thread-safe: every method may be called from any thread.
class Clock {
 public:
  virtual ~Clock() = default;
  // Monotonic microseconds since an arbitrary epoch.
  virtual uint64_t NowUs() const = 0;

  // Sleeps on `cv` until it is notified or this clock reaches `when_us`,
  // giving `mu` back while it sleeps (possibly more than once) and holding
  // it again when it returns. It may also return early (spuriously), so
  // callers wait in a loop over their condition and NowUs(). Whoever
  // changes that condition does so under `mu` and notifies `cv`.
  // The default sleeps on the steady clock for when_us - NowUs(): right
  // for a clock that moves with real time. One that moves otherwise (a
  // test's FakeClock) wakes its waiters itself when it moves.
  virtual void WaitUntilUs(Mutex& mu, CondVar& cv, uint64_t when_us) const REQUIRES(mu);
};

// The steady clock of the process.
class SystemClock final : public Clock {
 public:
  uint64_t NowUs() const override {
    return static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
            .count());
  }
};

// Blocks the calling thread until `clock` reaches `when_us` (through
// Clock::WaitUntilUs: a fake clock's test moves it on).
void SleepUntilUs(const Clock& clock, uint64_t when_us);

}  // namespace kvtier

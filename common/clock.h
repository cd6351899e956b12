// Clock: the injected source of time. Policies take time as an argument;
// components that need "now" hold a Clock& (tests pass a FakeClock).
#pragma once

#include <chrono>
#include <cstdint>

namespace kvtier {

// Thread-safe: NowUs may be called from any thread.
class Clock {
 public:
  virtual ~Clock() = default;
  // Monotonic microseconds since an arbitrary epoch.
  virtual uint64_t NowUs() const = 0;
};

// The steady clock of the process.
class SystemClock final : public Clock {
 public:
  uint64_t NowUs() const override {
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                     std::chrono::steady_clock::now().time_since_epoch())
                                     .count());
  }
};

}  // namespace kvtier

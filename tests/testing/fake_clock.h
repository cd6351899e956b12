// A Clock that moves only when told to. Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>

#include "common/clock.h"

namespace kvtier::testing {

class FakeClock final : public Clock {
 public:
  explicit FakeClock(uint64_t start_us = 1'000'000) : now_us_(start_us) {}
  uint64_t NowUs() const override { return now_us_.load(std::memory_order_relaxed); }
  void AdvanceUs(uint64_t us) { now_us_.fetch_add(us, std::memory_order_relaxed); }
  void SetUs(uint64_t us) { now_us_.store(us, std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> now_us_;
};

}  // namespace kvtier::testing

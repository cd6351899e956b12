// SeededNumbers: a small deterministic generator for test traces (a 64-bit
// linear congruential step, the high 31 bits out), the same sequence for
// the same seed on every platform and standard library, so a trace a test
// builds from it, and the figures the test checks, never change under it.
#pragma once

#include <cstdint>

namespace kvtier::testing {

class SeededNumbers {
 public:
  explicit SeededNumbers(uint64_t seed) : state_(seed) {}
  // The next number, in [0, 2^31).
  uint64_t Next() {
    state_ = state_ * 6364136223846793005ull + 1442695040888963407ull;
    return state_ >> 33;
  }

 private:
  uint64_t state_;
};

}  // namespace kvtier::testing

// LatencyHistogram: a lock-free latency distribution with fixed
// power-of-two buckets, 1 us .. ~8.4 s (bucket i counts observations
// <= 2^i us; one more counts the rest). Record is two relaxed atomic adds
// and a bit scan: cheap enough for every tier operation. Snapshot reads
// each word once; counts taken while others record may be off by the
// observations in flight, never torn.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>

namespace kvtier {

inline constexpr size_t kHistogramBuckets = 24;  // upper bounds 2^0 .. 2^23 us

struct HistogramSnapshot {
  // counts[i]: observations <= bound_us(i), not cumulative; overflow: above
  // the last bound.
  std::array<uint64_t, kHistogramBuckets> counts{};
  uint64_t overflow = 0;
  uint64_t count = 0;   // every observation
  uint64_t sum_ns = 0;  // of every observation
  static constexpr uint64_t bound_us(size_t i) { return uint64_t{1} << i; }
};

class LatencyHistogram {
 public:
  void Record(std::chrono::nanoseconds latency);
  HistogramSnapshot Snapshot() const;

 private:
  std::array<std::atomic<uint64_t>, kHistogramBuckets> counts_{};
  std::atomic<uint64_t> overflow_{0};
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> sum_ns_{0};
};

}  // namespace kvtier

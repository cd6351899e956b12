#include "common/histogram.h"

#include <bit>

namespace kvtier {

void LatencyHistogram::Record(std::chrono::nanoseconds latency) {
  const uint64_t ns = latency.count() > 0 ? static_cast<uint64_t>(latency.count()) : 0;
  // The smallest i with ns <= 2^i us: ceil(log2(ceil(ns / 1000))).
  const uint64_t us = (ns + 999) / 1000;
  const size_t bucket = us <= 1 ? 0 : static_cast<size_t>(std::bit_width(us - 1));
  if (bucket < kHistogramBuckets) {
    counts_[bucket].fetch_add(1, std::memory_order_relaxed);
  } else {
    overflow_.fetch_add(1, std::memory_order_relaxed);
  }
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(ns, std::memory_order_relaxed);
}

HistogramSnapshot LatencyHistogram::Snapshot() const {
  HistogramSnapshot s;
  for (size_t i = 0; i < kHistogramBuckets; ++i) s.counts[i] = counts_[i].load(std::memory_order_relaxed);
  s.overflow = overflow_.load(std::memory_order_relaxed);
  s.sum_ns = sum_ns_.load(std::memory_order_relaxed);
  // The total from the buckets read, so that the buckets add up to it.
  s.count = s.overflow;
  for (uint64_t c : s.counts) s.count += c;
  return s;
}

}  // namespace kvtier

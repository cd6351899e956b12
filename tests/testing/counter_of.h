// CounterOf: one counter's value from anything that reports counters
// (VisitCounters(CounterVisitor&) const: the cluster client, a tier, the
// engine), for tests that check a count.
#pragma once

#include <cstdint>
#include <string_view>

#include <gtest/gtest.h>

#include "common/counters.h"

namespace kvtier::testing {

// The value `source` reports for `name`; fails the test and returns -1
// when it reports no such counter.
template <typename Source>
int64_t CounterOf(const Source& source, std::string_view name) {
  CounterCollector collector;
  source.VisitCounters(collector);
  for (const auto& [n, value] : collector.counters()) {
    if (n == name) return value;
  }
  ADD_FAILURE() << "no counter " << name;
  return -1;
}

}  // namespace kvtier::testing

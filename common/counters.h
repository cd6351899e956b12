// One visitor for every counter: the Stats request, `kvtier stats` and the
// benchmarks all read the same numbers through it. Each component implements
//   void VisitCounters(CounterVisitor& v) const;
// and reports its counters with a dotted, component-prefixed name.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvtier {

class CounterVisitor {
 public:
  virtual ~CounterVisitor() = default;
  virtual void Visit(std::string_view name, int64_t value) = 0;
};

// Collects every visited counter, in visit order.
class CounterCollector final : public CounterVisitor {
 public:
  void Visit(std::string_view name, int64_t value) override {
    counters_.emplace_back(std::string(name), value);
  }
  const std::vector<std::pair<std::string, int64_t>>& counters() const { return counters_; }

 private:
  std::vector<std::pair<std::string, int64_t>> counters_;
};

}  // namespace kvtier

// The one counter registry: the Stats request, `kvtier stats`, the
// Prometheus endpoint (daemon/metrics_*) and the benchmarks all read the
// same numbers through one visitor. Each component implements
//   void VisitCounters(CounterVisitor& v) const;
// and reports with a dotted, component-prefixed name ("nvme.reads").
//
// Kinds: Visit reports a counter (a count of events since start; only
// grows), VisitGauge a level that goes up and down (bytes in use, blocks
// held), VisitHistogram a distribution (latency). A name may end in
// Prometheus-style labels, `tier.hits{tier="nvme"}`: label values are valid
// UTF-8, escaped as the Prometheus text format requires (a value from a
// client goes through PrometheusLabelValue, common/utf8.h). Visitors that only want
// numbers (the Stats request) keep every kind through Visit.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/histogram.h"

namespace kvtier {

class CounterVisitor {
 public:
  virtual ~CounterVisitor() = default;
  virtual void Visit(std::string_view name, int64_t value) = 0;
  virtual void VisitGauge(std::string_view name, int64_t value) { Visit(name, value); }
  // Default: the histogram as numbers: <family>_count and <family>_sum_us
  // (labels kept).
  virtual void VisitHistogram(std::string_view name, const HistogramSnapshot& h);
};

// Collects every visited counter and gauge (histograms as numbers), in
// visit order.
class CounterCollector final : public CounterVisitor {
 public:
  void Visit(std::string_view name, int64_t value) override { counters_.emplace_back(std::string(name), value); }
  const std::vector<std::pair<std::string, int64_t>>& counters() const { return counters_; }

 private:
  std::vector<std::pair<std::string, int64_t>> counters_;
};

// Forwards every visit to `inner` with one more label on each name:
// "x" -> "x{tenant=\"a\"}", "x{tier=\"nvme\"}" -> "x{tier=\"nvme\",tenant=\"a\"}".
// `label` is `key="value"` (the value already escaped); both borrowed.
class LabellingVisitor final : public CounterVisitor {
 public:
  LabellingVisitor(CounterVisitor& inner, std::string_view label) : inner_(inner), label_(label) {}
  void Visit(std::string_view name, int64_t value) override { inner_.Visit(Labelled(name), value); }
  void VisitGauge(std::string_view name, int64_t value) override { inner_.VisitGauge(Labelled(name), value); }
  void VisitHistogram(std::string_view name, const HistogramSnapshot& h) override {
    inner_.VisitHistogram(Labelled(name), h);
  }

 private:
  std::string Labelled(std::string_view name) const;
  CounterVisitor& inner_;
  std::string_view label_;
};

// "family{labels}" split at the brace: {"family", "{labels}"} (labels empty
// when there are none).
std::pair<std::string_view, std::string_view> SplitMetricLabels(std::string_view name);

}  // namespace kvtier

// Which series a scrape of the metrics endpoint may see (docs/OPERATIONS.md,
// "Metrics"). A series is *daemon-wide* when every label it carries is one
// of those that describe the daemon rather than a client: `tier`, `reason`,
// `class`, `version` (or it has none). Every other label (`tenant`, `ns`,
// `model`, `revision`, `adapter`, and any added later) makes it a
// *client* series: it names a tenant or a namespace, or carries text a
// client chose. Allow-listed, so a label nobody reviewed stays hidden.
//
// Pure functions and a forwarding visitor; thread-compatible.
#pragma once

#include <string_view>

#include "common/counters.h"

namespace kvtier {

// What one scrape is shown.
enum class MetricsView {
  kAll,         // every series
  kDaemonWide,  // daemon-wide series only
};

// Whether the registry name `name` ("family" or "family{k=\"v\",...}") is
// daemon-wide. A label list that does not parse counts as a client series.
bool IsDaemonWideSeries(std::string_view name);

// Forwards to `inner` (borrowed) only the daemon-wide series.
class DaemonWideVisitor final : public CounterVisitor {
 public:
  explicit DaemonWideVisitor(CounterVisitor& inner) : inner_(inner) {}
  void Visit(std::string_view name, int64_t value) override {
    if (IsDaemonWideSeries(name)) inner_.Visit(name, value);
  }
  void VisitGauge(std::string_view name, int64_t value) override {
    if (IsDaemonWideSeries(name)) inner_.VisitGauge(name, value);
  }
  void VisitHistogram(std::string_view name, const HistogramSnapshot& h) override {
    if (IsDaemonWideSeries(name)) inner_.VisitHistogram(name, h);
  }

 private:
  CounterVisitor& inner_;
};

}  // namespace kvtier

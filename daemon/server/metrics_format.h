// The Prometheus text exposition format (version 0.0.4) of the counter
// registry (common/counters.h). Each registry name maps to a family:
//   "nvme.reads"                     -> kvtier_nvme_reads_total (counter)
//   "tier.used_bytes{tier=\"nvme\"}" -> kvtier_tier_used_bytes{tier="nvme"} (gauge)
//   "tier.read_seconds{tier=...}"    -> kvtier_tier_read_seconds_bucket{...,le=...},
//                                       _sum (seconds), _count (histogram)
// i.e. "kvtier_" + the name with every character outside [A-Za-z0-9_:]
// turned into '_', "_total" after counters, the labels kept. Samples of a
// family are written together, families in the order first visited, each
// with # HELP (the registry name) and # TYPE. A sample visited twice (same
// family and labels) is written once, the first value.
#pragma once

#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/counters.h"

namespace kvtier {

class PrometheusWriter final : public CounterVisitor {
 public:
  void Visit(std::string_view name, int64_t value) override;
  void VisitGauge(std::string_view name, int64_t value) override;
  void VisitHistogram(std::string_view name, const HistogramSnapshot& h) override;

  // The exposition: every family visited so far.
  std::string Text() const;

 private:
  struct Family {
    std::string help;  // the registry name of its first sample, labels cut
    std::string type;  // counter | gauge | histogram
    std::vector<std::string> lines;
  };
  // The family for `name` of `type` (created on first sight), or null when
  // the same family was already visited as another type (the sample is
  // dropped: an exposition may not mix them).
  Family* FamilyFor(std::string_view registry_family, const std::string& metric, const std::string& type);
  bool FirstSample(const std::string& metric, std::string_view labels);

  std::vector<std::string> order_;
  std::map<std::string, Family> families_;
  std::set<std::string> samples_;
};

// "kvtier_" + `registry_family` sanitized (see above), without suffix.
std::string PrometheusName(std::string_view registry_family);

}  // namespace kvtier

#include "common/counters.h"

namespace kvtier {

std::pair<std::string_view, std::string_view> SplitMetricLabels(std::string_view name) {
  const size_t brace = name.find('{');
  if (brace == std::string_view::npos) return {name, {}};
  return {name.substr(0, brace), name.substr(brace)};
}

std::string LabellingVisitor::Labelled(std::string_view name) const {
  const auto [family, labels] = SplitMetricLabels(name);
  if (labels.size() < 2) return std::string(family) + "{" + std::string(label_) + "}";
  return std::string(family) + std::string(labels.substr(0, labels.size() - 1)) + "," + std::string(label_) + "}";
}

void CounterVisitor::VisitHistogram(std::string_view name, const HistogramSnapshot& h) {
  const auto [family, labels] = SplitMetricLabels(name);
  Visit(std::string(family) + "_count" + std::string(labels), static_cast<int64_t>(h.count));
  Visit(std::string(family) + "_sum_us" + std::string(labels), static_cast<int64_t>(h.sum_ns / 1000));
}

}  // namespace kvtier

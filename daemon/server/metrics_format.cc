#include "daemon/server/metrics_format.h"

#include <cstdio>

namespace kvtier {
namespace {

// `labels` ("{a=\"b\"}" or empty) with one more label appended.
std::string WithLabel(std::string_view labels, std::string_view label) {
  if (labels.empty()) return "{" + std::string(label) + "}";
  std::string out(labels.substr(0, labels.size() - 1));
  if (out.size() > 1) out += ",";
  return out + std::string(label) + "}";
}

std::string Seconds(double seconds) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.9g", seconds);
  return buffer;
}

}  // namespace

std::string PrometheusName(std::string_view registry_family) {
  std::string out = "kvtier_";
  for (char c : registry_family) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == ':';
    out += ok ? c : '_';
  }
  return out;
}

PrometheusWriter::Family* PrometheusWriter::FamilyFor(std::string_view registry_family, const std::string& metric,
                                                      const std::string& type) {
  auto [it, inserted] = families_.try_emplace(metric);
  if (inserted) {
    it->second.help = std::string(registry_family);
    it->second.type = type;
    order_.push_back(metric);
  }
  return it->second.type == type ? &it->second : nullptr;
}

bool PrometheusWriter::FirstSample(const std::string& metric, std::string_view labels) {
  return samples_.insert(metric + std::string(labels)).second;
}

void PrometheusWriter::Visit(std::string_view name, int64_t value) {
  const auto [family, labels] = SplitMetricLabels(name);
  std::string metric = PrometheusName(family);
  if (!metric.ends_with("_total")) metric += "_total";
  Family* f = FamilyFor(family, metric, "counter");
  if (f == nullptr || !FirstSample(metric, labels)) return;
  f->lines.push_back(metric + std::string(labels) + " " + std::to_string(value));
}

void PrometheusWriter::VisitGauge(std::string_view name, int64_t value) {
  const auto [family, labels] = SplitMetricLabels(name);
  const std::string metric = PrometheusName(family);
  Family* f = FamilyFor(family, metric, "gauge");
  if (f == nullptr || !FirstSample(metric, labels)) return;
  f->lines.push_back(metric + std::string(labels) + " " + std::to_string(value));
}

void PrometheusWriter::VisitHistogram(std::string_view name, const HistogramSnapshot& h) {
  const auto [family, labels] = SplitMetricLabels(name);
  const std::string metric = PrometheusName(family);
  Family* f = FamilyFor(family, metric, "histogram");
  if (f == nullptr || !FirstSample(metric, labels)) return;
  uint64_t cumulative = 0;
  for (size_t i = 0; i < kHistogramBuckets; ++i) {
    cumulative += h.counts[i];
    const std::string le = "le=\"" + Seconds(static_cast<double>(HistogramSnapshot::bound_us(i)) * 1e-6) + "\"";
    f->lines.push_back(metric + "_bucket" + WithLabel(labels, le) + " " + std::to_string(cumulative));
  }
  f->lines.push_back(metric + "_bucket" + WithLabel(labels, "le=\"+Inf\"") + " " + std::to_string(h.count));
  f->lines.push_back(metric + "_sum" + std::string(labels) + " " + Seconds(static_cast<double>(h.sum_ns) * 1e-9));
  f->lines.push_back(metric + "_count" + std::string(labels) + " " + std::to_string(h.count));
}

std::string PrometheusWriter::Text() const {
  std::string out;
  for (const std::string& metric : order_) {
    const Family& f = families_.at(metric);
    out += "# HELP " + metric + " kvtier registry name " + f.help + " (docs/OPERATIONS.md)\n";
    out += "# TYPE " + metric + " " + f.type + "\n";
    for (const std::string& line : f.lines) out += line + "\n";
  }
  return out;
}

}  // namespace kvtier

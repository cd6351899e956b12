#include "daemon/server/metrics_scope.h"

namespace kvtier {
namespace {

bool DaemonWideLabel(std::string_view key) {
  return key == "tier" || key == "reason" || key == "class" || key == "version";
}

}  // namespace

bool IsDaemonWideSeries(std::string_view name) {
  std::string_view labels = SplitMetricLabels(name).second;
  if (labels.empty()) return true;
  if (labels.size() < 2 || labels.back() != '}') return false;
  labels = labels.substr(1, labels.size() - 2);  // k="v",k="v"
  size_t at = 0;
  while (at < labels.size()) {
    const size_t equals = labels.find('=', at);
    if (equals == std::string_view::npos || equals + 1 >= labels.size() || labels[equals + 1] != '"') return false;
    if (!DaemonWideLabel(labels.substr(at, equals - at))) return false;
    size_t i = equals + 2;  // inside the value: up to its unescaped closing quote
    while (i < labels.size() && labels[i] != '"') i += labels[i] == '\\' ? 2 : 1;
    if (i >= labels.size()) return false;
    at = i + 1;
    if (at < labels.size()) {
      if (labels[at] != ',') return false;
      ++at;
    }
  }
  return true;
}

}  // namespace kvtier

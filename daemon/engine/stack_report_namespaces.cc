// StackReport's namespace reports (stack_report.h): where each
// namespace's blocks are (`kvtier ls`) and its bytes per tier as gauges.
#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "common/utf8.h"
#include "daemon/engine/stack_report.h"

namespace kvtier {
namespace {

// A descriptor string as a label value: at most 128 bytes, cut on a
// character boundary, escaped as the Prometheus text format requires.
std::string PlainLabelValue(std::string_view text) { return PrometheusLabelValue(text, 128); }

}  // namespace

std::vector<const BlockTier*> StackReport::StackTop() const {
  std::vector<const BlockTier*> tiers;
  if (stack_.above != nullptr) tiers.push_back(stack_.above->source().tier);
  tiers.push_back(&stack_.host);
  for (const auto& b : stack_.below) tiers.push_back(b->tier);
  return tiers;
}

void StackReport::ForEachHeldBlock(const HeldBlockVisitor& visit) const {
  auto walk = [&visit](const BlockTier& tier, Tier reported) {
    tier.ForEachBlock([&](const BlockKey& key, const BlockTier::BlockInfo& info) { visit(reported, key, info); });
  };
  if (stack_.above != nullptr) walk(*stack_.above->source().tier, Tier::kHbm);
  walk(stack_.host, Tier::kHost);
  for (const auto& b : stack_.below) walk(*b->tier, b->reported);
}

std::vector<std::string> StackReport::TierNames() const {
  std::vector<std::string> names;
  for (const BlockTier* t : StackTop()) names.emplace_back(t->name());
  return names;
}

std::vector<EngineNamespaceUse> StackReport::NamespaceUses() const {
  const std::vector<const BlockTier*> tiers = StackTop();
  std::map<NamespaceFingerprint, EngineNamespaceUse> uses;  // ordered: a stable listing
  auto use_of = [&](const NamespaceFingerprint& ns) -> EngineNamespaceUse& {
    auto [it, inserted] = uses.try_emplace(ns);
    if (inserted) {
      it->second.ns = ns;
      for (const BlockTier* t : tiers) it->second.tiers.push_back(EngineTierUse{std::string(t->name()), 0, 0});
    }
    return it->second;
  };
  for (size_t level = 0; level < tiers.size(); ++level) {
    tiers[level]->ForEachBlock([&](const BlockKey&, const BlockTier::BlockInfo& info) {
      EngineTierUse& t = use_of(info.ns).tiers[level];
      ++t.blocks;
      t.bytes += info.payload_bytes;
    });
  }
  namespaces_.ForEachDescriptor([&](const NamespaceFingerprint& ns, const NamespaceDescriptor& descriptor) {
    use_of(ns).descriptor = descriptor;
  });
  std::vector<EngineNamespaceUse> out;
  out.reserve(uses.size());
  for (auto& [ns, use] : uses) out.push_back(std::move(use));
  return out;
}

void StackReport::VisitNamespaceUse(CounterVisitor& v) const {
  const std::vector<const BlockTier*> tiers = StackTop();
  std::map<NamespaceFingerprint, std::vector<uint64_t>> bytes;
  for (size_t level = 0; level < tiers.size(); ++level) {
    VisitNamespaceBytes(*tiers[level], [&](const NamespaceFingerprint& ns, uint64_t payload) {
      auto& row = bytes[ns];
      row.resize(tiers.size());
      row[level] += payload;
    });
  }
  std::vector<std::pair<uint64_t, NamespaceFingerprint>> largest;
  for (const auto& [ns, row] : bytes) {
    uint64_t total = 0;
    for (uint64_t b : row) total += b;
    largest.emplace_back(total, ns);
  }
  std::sort(largest.begin(), largest.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<uint64_t> other(tiers.size(), 0);
  for (size_t i = kMaxNamespaceSeries; i < largest.size(); ++i) {
    const auto& row = bytes[largest[i].second];
    for (size_t level = 0; level < tiers.size(); ++level) other[level] += row[level];
  }
  largest.resize(std::min(largest.size(), kMaxNamespaceSeries));
  const auto visit = [&](const std::string& labels, const std::vector<uint64_t>& row) {
    for (size_t level = 0; level < tiers.size(); ++level) {
      v.VisitGauge("namespace.bytes{" + labels + ",tier=\"" + std::string(tiers[level]->name()) + "\"}",
                   static_cast<int64_t>(row[level]));
    }
  };
  for (const auto& [total, ns] : largest) {
    std::string labels = "ns=\"" + ns.ToHex().substr(0, 16) + "\"";
    if (const std::optional<NamespaceDescriptor> d = namespaces_.DescriptorOf(ns)) {
      labels += ",model=\"" + PlainLabelValue(d->model_id) + "\",revision=\"" + PlainLabelValue(d->model_revision) +
                "\",adapter=\"" + PlainLabelValue(d->adapter_id) + "\"";
    }
    visit(labels, bytes[ns]);
  }
  if (bytes.size() > kMaxNamespaceSeries) visit("ns=\"other\"", other);
}

}  // namespace kvtier

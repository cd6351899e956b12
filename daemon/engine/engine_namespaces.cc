// Namespaces as an operator sees them: which exist, what they are, where
// their blocks are (`kvtier ls`), and dropping one from every tier
// (`kvtier drop`).
#include <algorithm>
#include <map>
#include <optional>
#include <unordered_set>

#include "daemon/engine/engine.h"
#include "common/utf8.h"
#include "daemon/engine/host_block_tier.h"

namespace kvtier {

void Engine::RegisterNamespace(const NamespaceFingerprint& ns, const NamespaceLayout& layout) {
  namespaces_.Keep(ns, layout);
}

void Engine::RegisterNamespace(const NamespaceFingerprint& ns, const NamespaceDescriptor& descriptor) {
  namespaces_.Keep(ns, descriptor);
}

void Engine::UseNamespaces(ConnectionId connection, std::span<const NamespaceFingerprint> namespaces,
                           std::span<const NamespaceDescriptor> descriptors) {
  namespaces_.Use(connection, namespaces, descriptors);
}

size_t Engine::ForgetUnusedNamespaces() {
  if (!namespaces_.HasUnused()) return 0;
  // Which namespaces hold blocks, gathered without the registry's lock
  // (the tiers take their own locks). A namespace no connection uses
  // gains no block meanwhile: nothing can commit into it.
  std::unordered_set<NamespaceFingerprint> with_blocks;
  for (const BlockTier* t : StackTop()) {
    VisitNamespaceBytes(*t, [&](const NamespaceFingerprint& ns, uint64_t) { with_blocks.insert(ns); });
  }
  return namespaces_.ForgetUnused(with_blocks);
}

size_t Engine::RegisteredNamespaces() const { return namespaces_.described(); }

std::vector<const BlockTier*> Engine::StackTop() const {
  std::vector<const BlockTier*> tiers;
  if (above_ != nullptr) tiers.push_back(above_->source().tier);
  tiers.push_back(host_block_tier_.get());
  for (const auto& b : below_) tiers.push_back(b->tier);
  return tiers;
}

std::vector<std::string> Engine::TierNames() const {
  std::vector<std::string> names;
  for (const BlockTier* t : StackTop()) names.emplace_back(t->name());
  return names;
}

std::vector<Engine::NamespaceUse> Engine::NamespaceUses() const {
  const std::vector<const BlockTier*> tiers = StackTop();
  std::map<NamespaceFingerprint, NamespaceUse> uses;  // ordered: a stable listing
  auto use_of = [&](const NamespaceFingerprint& ns) -> NamespaceUse& {
    auto [it, inserted] = uses.try_emplace(ns);
    if (inserted) {
      it->second.ns = ns;
      for (const BlockTier* t : tiers) it->second.tiers.push_back(TierUse{std::string(t->name()), 0, 0});
    }
    return it->second;
  };
  for (size_t level = 0; level < tiers.size(); ++level) {
    tiers[level]->ForEachBlock([&](const BlockKey&, const BlockTier::BlockInfo& info) {
      TierUse& t = use_of(info.ns).tiers[level];
      ++t.blocks;
      t.bytes += info.payload_bytes;
    });
  }
  namespaces_.ForEachDescriptor(
      [&](const NamespaceFingerprint& ns, const NamespaceDescriptor& descriptor) { use_of(ns).descriptor = descriptor; });
  std::vector<NamespaceUse> out;
  out.reserve(uses.size());
  for (auto& [ns, use] : uses) out.push_back(std::move(use));
  return out;
}

namespace {

// A descriptor string as a label value: at most 128 bytes, cut on a
// character boundary, escaped as the Prometheus text format requires.
std::string PlainLabelValue(std::string_view text) { return PrometheusLabelValue(text, 128); }

}  // namespace

void Engine::VisitNamespaceUse(CounterVisitor& v) const {
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

std::vector<NamespaceFingerprint> Engine::NamespacesOfModel(std::string_view model_id,
                                                            std::string_view model_revision) const {
  return namespaces_.OfModel(model_id, model_revision);
}

std::vector<Engine::TierUse> Engine::DropNamespace(const NamespaceFingerprint& ns) {
  holder_->EndNamespaceHolds(ns);  // its operator holds end (holder.h)
  const std::vector<const BlockTier*> tiers = StackTop();
  std::vector<TierUse> dropped;
  std::vector<BlockKey> keys;
  std::unordered_set<BlockKey> seen;
  for (const BlockTier* t : tiers) {
    TierUse use{std::string(t->name()), 0, 0};
    t->ForEachBlock([&](const BlockKey& key, const BlockTier::BlockInfo& info) {
      if (info.ns != ns) return;
      ++use.blocks;
      use.bytes += info.payload_bytes;
      if (seen.insert(key).second) keys.push_back(key);
    });
    dropped.push_back(std::move(use));
  }
  Erase(ns, keys);
  return dropped;
}

}  // namespace kvtier

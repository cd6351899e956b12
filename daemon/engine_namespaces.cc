// Namespaces as an operator sees them: which exist, what they are, where
// their blocks are (`kvtier ls`), and dropping one from every tier
// (`kvtier drop`).
#include <map>

#include "daemon/engine.h"
#include "daemon/host_block_tier.h"

namespace kvtier {

void Engine::RegisterNamespace(const NamespaceFingerprint& ns, const NamespaceDescriptor& descriptor) {
  RegisterNamespace(ns, NamespaceLayout{descriptor.layer_count, descriptor.BlockBytes()});
  std::lock_guard lock(namespaces_mu_);
  descriptors_.insert_or_assign(ns, descriptor);
}

std::vector<const BlockTier*> Engine::StackTop() const {
  std::vector<const BlockTier*> tiers;
  if (above_ != nullptr) tiers.push_back(above_->source.tier);
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
  {
    std::lock_guard lock(namespaces_mu_);
    for (const auto& [ns, descriptor] : descriptors_) use_of(ns).descriptor = descriptor;
  }
  std::vector<NamespaceUse> out;
  out.reserve(uses.size());
  for (auto& [ns, use] : uses) out.push_back(std::move(use));
  return out;
}

std::vector<NamespaceFingerprint> Engine::NamespacesOfModel(std::string_view model_id,
                                                            std::string_view model_revision) const {
  std::vector<NamespaceFingerprint> out;
  std::lock_guard lock(namespaces_mu_);
  for (const auto& [ns, d] : descriptors_) {
    if (d.model_id == model_id && (model_revision.empty() || d.model_revision == model_revision)) out.push_back(ns);
  }
  return out;
}

std::vector<Engine::TierUse> Engine::DropNamespace(const NamespaceFingerprint& ns) {
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

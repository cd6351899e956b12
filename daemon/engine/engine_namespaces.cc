// Namespaces as an operator sees them: which exist, what they are, and
// dropping one from every tier (`kvtier drop`). Where their blocks are
// (`kvtier ls`) is StackReport's (stack_report.h).
#include <unordered_set>

#include "daemon/engine/engine.h"

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
std::optional<NamespaceDescriptor> Engine::DescriptorOf(const NamespaceFingerprint& ns) const {
  return namespaces_.DescriptorOf(ns);
}

std::vector<NamespaceFingerprint> Engine::NamespacesOfModel(std::string_view model_id,
                                                            std::string_view model_revision) const {
  return namespaces_.OfModel(model_id, model_revision);
}

std::vector<Engine::TierUse> Engine::DropNamespace(const NamespaceFingerprint& ns) {
  holder_->EndNamespaceHolds(ns);  // its operator holds end (holder.h)
  adopter_->ForgetNamespace(ns);   // kept blocks not yet adopted never come back (host.adopt.forgotten)
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

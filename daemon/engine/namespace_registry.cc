#include "daemon/engine/namespace_registry.h"

#include <algorithm>

#include "common/check.h"

namespace kvtier {

void NamespaceRegistry::Keep(const NamespaceFingerprint& ns, const NamespaceLayout& layout) {
  MutexLock lock(mu_);
  layouts_[ns] = layout;
  kept_.insert(ns);
}

void NamespaceRegistry::Keep(const NamespaceFingerprint& ns, const NamespaceDescriptor& descriptor) {
  MutexLock lock(mu_);
  layouts_[ns] = NamespaceLayout{descriptor.layer_count, descriptor.BlockBytes()};
  kept_.insert(ns);
  descriptors_.insert_or_assign(ns, descriptor);
}

void NamespaceRegistry::Use(ConnectionId connection, std::span<const NamespaceFingerprint> namespaces,
                            std::span<const NamespaceDescriptor> descriptors) {
  KVTIER_CHECK(namespaces.size() == descriptors.size(), "one descriptor per namespace");
  MutexLock lock(mu_);
  auto& used = connection_namespaces_[connection];
  for (size_t i = 0; i < namespaces.size(); ++i) {
    const NamespaceFingerprint& ns = namespaces[i];
    layouts_[ns] = NamespaceLayout{descriptors[i].layer_count, descriptors[i].BlockBytes()};
    descriptors_.insert_or_assign(ns, descriptors[i]);
    if (std::find(used.begin(), used.end(), ns) != used.end()) continue;  // listed twice in one Hello: one use
    used.push_back(ns);
    ++users_[ns];
    unused_.erase(ns);
  }
}

bool NamespaceRegistry::Release(ConnectionId connection) {
  MutexLock lock(mu_);
  auto node = connection_namespaces_.extract(connection);
  if (node.empty()) return false;
  for (const NamespaceFingerprint& ns : node.mapped()) {
    auto it = users_.find(ns);
    if (it == users_.end() || --it->second > 0) continue;
    users_.erase(it);
    if (kept_.count(ns) == 0) unused_.insert(ns);
  }
  return unused_.size() >= 2 * unused_after_sweep_ + kUnusedSweep;
}

bool NamespaceRegistry::HasUnused() const {
  MutexLock lock(mu_);
  return !unused_.empty();
}

size_t NamespaceRegistry::ForgetUnused(const std::unordered_set<NamespaceFingerprint>& with_blocks) {
  MutexLock lock(mu_);
  size_t forgotten = 0;
  for (auto it = unused_.begin(); it != unused_.end();) {
    const NamespaceFingerprint ns = *it;
    if (with_blocks.count(ns) != 0 || users_.count(ns) != 0 || kept_.count(ns) != 0) {
      ++it;
      continue;
    }
    layouts_.erase(ns);
    descriptors_.erase(ns);
    it = unused_.erase(it);
    ++forgotten;
  }
  unused_after_sweep_ = unused_.size();
  return forgotten;
}

NamespaceLayout NamespaceRegistry::LayoutOf(const NamespaceFingerprint& ns, uint64_t size) const {
  MutexLock lock(mu_);
  auto it = layouts_.find(ns);
  if (it != layouts_.end() && it->second.block_bytes == size && it->second.layer_count > 0) return it->second;
  return NamespaceLayout{1, size};
}

std::optional<NamespaceLayout> NamespaceRegistry::Layout(const NamespaceFingerprint& ns) const {
  MutexLock lock(mu_);
  auto it = layouts_.find(ns);
  if (it == layouts_.end()) return std::nullopt;
  return it->second;
}

size_t NamespaceRegistry::described() const {
  MutexLock lock(mu_);
  return descriptors_.size();
}

std::optional<NamespaceDescriptor> NamespaceRegistry::DescriptorOf(const NamespaceFingerprint& ns) const {
  MutexLock lock(mu_);
  auto it = descriptors_.find(ns);
  if (it == descriptors_.end()) return std::nullopt;
  return it->second;
}

void NamespaceRegistry::ForEachDescriptor(const DescriptorVisitor& visit) const {
  MutexLock lock(mu_);
  for (const auto& [ns, descriptor] : descriptors_) visit(ns, descriptor);
}

std::vector<NamespaceFingerprint> NamespaceRegistry::OfModel(std::string_view model_id,
                                                             std::string_view model_revision) const {
  std::vector<NamespaceFingerprint> out;
  MutexLock lock(mu_);
  for (const auto& [ns, d] : descriptors_) {
    if (d.model_id == model_id && (model_revision.empty() || d.model_revision == model_revision)) out.push_back(ns);
  }
  return out;
}

}  // namespace kvtier

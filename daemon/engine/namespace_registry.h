// NamespaceRegistry: the namespaces an Engine knows: each one's layout
// (how its blocks split into layers) and descriptor (what model, revision
// and adapter it is), which connections use it, and which no connection
// uses any more. Pure bookkeeping: it never looks at a tier. Whether an
// unused namespace still has blocks somewhere is the Engine's question
// (Engine::ForgetUnusedNamespaces, engine_namespaces.cc): it asks whether
// any are unused, gathers the namespaces its tiers hold blocks of, and
// hands them to ForgetUnused.
//
// A namespace is registered two ways:
// - Keep (Engine::RegisterNamespace: tools, tests, a daemon's own): kept
//   until the registry ends, never forgotten;
// - Use (a client's Hello): used by that connection until Release. When
//   the last connection using a namespace that is not kept releases it, it
//   is unused: ForgetUnused drops its layout and descriptor once no tier
//   holds a block of it.
// Release says when a sweep is due: the unused namespaces doubled (plus
// kUnusedSweep) since the last ForgetUnused, which leaves only those with
// blocks, so sweeps cost O(1) amortized per released namespace.
//
// Thread-safe. Its mutex is a leaf (docs/ARCHITECTURE.md, "One lock
// order"): it may be taken under a shard lock, and nothing is called
// while it is held.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/mutex.h"
#include "daemon/engine/engine_types.h"
#include "kvtier/block_key.h"

namespace kvtier {

class NamespaceRegistry {
 public:
  // Records the layer split of `ns`'s blocks, and keeps `ns` for good.
  void Keep(const NamespaceFingerprint& ns, const NamespaceLayout& layout);
  // The same with what `ns` is (its layout from the descriptor).
  void Keep(const NamespaceFingerprint& ns, const NamespaceDescriptor& descriptor);
  // Registers `namespaces[i]` as `descriptors[i]` (replacing an earlier
  // registration of it) and marks each used by `connection` (once, however
  // often it is listed) until Release(connection). A used namespace is no
  // longer unused. Precondition: the spans are as long.
  void Use(ConnectionId connection, std::span<const NamespaceFingerprint> namespaces,
           std::span<const NamespaceDescriptor> descriptors);
  // Ends `connection`'s use of its namespaces: each that no connection
  // uses any more and is not kept becomes unused. Returns whether a sweep
  // (ForgetUnused) is due; false for a connection that used none.
  static constexpr size_t kUnusedSweep = 64;
  bool Release(ConnectionId connection);

  // Whether some namespace is unused (a sweep has something to look at).
  bool HasUnused() const;
  // Forgets (layout and descriptor) every unused namespace that is not in
  // `with_blocks` (those a tier holds a block of), is not used and is not
  // kept; the others stay unused. Returns how many it forgot. Resets the
  // sweep threshold to the unused namespaces left.
  size_t ForgetUnused(const std::unordered_set<NamespaceFingerprint>& with_blocks);

  // The layer split of a block of `size` bytes in `ns`: the registered
  // layout when `size` is its block size (and it has layers), else the
  // block as one layer.
  NamespaceLayout LayoutOf(const NamespaceFingerprint& ns, uint64_t size) const;
  // The registered layout of `ns`, as registered; nullopt for none.
  std::optional<NamespaceLayout> Layout(const NamespaceFingerprint& ns) const;

  // Namespaces with a descriptor (kept, used, or unused with blocks).
  size_t described() const;
  // The descriptor of `ns`; nullopt when none was registered (or it was
  // forgotten).
  std::optional<NamespaceDescriptor> DescriptorOf(const NamespaceFingerprint& ns) const;
  // Calls `visit` for each namespace with a descriptor, in no order, under
  // the registry's lock: `visit` must not call the registry.
  using DescriptorVisitor = std::function<void(const NamespaceFingerprint& ns, const NamespaceDescriptor& d)>;
  void ForEachDescriptor(const DescriptorVisitor& visit) const;
  // The namespaces described as of `model_id` (and of `model_revision`,
  // unless it is empty), in no order.
  std::vector<NamespaceFingerprint> OfModel(std::string_view model_id, std::string_view model_revision) const;

 private:
  mutable Mutex mu_;
  std::unordered_map<NamespaceFingerprint, NamespaceLayout> layouts_ GUARDED_BY(mu_);
  std::unordered_map<NamespaceFingerprint, NamespaceDescriptor> descriptors_ GUARDED_BY(mu_);
  // The namespaces each connection's Use named, how many connections use
  // each, those Keep keeps for good, and those no connection uses any
  // more (forgotten once they hold no block).
  std::unordered_map<ConnectionId, std::vector<NamespaceFingerprint>> connection_namespaces_ GUARDED_BY(mu_);
  std::unordered_map<NamespaceFingerprint, uint32_t> users_ GUARDED_BY(mu_);
  std::unordered_set<NamespaceFingerprint> kept_ GUARDED_BY(mu_);
  std::unordered_set<NamespaceFingerprint> unused_ GUARDED_BY(mu_);
  // unused_'s size after the last ForgetUnused: the next sweep is due when
  // it doubles (plus kUnusedSweep).
  size_t unused_after_sweep_ GUARDED_BY(mu_) = 0;
};

}  // namespace kvtier

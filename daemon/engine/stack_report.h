// StackReport: what the engine reports about its stack, read-only: the
// counters and gauges of the engine and of every part below it, the
// health the tiers, their admissions and the engine report, and where
// each namespace's blocks are. It changes nothing it reads.
//
// - VisitCounters: the engine's gauges counted from the index shards
//   (engine.blocks, engine.pinned_blocks, ...) and its event counters
//   (EngineCounters, under the names docs/OPERATIONS.md lists), the
//   tier.* families the engine knows (VisitTierFamilies, below), the
//   movers' counters (Hooks::visit_movers) and the host tier face's, per
//   tier below engine.<tier>_*, the tier above's (AboveMover's, then the
//   tier's own), the host arena's, each tier below and its admission,
//   then the use per namespace (VisitNamespaceUse). Always in this order,
//   so a scrape reads the same series in the same place every time.
// - CheckHealth: each tier's own findings, top first (above, host, then
//   each tier below followed by its admission's), then the engine's
//   warnings of failed promotions and demotions.
// - NamespaceUses: every namespace with a block in some tier, plus those
//   registered since start (with their descriptor), each with its blocks
//   and payload bytes per tier of the stack, top first; ordered by
//   namespace. O(blocks of every tier).
// - VisitNamespaceUse: payload bytes per namespace and tier as gauges,
//   `namespace.bytes{ns="<16 hex>",model=...,revision=...,adapter=...,
//   tier="host"}` (model, revision and adapter when registered since
//   start, each at most 128 bytes, escaped). At most kMaxNamespaceSeries
//   namespaces, the largest by bytes in all tiers; the rest summed under
//   ns="other" (only when there are more). A tier that keeps
//   per-namespace sums (NamespaceSums, tiers/tier.h) is asked for them,
//   O(namespaces); the others are walked, O(blocks).
// - StackTop, TierNames: the stack's tiers (names), top first: the tier
//   above the host if any, the host tier's face, the tiers below;
//   ForEachHeldBlock: their blocks, in the same order.
//
// Thread-safe, with no lock of its own: it takes one shard lock at a time
// (to count blocks) and calls no tier, admission or hook under it; the
// tiers, admissions, registry and movers it reads take their own locks.
// Everything it is given is borrowed and must outlive it; the hooks must
// be safe to call from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/counters.h"
#include "common/health_findings.h"
#include "daemon/engine/above_mover.h"
#include "daemon/engine/engine_counters.h"
#include "daemon/engine/engine_levels.h"
#include "daemon/engine/engine_types.h"
#include "daemon/engine/hold_table.h"
#include "daemon/engine/namespace_registry.h"
#include "tiers/host/host_tier.h"
#include "tiers/tier.h"

namespace kvtier {

class BlockIndex;

class StackReport {
 public:
  // What it reads of the engine's other parts, in the order VisitCounters
  // reports them.
  struct Hooks {
    // The promoter's transient pool now (engine.layer_read_pool_bytes).
    std::function<int64_t()> layer_read_pool_bytes;
    // Operator holds in force now and their bytes (engine.holds,
    // engine.held_bytes).
    std::function<HoldTable::InForce()> holds_in_force;
    // Layer-wise loads open now (engine.loads_open).
    std::function<int64_t()> loads_open;
    // Visits the counters of the engine's movers: the demoter, the reader,
    // the retries and the host tier's check mover, in that order.
    std::function<void(CounterVisitor&)> visit_movers;
  };
  // The stack, borrowed: `above` (null: no tier above the host), the host
  // tier's BlockTier face, the host arena and the levels below the host,
  // highest first.
  struct Stack {
    const AboveMover* above;
    const BlockTier& host;
    const HostTier& arena;
    const std::vector<std::unique_ptr<TierLevel>>& below;
  };
  // Namespace series VisitNamespaceUse reports at most (then ns="other").
  static constexpr size_t kMaxNamespaceSeries = 256;

  StackReport(Stack stack, const std::vector<std::unique_ptr<BlockIndex>>& shards, const EngineCounters& counters,
              const NamespaceRegistry& namespaces, Hooks hooks);
  StackReport(const StackReport&) = delete;
  StackReport& operator=(const StackReport&) = delete;

  // See above.
  void VisitCounters(CounterVisitor& v) const;
  void CheckHealth(HealthFindings& out) const;
  std::vector<EngineNamespaceUse> NamespaceUses() const;
  void VisitNamespaceUse(CounterVisitor& v) const;
  std::vector<const BlockTier*> StackTop() const;
  std::vector<std::string> TierNames() const;
  // Every block each tier holds now, top first, with the tier as clients
  // name it (a snapshot of KV events, `kvtier ls --blocks`). O(blocks),
  // under each tier's own lock in turn: `visit` must not call the engine.
  using HeldBlockVisitor = std::function<void(Tier tier, const BlockKey& key, const BlockTier::BlockInfo& info)>;
  void ForEachHeldBlock(const HeldBlockVisitor& visit) const;

 private:
  // The tier-independent families (docs/OPERATIONS.md, "Metrics") the
  // engine knows: lookup hits and misses per tier, top first, and the
  // host tier's bytes, size and evictions (the tiers below and above
  // report theirs through their MeasuredTier and themselves).
  void VisitTierFamilies(CounterVisitor& v) const;
  // The gauges counted from the shards (one shard lock at a time).
  void VisitShardGauges(CounterVisitor& v) const;
  // The EngineCounters and the hooks' gauges, as engine.*.
  void VisitEngineCounters(CounterVisitor& v) const;

  const Stack stack_;
  const std::vector<std::unique_ptr<BlockIndex>>& shards_;
  const EngineCounters& counters_;
  const NamespaceRegistry& namespaces_;
  const Hooks hooks_;
};

}  // namespace kvtier

// Block events: what the engine reports each time a tier starts or stops
// holding a block, for KV-event subscribers (daemon/events/, a router's
// index of the node). Where each comes from, the one place per tier where
// that change happens:
//   host (kHost)   BlockIndex::Insert (a commit or a promotion landing:
//                  the block becomes visible) and BlockIndex::Withdraw (it
//                  stops being visible: evicted, demoted, erased, dropped);
//   a tier below   MeasuredTier, the engine's wrapper of each level: a
//   or above       write that completed (stored), an Erase that found the
//                  block, a read that found it gone or corrupt (removed);
//                  and the tier's own drops (ReclaimHooks::SetDropListener:
//                  the NVMe tier's region reclaim, a record found bad).
// A block the engine moves between tiers is stored in the new tier before
// it is removed from the old one when it is copied (a promotion keeps the
// slower copy), and removed from the host when its demotion starts.
//
// Events of one block on one tier are reported in the order the changes
// happened (each under the lock that makes it); a removal may be reported
// twice (a read that found it gone after a drop), and a consumer treats
// events as idempotent sets and removals.
#pragma once

#include <cstdint>
#include <optional>

#include "daemon/engine/lineage.h"
#include "kvtier/block_key.h"
#include "kvtier/client.h"
#include "tiers/tier.h"

namespace kvtier {

enum class BlockEventKind : uint8_t { kStored, kRemoved, kCleared };

struct BlockEvent {
  BlockEventKind kind = BlockEventKind::kStored;
  Tier tier = Tier::kNone;  // kHbm, kHost, kNvme or kRemote; kNone for a clear of every tier
  NamespaceFingerprint ns;
  BlockKey key;
  // kStored: the block's parent in its chain, when the engine knows it (a
  // put of consecutive blocks, a queue hint: Lineage); none for a chain's
  // first block or an unknown parent.
  std::optional<BlockKey> parent;
};

// Where the events go. Emit is called on any thread with engine locks
// held (a shard's, a tier's): it takes only a leaf lock of its own, never
// waits and never calls the engine.
class BlockEvents {
 public:
  virtual ~BlockEvents() = default;
  virtual void Emit(const BlockEvent& event) = 0;
};

// The engine's side: a nullable sink and the lineage that names parents.
// Immutable after construction; thread-safe as its sink and lineage.
class EventTap {
 public:
  EventTap(BlockEvents* sink, const Lineage* lineage) : sink_(sink), lineage_(lineage) {}

  bool on() const { return sink_ != nullptr; }
  void Stored(Tier tier, const NamespaceFingerprint& ns, const BlockKey& key) const {
    if (sink_ == nullptr) return;
    BlockEvent event{BlockEventKind::kStored, tier, ns, key, std::nullopt};
    if (lineage_ != nullptr) {
      if (std::optional<Lineage::Info> info = lineage_->Find(key)) event.parent = info->parent;
    }
    sink_->Emit(event);
  }
  void Removed(Tier tier, const NamespaceFingerprint& ns, const BlockKey& key) const {
    if (sink_ != nullptr) sink_->Emit(BlockEvent{BlockEventKind::kRemoved, tier, ns, key, std::nullopt});
  }
  // What a tier's own drops call (ReclaimHooks::SetDropListener): removals
  // from `tier`; empty when events are off. This tap outlives the listener.
  ReclaimHooks::DropListener DropListener(Tier tier) const {
    if (sink_ == nullptr) return nullptr;
    return [this, tier](const NamespaceFingerprint& ns, const BlockKey& key) { Removed(tier, ns, key); };
  }

 private:
  BlockEvents* const sink_;
  const Lineage* const lineage_;
};

}  // namespace kvtier

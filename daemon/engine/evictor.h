// Evictor: makes room in the host arena, and decides where each victim
// goes. An allocation that finds no room evicts the block the shards'
// policies rank lowest, one at a time and within a bound, and each victim
// goes to the first tier below that must or will take it
// (ChooseDemotionTarget, policy/demotion_target.h, over each level's
// TierAdmission) or is dropped. The write itself is the engine's demotion
// path, reached through a hook; the victim's bytes are copied before the
// hook returns, and the evictor frees its extent then.
//
// Thread-safe: one shard lock at a time (never two, never across the
// demotion hook). The victim's target is chosen under its shard's lock:
// the tiers' Find and the admissions take only their own locks, which
// come after a shard's in the lock order.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "common/clock.h"
#include "daemon/engine/engine_counters.h"
#include "daemon/engine/engine_levels.h"
#include "daemon/engine/lineage.h"
#include "daemon/engine/tier_admission.h"
#include "kvtier/block_key.h"
#include "kvtier/result.h"
#include "tiers/host/host_tier.h"

namespace kvtier {

class BlockIndex;

class Evictor {
 public:
  struct Hooks {
    // Releases operator holds whose expiry has come (before anything is
    // evicted, so an expired hold never keeps a block from eviction).
    std::function<void()> release_expired_holds;
    // Writes victim `key` of `ns` (`size` bytes at `extent`, checksum
    // `checksum`) to tier `level` below; the bytes are copied before it
    // returns.
    std::function<void(size_t level, const NamespaceFingerprint& ns, const BlockKey& key, HostTier::Extent extent,
                       uint64_t size, uint64_t checksum)>
        demote;
    // When nothing is evictable: frees up to `bytes` of kept blocks still
    // waiting to be adopted (adopter.h GiveBack); the bytes freed.
    std::function<uint64_t(uint64_t bytes)> give_back_waiting;  // may be empty
  };
  // Every reference is borrowed and outlives the evictor; `below` is the
  // stack's levels under the host, highest first (it may grow until the
  // first allocation). A victim a queued request needs within
  // `lookahead_us` is demoted, never dropped, if the first tier's budget
  // can pay for it.
  Evictor(const std::vector<std::unique_ptr<BlockIndex>>& shards, HostTier& host,
          const std::vector<std::unique_ptr<TierLevel>>& below, const Lineage& lineage, const Clock& clock,
          uint64_t lookahead_us, EngineCounters& counters, Hooks hooks);

  // Allocates `bytes` of arena, evicting as needed, but never more than
  // kEvictionBytesFactor times the allocation's size class (and at least
  // kMinVictimsPerAllocation blocks): past that, NoSpace (a fragmented
  // arena), so one allocation never flushes the host tier. NoSpace too
  // when nothing is evictable (every block pinned or being written);
  // InvalidArgument as HostTier::Allocate.
  static constexpr uint64_t kEvictionBytesFactor = 4;
  static constexpr int kMinVictimsPerAllocation = 8;
  Result<HostTier::Extent> Allocate(uint64_t bytes);
  // Evicts the globally lowest-ranked victim; false when nothing is
  // evictable. *evicted_bytes: the victim's size (0 when it raced with a
  // use and nothing was evicted; the caller looks again).
  bool EvictOne(uint64_t* evicted_bytes = nullptr);
  // Admission's facts on `key` (lineage, whether its parent is held
  // anywhere). Takes shard locks: call with none held.
  TierAdmission::Facts GatherFacts(const BlockKey& key, uint64_t uses) const;
  // Whether `key` is in the host tier (or being written or demoted) or in
  // a tier below. Takes its shard's lock: call with none held.
  bool HeldAnywhere(const BlockKey& key) const;

 private:
  const std::vector<std::unique_ptr<BlockIndex>>& shards_;
  HostTier& host_;
  const std::vector<std::unique_ptr<TierLevel>>& below_;
  const Lineage& lineage_;
  const Clock& clock_;
  const uint64_t lookahead_us_;
  EngineCounters& counters_;
  const Hooks hooks_;
};

}  // namespace kvtier

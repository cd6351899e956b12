// The engine's records of the levels of its stack and of where a block
// was found: a tier below the host (TierLevel: the tier as the engine
// calls it, its admission, read meter and counters; the tier above the
// host is one too, AboveMover::source()), a block's place outside the
// host tier (Located) and the search for it below (FindBelow), and what a
// pin claimed (PinClaim).
// Internal to daemon/engine; the Engine owns every instance (the tier
// above's TierLevel through its AboveMover).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/mutex.h"
#include "daemon/engine/measured_tier.h"
#include "daemon/engine/read_meter.h"
#include "daemon/engine/tier_admission.h"
#include "kvtier/block_key.h"
#include "kvtier/client.h"
#include "policy/option_defaults.h"
#include "policy/policy_registry.h"
#include "policy/prefetch_planner.h"
#include "tiers/tier.h"

namespace kvtier {

// One tier below the host, highest first in Engine::below_.
struct TierLevel {
  // The tier as the engine calls it: through its MeasuredTier (latency,
  // bytes), which forwards to the tier it was given.
  BlockTier* tier = nullptr;
  std::unique_ptr<MeasuredTier> measured;
  // How Lookup names this place to clients (LowerTier::reported; kHbm for
  // the tier above the host).
  Tier reported = Tier::kNone;
  std::unique_ptr<TierAdmission> admission;
  ReadMeter read_meter{defaults::kInitialReadBytesPerS};  // promotions', layer reads' and loads' reads
  std::atomic<int64_t> lookup_hits{0};
  std::atomic<int64_t> demotions_in{0};    // blocks a tier above evicted, written here
  std::atomic<int64_t> demotion_drops{0};  // blocks evicted from above that no tier took
};

// A block found outside the host tier: the tier holding it.
struct Located {
  size_t level = 0;  // index into below_, or Engine::kAboveLevel (AboveMover::source())
  BlockTier::BlockInfo info;
};

// The highest tier of `below` (highest first) holding `key` under `ns`.
// Takes only the tiers' leaf locks (callable under a shard lock).
inline std::optional<Located> FindBelow(const std::vector<std::unique_ptr<TierLevel>>& below, const BlockKey& key,
                                        const NamespaceFingerprint& ns) {
  for (size_t level = 0; level < below.size(); ++level) {
    std::optional<BlockTier::BlockInfo> info = below[level]->tier->Find(key);
    if (info && info->ns == ns) return Located{level, *info};
  }
  return std::nullopt;
}

// What Pinner::ClaimPins left to start: blocks it claimed for promotion (a
// kPromoting entry with the batch's slot among its waiters) and blocks
// whose layer range is to be read from below.
struct PinClaim {
  size_t index = 0;
  BlockKey key;
  Located from;
};
struct PinClaims {
  std::vector<PinClaim> promote, read_layers;
};

}  // namespace kvtier

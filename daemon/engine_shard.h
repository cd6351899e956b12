// EngineShard: one slice of the engine's index and its policy instance.
// A plain record guarded by `mu`; the logic lives in Engine (engine.cc),
// which never holds two shard locks at once.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "daemon/engine.h"
#include "kvtier/block_key.h"
#include "policy/eviction_policy.h"
#include "tiers/host/host_tier.h"

namespace kvtier {

// One cached (or being written) block in the host tier.
struct BlockEntry {
  NamespaceFingerprint ns;
  HostTier::Extent extent;  // valid when allocated
  uint64_t size = 0;        // bytes the writer reserved (<= extent.length)
  uint64_t checksum = 0;    // xxh3-64, set at commit
  SessionId writer = 0;     // the reserving session while not committed
  bool allocated = false;
  bool committed = false;
  bool promoting = false;   // being read in from the NVMe tier (invisible)
  bool published = false;   // in the host tier's block directory (committed only)
  bool prefetched = false;  // read in by Prefetch and not used since: counts against its budget
  uint32_t pins = 0;        // live leases; > 0 means never evicted
  uint64_t hits = 0;
  uint64_t last_use_us = 0;
  BlockHandle handle = 0;   // the policy's id, set at commit
};

// One PinAsync call: its grants fill in as keys resolve; the last key to
// resolve (outstanding reaches 0) runs `done`.
struct PinBatch {
  SessionId session = 0;
  std::vector<PinGrant> grants;
  std::atomic<int> outstanding{1};  // keys in flight + 1 for the call itself
  Engine::PinDone done;
};

// A PinAsync call waiting for a block being promoted: slot `index` of `batch`.
struct PromotionWaiter {
  std::shared_ptr<PinBatch> batch;
  size_t index = 0;
};

struct LeaseRecord {
  SessionId session = 0;
  BlockKey key;
  BlockHandle handle = 0;
};

struct SessionRecord {
  std::unordered_set<BlockKey> reserved;
  std::unordered_set<LeaseId> leases;
};

struct EngineShard {
  explicit EngineShard(std::unique_ptr<EvictionPolicy> p) : policy(std::move(p)) {}

  std::mutex mu;
  // All members below are guarded by mu.
  std::unordered_map<BlockKey, BlockEntry> index;
  // Blocks erased while pinned: invisible, freed when the last lease goes.
  std::unordered_map<BlockHandle, BlockEntry> zombies;
  // Committed blocks by handle (what the policy names as victims).
  std::unordered_map<BlockHandle, BlockKey> committed;
  std::unordered_map<LeaseId, LeaseRecord> leases;
  std::unordered_map<SessionId, SessionRecord> sessions;
  // Pins waiting per block being promoted.
  std::unordered_map<BlockKey, std::vector<PromotionWaiter>> promotion_waiters;
  // Blocks evicted to NVMe whose write is still in flight (in neither
  // tier's index meanwhile); pins of them wait and retry when it ends.
  struct Demoting {
    NamespaceFingerprint ns;
    std::vector<std::function<void()>> waiters;
  };
  std::unordered_map<BlockKey, Demoting> demoting;
  std::unique_ptr<EvictionPolicy> policy;  // tracks committed blocks; pins via OnPin/OnUnpin
  uint64_t stored_bytes = 0;               // sizes of committed blocks
  uint64_t prefetched_bytes = 0;           // sizes of entries with `prefetched` (being read or resident)
};

}  // namespace kvtier

// The replay's NVMe tier: the daemon's log-structured placement
// (tiers/nvme/nvme_tier.h) without bytes or I/O. It runs the code the tier
// runs for every decision:
// - RegionManager places each record (the daemon's record size: header
//   plus payload rounded up to the alignment, block_record.h) and reclaims
//   the oldest sealed region when none is free;
// - when the last free region opens, the region reclaim takes next has its
//   turn (PlanReclaimTurn with the tier's ReclaimPolicy and ReinsertBudget):
//   the blocks it keeps are copied forward into the open region, the others
//   are offered to the tier below (with one present) and stay readable here
//   until their region goes;
// - the policy sees every write, read and drop as the tier reports them.
//
// What differs is time only: a write is complete when Write returns, and a
// turn runs to its end at once (the daemon's runs on a verifier thread
// while later writes may land; RegionManager's reclaim hold still applies
// within the turn, so a copy forward that would reclaim the region being
// offered fails as it does in the daemon).
//
// Blocks are the replay's ids. Not thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/result.h"
#include "policy/reclaim_policy.h"
#include "tiers/nvme/region_manager.h"

namespace kvtier::tools {

struct SimLogOptions {
  uint64_t device_bytes = 0;
  uint64_t region_bytes = 64ull << 20;             // nvme.region_bytes
  uint32_t alignment_bytes = 4096;                 // the device's (O_DIRECT) alignment
  ReclaimOrder order = ReclaimOrder::kQueueAware;  // nvme.eviction
  double reinsert_share = 0.1;                     // nvme.reinsert_percent / 100
};

class SimLog {
 public:
  // What the log tells the replay. `dropped`: the block left (its region
  // was reclaimed). `offered`: a turn evicts it, read `hits` times since
  // written here; with `has_below`, it is offered to the tier below (and
  // stays here until its region goes).
  // `needed`: whether a queued request names it (queue_aware order).
  struct Hooks {
    std::function<void(uint32_t id)> dropped;
    std::function<void(uint32_t id, uint64_t hits)> offered;
    std::function<bool(uint32_t id)> needed;
    bool has_below = false;
  };

  // InvalidArgument (RegionManager::Validate's message) for a bad geometry.
  static Result<std::unique_ptr<SimLog>> Create(const SimLogOptions& options, Hooks hooks);

  // The device bytes a block of `payload_bytes` takes (and its admission
  // is charged): the daemon's record size.
  uint64_t RecordBytesOf(uint64_t payload_bytes) const;
  bool Holds(uint32_t id) const { return entries_.count(id) > 0; }
  // A demotion's write of a block the log does not hold. False when it
  // cannot be placed (a record larger than a region), nothing changed.
  bool Write(uint32_t id, const BlockKey& key, uint64_t payload_bytes, uint64_t now_us);
  // A verified read of a block it holds (a promotion): a hit for its
  // reclaim order.
  void Read(uint32_t id, uint64_t now_us);

  // Record bytes written, all causes (the DWPD budget's W), and the part
  // that copies forward wrote.
  uint64_t device_bytes_written() const { return device_bytes_; }
  uint64_t reinserted_bytes() const { return reinserted_bytes_; }
  uint64_t reinserted() const { return reinserted_; }
  uint64_t stored_payload_bytes() const { return stored_payload_; }

 private:
  struct Entry {
    BlockKey key;
    uint32_t region = 0;
    uint64_t generation = 0;
    uint64_t offset = 0;
    uint64_t record_bytes = 0;
    uint64_t payload_bytes = 0;
    uint64_t hits = 0;  // reads since written (a copy forward is a write)
  };
  SimLog(const SimLogOptions& options, Hooks hooks);
  // Places a record; a copy forward (`moving`) replaces the entry it copies.
  bool Place(uint32_t id, const BlockKey& key, uint64_t payload_bytes, uint64_t now_us, bool moving);
  void DropRegion(uint32_t region);
  void MaybeTakeTurn(uint64_t now_us);

  const SimLogOptions options_;
  Hooks hooks_;
  RegionManager regions_;
  ReclaimPolicy reclaim_;
  ReinsertBudget budget_;
  std::unordered_map<uint32_t, Entry> entries_;
  std::vector<std::unordered_set<uint32_t>> region_ids_;
  std::pair<uint32_t, uint64_t> scanned_{~0u, 0};  // the region (and generation) whose turn was taken
  bool in_turn_ = false;
  uint64_t device_bytes_ = 0, reinserted_bytes_ = 0, reinserted_ = 0, stored_payload_ = 0;
};

}  // namespace kvtier::tools

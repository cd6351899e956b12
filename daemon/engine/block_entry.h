// BlockEntry and BlockState: one block in the engine's index (the host
// tier's part of it), with the one state it is in. BlockIndex
// (block_index.h) holds the entries and is the only place their state
// changes, each transition a method that checks this diagram.
//
// The life of a block, by the maps of its shard that hold it:
//
//   index:   (none) --Reserve--> kReserved --Commit--> kCommitted
//                                   | Abort, size mismatch,   ^   |
//                                   | connection closed       |   | first lease / last lease
//                                   v                         |   v
//                                 (none)                     kPinned
//            (none) --pin or prefetch of a block below--> kPromoting
//                 kPromoting --read lands--> kCommitted (kPinned for the pins that waited)
//                 kPromoting --Erase--> kErasedWhilePromoting --read ends--> (none)
//   demoting: kCommitted --evicted to a tier below--> kDemoting --write ends--> (none; in that tier)
//                 kDemoting --Erase--> kErasedWhileDemoting --write ends--> (none; undone there)
//            (none) --a kept arena's block verified at start (adopter.h)--> kCommitted
//   zombies: kPinned --Erase or eviction--> kErasedWhilePinned --last lease--> (none; extent freed)
//            (none) --layer-range read lands--> kLayerRead --its lease--> (none; extent freed)
//
// Only kCommitted and kPinned blocks are visible (lookups, pins, the host
// directory); only kCommitted ones are eviction candidates.
#pragma once

#include <cstdint>
#include <vector>

#include "kvtier/block_key.h"
#include "policy/eviction_policy.h"
#include "tiers/host/host_tier.h"

namespace kvtier {

using ConnectionId = uint64_t;

enum class BlockState : uint8_t {
  kReserved,              // claimed by its writer; invisible until Commit
  kCommitted,             // visible, no leases: evictable
  kPinned,                // visible, held by leases: never evicted
  kPromoting,             // being read in from a tier below; pins wait for it
  kErasedWhilePromoting,  // its promotion ends as a miss
  kDemoting,              // being written to a tier below (not in the index)
  kErasedWhileDemoting,   // that write is cancelled, or undone when it ends
  kErasedWhilePinned,     // invisible; its extent is freed with the last lease
  kLayerRead,             // a layer-range read's extent, held by one lease
};

class BlockIndex;

// One block in the host tier: cached, being written, or moving. Its state
// changes only through BlockIndex (block_index.h); the other fields are
// the engine's to read and fill in.
struct BlockEntry {
  NamespaceFingerprint ns;
  HostTier::Extent extent;  // valid when allocated
  uint64_t size = 0;        // bytes the writer reserved (<= extent.length)
  uint64_t checksum = 0;    // xxh3-64, set at commit
  // xxh3-64 of each layer (set at commit or promotion) of a block of its
  // namespace's block size with layer_count > 1; empty for a block of one
  // layer (its one layer's checksum is `checksum`).
  std::vector<uint64_t> layer_checksums;
  ConnectionId writer = 0;  // the reserving connection while kReserved
  bool allocated = false;   // `extent` is this block's (a reservation gets it after claiming the key)
  bool published = false;   // in the host tier's block directory (visible states only)
  bool prefetched = false;  // read in by Prefetch and not used since: counts against its budget
  uint32_t pins = 0;        // live leases; kPinned (or a zombie) while > 0
  uint64_t hits = 0;
  uint64_t last_use_us = 0;
  BlockHandle handle = 0;  // the policy's id, set at commit
  // Its record in the host journal (host_journal.h) while visible, so a
  // restart can adopt it; kNoSlot when none.
  uint32_t journal_slot = HostJournal::kNoSlot;

  BlockState state() const { return state_; }
  // Visible to lookups and pins: kCommitted or kPinned.
  bool cached() const { return state_ == BlockState::kCommitted || state_ == BlockState::kPinned; }
  // Being read in, erased meanwhile or not.
  bool promoting() const { return state_ == BlockState::kPromoting || state_ == BlockState::kErasedWhilePromoting; }

 private:
  friend class BlockIndex;
  BlockState state_ = BlockState::kReserved;
};

}  // namespace kvtier

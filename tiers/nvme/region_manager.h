// RegionManager: the log-structured layout of the NVMe tier, as pure
// bookkeeping (no I/O, no locks). The device is split into regions of
// region_bytes. Records are appended to the one open region; a region that
// cannot take the next record is sealed; when no region is free, the oldest
// sealed region without writes in flight is reclaimed (its records are
// dropped) and reopened under a new generation. A record is only valid if
// its index entry's generation equals its region's current one.
//
// Protected shares (NvmeTier with shares, policy/share_guard.h) add a
// reserve: `reserve` free regions that only copies forward (kCopy) may
// open, so that the blocks of the next region to reclaim can always be
// copied out of it; a client write (kWrite) that would need one reclaims
// instead. A region is then reclaimed only when the caller's gate says so
// (its protected blocks have been copied), and once a copy has opened a
// reserve region, client writes are Busy until the copies end (EndCopies),
// so they never take the room the copies count on.
//
// Not thread-safe: NvmeTier calls it under its mutex.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "common/counters.h"
#include "kvtier/result.h"
#include "tiers/nvme/nvme_index.h"

namespace kvtier {

class RegionManager {
 public:
  // Regions are the whole multiples of region_bytes that fit the device.
  // Preconditions (checked by Validate): region_bytes is a positive
  // multiple of alignment_bytes and the device holds at least 2 regions.
  RegionManager(uint64_t device_bytes, uint64_t region_bytes, uint32_t alignment_bytes);
  static Status Validate(uint64_t device_bytes, uint64_t region_bytes, uint32_t alignment_bytes);

  // Start-up: takes the persisted region states (regions not listed are
  // free). A region that was open when the daemon stopped is sealed: the
  // log never appends after a restart into a region a crash may have torn.
  // Returns the states that changed (to persist).
  std::vector<RegionState> Restore(std::span<const RegionState> persisted);

  struct Placement {
    uint32_t region = 0;
    uint64_t offset = 0;      // device offset of the record
    uint64_t generation = 0;  // of the region, to record in the header and the index
  };
  struct Allocation {
    Placement placement;
    // Region states to persist before the record's write is issued (a
    // sealed region, a newly opened one). At most two.
    std::vector<RegionState> changed;
    // A region reclaimed to make room: its records are gone; the caller
    // drops their index entries in the same index write that opens it.
    std::optional<uint32_t> reclaimed;
  };
  // Who is writing: a client (kWrite) or a copy forward of a block the
  // tier already holds (kCopy), which may open the reserve.
  enum class Purpose : uint8_t { kWrite, kCopy };
  // Whether a region may be reclaimed now (empty: always).
  using ReclaimGate = std::function<bool(uint32_t region)>;
  // Places a record of `record_bytes` (a multiple of the alignment).
  // InvalidArgument if it is larger than a region; Busy if no region is
  // free and every sealed one still has writes in flight, if the oldest
  // the gate refuses, or (kWrite) while copies hold the reserve.
  Result<Allocation> Allocate(uint64_t record_bytes, Purpose purpose = Purpose::kWrite,
                              const ReclaimGate& may_reclaim = {});

  // Free regions kept for copies (0: none, the default).
  void SetReserve(uint32_t regions) { reserve_ = regions; }
  uint32_t reserve() const { return reserve_; }
  // While fewer than `reserve` regions are free, reclaims the oldest
  // sealed regions the gate lets go (no writes in flight, not held) into
  // the free list; returns what to persist (reclaimed set, at most one
  // region a call; the caller drops its entries).
  std::optional<Allocation> RestoreReserve(const ReclaimGate& may_reclaim);
  // The copies that opened a reserve region ended: client writes go on.
  void EndCopies() { copies_only_ = false; }

  // The region the next reclaim would take (the oldest sealed one without
  // writes in flight), or nullopt; and how many regions are free.
  std::optional<uint32_t> NextVictim() const;
  size_t free_count() const { return free_.size(); }

  // Writes in flight per region: a region with any is never reclaimed.
  void WriteStarted(uint32_t region);
  void WriteFinished(uint32_t region);
  // A region whose records are being read out (to the tier below) before
  // its reclaim: until the hold is lifted (nullopt), Allocate answers Busy
  // rather than reclaim it or any region sealed after it.
  void HoldReclaim(std::optional<uint32_t> region) { held_ = region; }

  uint64_t Generation(uint32_t region) const { return regions_[region].generation; }
  RegionStatus StatusOf(uint32_t region) const { return regions_[region].status; }
  uint32_t region_count() const { return static_cast<uint32_t>(regions_.size()); }
  uint64_t region_bytes() const { return region_bytes_; }
  uint32_t RegionOf(uint64_t offset) const { return static_cast<uint32_t>(offset / region_bytes_); }

  // nvme.regions_{free,open,sealed}, nvme.region_reclaims.
  void VisitCounters(CounterVisitor& visitor) const;

 private:
  struct Region {
    uint64_t generation = 0;
    RegionStatus status = RegionStatus::kFree;
    uint64_t seal_sequence = 0;
    uint32_t writes_in_flight = 0;
  };
  RegionState StateOf(uint32_t region) const;
  void Seal(uint32_t region, std::vector<RegionState>& changed);

  const uint64_t region_bytes_;
  const uint32_t alignment_bytes_;
  std::vector<Region> regions_;
  std::optional<uint32_t> open_;  // the region being appended to
  uint64_t open_offset_ = 0;      // next free byte inside it
  std::deque<uint32_t> sealed_;   // sealed regions, oldest first
  std::deque<uint32_t> free_;     // free regions, lowest first
  int64_t reclaims_ = 0;
  uint64_t next_seal_sequence_ = 1;
  std::optional<uint32_t> held_;  // see HoldReclaim
  uint32_t reserve_ = 0;          // see SetReserve
  bool copies_only_ = false;      // a copy opened a reserve region: kWrite is Busy
  // The oldest sealed region without writes in flight, if the hold and
  // the gate let it go; else the reason (Busy).
  Result<uint32_t> ReclaimableVictim(const ReclaimGate& may_reclaim) const;
  // Takes `region` out of the sealed list under a new generation.
  void Reclaim(uint32_t region);
};

}  // namespace kvtier

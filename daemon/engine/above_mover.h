// AboveMover: the tier above the host (the HBM tier) as the engine moves
// blocks to and from it: what goes up, what loads hold there in place, and
// what its evictions demote into the host tier.
//
// - Up: a block a load into GPU memory found (a hit: reuse evidence) is
//   offered once it is loaded (Offer), once per key: an offer of a key
//   held above, or offered and not yet ended, does nothing. The copy runs
//   on the mover's own thread (`engine.above_io`, a Mover with a bounded
//   queue; a full queue drops the offer, counted): read from the host
//   tier whole (verified; the job waits for the read), room made
//   (EvictOne), written above (the tier stages it; its write completes on
//   the tier's thread and enters the eviction order). A block that left
//   the host tier meanwhile, is not of the offered namespace or could
//   never fit the tier is skipped, counted. A write the tier refuses as
//   Busy is queued on the mover again kBusyPauseUs later (on the
//   RetryScheduler, at its time on the clock), with a copy of the bytes
//   read, until kBusyWaitUs after the read; then it fails, counted. A
//   NoSpace with bytes free (a fragmented tier) evicts one more block and
//   tries again, at most kMaxFragmentedEvictions times.
// - In place: Hold holds a block where it is for a load (the client copies
//   device to device), a use in the eviction order; a held range outlives
//   an eviction or an Erase until ReleaseHold (InPlaceHolds::HoldInPlace).
// - Down: EvictOne takes the block the eviction order (ResidentOrder, an
//   LRU policy from policy/) ranks first; unless the host tier or
//   (Hooks::held_below) a tier below holds it under its namespace, it is
//   read back and written into the host tier (whose own eviction demotes
//   further as usual; a failure is counted, not logged above debug), then
//   erased above.
// - Erase forgets a key above and cancels a copy up of it queued, waiting
//   for a retry or being written: it is not left above.
//
// Counters (VisitCounters, as engine.<tier>_*): copies_up, copy_up_skips,
// copy_up_failures, offers_dropped (the mover's queue was full),
// evictions, demotions_to_host, demotion_failures, in_place_blocks (held
// for loads), lookup_hits and the read_bytes_per_s gauge of source(),
// then the mover's (engine.above_io.*).
//
// Thread-safe. Its lock is a leaf: no hook, tier call or I/O runs under
// it. Offer, Hold, ReleaseHold and Erase never wait (Erase is called under
// a shard lock: it takes the tier's lock and its own, leaves). The
// destructor runs the mover's jobs still queued and joins it; the owner
// waits for I/O in flight first (the hooks' count), so no write
// completion or retry reaches a destroyed mover.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <unordered_set>
#include <vector>

#include "common/clock.h"
#include "common/counters.h"
#include "common/mutex.h"
#include "common/retry_scheduler.h"
#include "daemon/engine/engine_counters.h"
#include "daemon/engine/engine_levels.h"
#include "daemon/engine/mover.h"
#include "daemon/engine/resident_order.h"
#include "kvtier/block_key.h"
#include "policy/policy_registry.h"
#include "tiers/tier.h"

namespace kvtier {

class AboveMover {
 public:
  struct Hooks {
    // I/O in flight: io_started before each job queued on the mover, each
    // retry scheduled and each write started above; io_finished once each
    // has ended (a write: after its completion). The owner waits for the
    // count to reach zero before destroying the mover. Any thread.
    std::function<void()> io_started, io_finished;
    // Whether a tier below the host holds `key` under `ns` (then an
    // evicted block is not demoted into the host tier). Called on the
    // mover's thread with no lock held; must not wait for I/O.
    std::function<bool(const BlockKey& key, const NamespaceFingerprint& ns)> held_below;
  };
  // A Busy write above is tried again this long, a pause apart on the
  // clock, before the copy up is given up.
  static constexpr uint64_t kBusyWaitUs = 2'000'000;
  static constexpr uint64_t kBusyPauseUs = 1'000;
  // Evictions one copy up may cause when the tier answers NoSpace with
  // bytes free (a fragmented pool), before it gives up.
  static constexpr int kMaxFragmentedEvictions = 8;

  // `above` (the tier above the host, called through a MeasuredTier of
  // its own: source()), `host` (the host tier's BlockTier face: where
  // copies up read and evicted blocks are written), `clock` and `retries`
  // are borrowed and outlive the mover. Its queue holds at most
  // `max_jobs` jobs.
  // `events` (may be null; borrowed, outlives the mover) hears what the
  // tier above stores and removes (MeasuredTier).
  AboveMover(BlockTier& above, BlockTier& host, const Clock& clock, RetryScheduler& retries, size_t max_jobs,
             Hooks hooks, const EventTap* events = nullptr);
  AboveMover(const AboveMover&) = delete;
  AboveMover& operator=(const AboveMover&) = delete;

  // The tier above as a level of the stack (Located's kAboveLevel): its
  // MeasuredTier, read meter and lookup hits, which the engine's reads
  // and lookups use and count.
  TierLevel& source() { return source_; }
  const TierLevel& source() const { return source_; }

  // Holds `key` in place above for a load when it is stored there under
  // `ns` with `layer_count` layers of `payload_bytes` in all (a use in the
  // eviction order when it is there under `ns`; counted in
  // in_place_blocks when held). Nullopt when the tier cannot be mapped by
  // clients (no InPlaceHolds), or the block is not there as asked.
  std::optional<BlockTier::InPlace> Hold(const NamespaceFingerprint& ns, const BlockKey& key, uint32_t layer_count,
                                         uint64_t payload_bytes) EXCLUDES(mu_);
  // Ends a hold Hold gave (`offset`: its InPlace::offset).
  void ReleaseHold(const BlockKey& key, uint64_t offset);

  // Queues a copy of host block `key` of `ns` up (see above). Never waits.
  void Offer(const NamespaceFingerprint& ns, const BlockKey& key) EXCLUDES(mu_);

  // Forgets `key` above and cancels a copy up of it in flight. Erases the
  // tier's block when it is stored under `ns`, or whatever it stores under
  // `key` when `moving` (the block was between tiers) or a copy up of it
  // was offered. True when a stored block went.
  bool Erase(const NamespaceFingerprint& ns, const BlockKey& key, bool moving) EXCLUDES(mu_);

  // engine.<tier>_evictions (also the tier.evictions family).
  int64_t evictions() const { return evictions_.load(std::memory_order_relaxed); }
  // See the counters above.
  void VisitCounters(CounterVisitor& v) const;

 private:
  // A copy up's bytes: what its retry writes.
  struct CopyUp {
    BlockTier::BlockInfo info;
    std::shared_ptr<const std::vector<std::byte>> bytes;  // null: a first try (read from the host tier)
    uint64_t deadline_us = 0;
  };
  // Queues RunCopyUp(ns, key, copy) on the mover (as I/O in flight); a
  // full queue ends the offer (counted: an offer dropped, a retry failed).
  void QueueCopyUp(const NamespaceFingerprint& ns, const BlockKey& key, CopyUp copy) EXCLUDES(mu_);
  // On the mover's thread: whether the offer goes on (a write started,
  // whose completion ends it, or a retry waits with the bytes read).
  bool RunCopyUp(const NamespaceFingerprint& ns, const BlockKey& key, CopyUp copy) EXCLUDES(mu_);
  // RunCopyUp's first step: host block `key` of `ns` into up_buffer_, and
  // `first`'s info and deadline. False when it is above already, or
  // (counted as a skip) not of `ns`, too big for the tier, gone or
  // unverified.
  bool ReadForCopyUp(const NamespaceFingerprint& ns, const BlockKey& key, CopyUp& first);
  // On the mover's thread: makes room above (see Down). False: nothing to
  // evict.
  bool EvictOne() EXCLUDES(mu_);
  // Ends the offer of `key` (no copy up of it is in flight any more).
  void EndOffer(const BlockKey& key) EXCLUDES(mu_);

  TierLevel source_;  // its tier: a MeasuredTier over `above`
  BlockTier& host_;
  const Clock& clock_;
  RetryScheduler& retries_;
  const Hooks hooks_;
  Mutex mu_;  // a leaf
  ResidentOrder resident_ GUARDED_BY(mu_){MakeEvictionPolicy(EvictionPolicyId::kLru)};
  std::unordered_set<BlockKey> offered_ GUARDED_BY(mu_);    // copies up queued, running or being written
  std::unordered_set<BlockKey> cancelled_ GUARDED_BY(mu_);  // offered keys erased meanwhile
  std::vector<std::byte> up_buffer_, down_buffer_;          // the mover thread's own
  std::atomic<int64_t> copies_up_{0}, copy_up_skips_{0}, copy_up_failures_{0}, offers_dropped_{0};
  std::atomic<int64_t> evictions_{0}, demotions_to_host_{0}, demotion_failures_{0}, in_place_blocks_{0};
  Mover mover_;  // last: joined first
};

}  // namespace kvtier

// Demoter: writes blocks down the stack. Demote writes a host victim to
// the tier below the evictor chose for it; DemoteBelow writes a block a
// tier below evicted (its eviction sink) to the first tier under it that
// holds it already (no write) or admits it (ChooseDemotionTarget, as the
// evictor decides for the host tier; never forced: there is no queue
// lookahead below the host).
//
// A write the tier refuses as Busy (out of staging or writable regions)
// never makes the caller wait: a copy of the bytes waits in the demoter's
// mover (bounded by `buffer_bytes`) for room, looking again whenever a
// write it started ends and every kQueuedDemotionPollUs (room also comes
// back from the tier's own background work, which does not signal), for
// at most kQueuedDemotionWaitUs; the block is dropped
// (engine.demotion_busy_drops) when that wait ends, when the mover is full
// too, or once Stop began, so the host tier stays a working cache while a
// tier below stalls. A queued demotion whose block was erased meanwhile is
// not written (Cancelled). Both times are on the injected Clock, waited
// through Clock::WaitUntilUs: on a test's FakeClock a queued demotion
// looks again only when the test moves the clock (or a write ends).
//
// Each write counts as I/O in flight from start to completion
// (Hooks::io_started / io_finished), so the engine's WaitForIdle covers
// queued ones. Thread-safe; its lock is a leaf. The destructor runs the
// jobs still queued (the engine stops the demoter and waits for them
// first).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "common/clock.h"
#include "common/counters.h"
#include "common/mutex.h"
#include "daemon/engine/engine_counters.h"
#include "daemon/engine/engine_levels.h"
#include "daemon/engine/mover.h"
#include "daemon/engine/tier_admission.h"
#include "kvtier/block_key.h"
#include "policy/option_defaults.h"
#include "tiers/tier.h"

namespace kvtier {

class Demoter {
 public:
  struct Hooks {
    // I/O in flight: one io_started before each write, one io_finished
    // after its completion.
    std::function<void()> io_started, io_finished;
    // Whether the demotion of host victim `key` was erased since it began.
    std::function<bool(const BlockKey& key)> erased;
    // The write of host victim `key` ended (`written`: its outcome).
    std::function<void(const BlockKey& key, const Status& written)> finished;
    // Admission's facts on a block a tier below evicted.
    std::function<TierAdmission::Facts(const BlockKey& key, uint64_t uses)> facts;
  };
  // How long a queued demotion waits for room (policy/option_defaults.h:
  // kvtier replay's write channels give up after the same wait), and how
  // often it looks.
  static constexpr uint64_t kQueuedDemotionWaitUs = defaults::kQueuedDemotionWaitMs * 1000;
  static constexpr uint64_t kQueuedDemotionPollUs = 1'000;

  // `below` (the levels under the host, highest first), `counters` and
  // `clock` are borrowed and outlive the demoter.
  Demoter(const std::vector<std::unique_ptr<TierLevel>>& below, uint64_t buffer_bytes, EngineCounters& counters,
          Hooks hooks, const Clock& clock);
  Demoter(const Demoter&) = delete;
  Demoter& operator=(const Demoter&) = delete;

  // Writes host victim `key` of `ns` (`bytes`, of `layers` layers, its
  // checksum `checksum`) to level `level`; the bytes are copied (or
  // written) before this returns. Hooks::finished runs exactly once with
  // the outcome; engine.demotions counts those written.
  void Demote(size_t level, const NamespaceFingerprint& ns, const BlockKey& key, uint32_t layers,
              std::span<const std::byte> bytes, uint64_t checksum);
  // A block level `from` evicted, with its bytes (borrowed for the call).
  // Runs on a thread of that tier; never waits.
  void DemoteBelow(size_t from, const BlockTier::Evicted& block, std::span<const std::byte> payload);

  // Ends every wait for room now and refuses later ones: a queued
  // demotion still waiting, or one queued from now on, is dropped as when
  // its wait ends, so the owner's wait for idle ends on any clock (a fake
  // one nobody moves too). Later calls do nothing.
  void Stop() EXCLUDES(mu_);

  // engine.demoter.*: the mover's queue.
  void VisitCounters(CounterVisitor& v) const { mover_.VisitCounters(v); }

 private:
  // Writes to level `level` at once, else queues a copy in the mover (see
  // above). `done` runs exactly once with the outcome.
  void WriteToTier(size_t level, const NamespaceFingerprint& ns, const BlockKey& key, uint32_t layers,
                   std::span<const std::byte> payload, uint64_t checksum, BlockTier::WriteDone done);
  // Counts a write that did not succeed by its cause.
  void CountFailedWrite(const Status& outcome);
  // On the mover: writes the queued copy `bytes` once `tier` has room,
  // waiting for it until kQueuedDemotionWaitUs passed (see above).
  void WriteQueued(BlockTier& tier, const NamespaceFingerprint& ns, const BlockKey& key, uint32_t layers,
                   std::span<const std::byte> bytes, uint64_t checksum, const BlockTier::WriteDone& ended)
      EXCLUDES(mu_);

  const std::vector<std::unique_ptr<TierLevel>>& below_;
  EngineCounters& counters_;
  const Hooks hooks_;
  const Clock& clock_;
  Mutex mu_;             // a leaf
  CondVar write_ended_;  // a write ended, or Stop
  uint64_t writes_ended_ GUARDED_BY(mu_) = 0;
  bool stopping_ GUARDED_BY(mu_) = false;
  Mover mover_;  // last: joined first
};

}  // namespace kvtier

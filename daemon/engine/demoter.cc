#include "daemon/engine/demoter.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "policy/demotion_target.h"

namespace kvtier {
namespace {

// Jobs the demoter may hold queued at once (its bytes bound it first).
constexpr size_t kDemoterJobs = 1 << 16;

}  // namespace

Demoter::Demoter(const std::vector<std::unique_ptr<TierLevel>>& below, uint64_t buffer_bytes, EngineCounters& counters,
                 Hooks hooks, const Clock& clock)
    : below_(below),
      counters_(counters),
      hooks_(std::move(hooks)),
      clock_(clock),
      mover_("engine.demoter", 1, buffer_bytes, kDemoterJobs) {}

void Demoter::Demote(size_t level, const NamespaceFingerprint& ns, const BlockKey& key, uint32_t layers,
                     std::span<const std::byte> bytes, uint64_t checksum) {
  hooks_.io_started();
  WriteToTier(level, ns, key, layers, bytes, checksum, [this, key](Status written) {
    if (written.ok()) Bump(counters_.demotions);
    CountFailedWrite(written);
    hooks_.finished(key, written);
    hooks_.io_finished();
  });
}

void Demoter::Stop() {
  MutexLock lock(mu_);
  stopping_ = true;
  write_ended_.NotifyAll();
}

void Demoter::CountFailedWrite(const Status& outcome) {
  switch (outcome.code()) {
    case StatusCode::kOk:
    case StatusCode::kAlreadyExists:  // the copy from an earlier demotion is still there
      return;
    case StatusCode::kBusy:  // counted as engine.demotion_busy_drops
      return;
    case StatusCode::kCorruption:  // the bytes changed after commit: not written
      Bump(counters_.demotion_corrupt);
      Bump(counters_.demotion_rejections);
      return;
    case StatusCode::kIoError:
    case StatusCode::kCancelled:
    case StatusCode::kUnavailable:
      Bump(counters_.demotion_failures);
      return;
    default:  // NoSpace (full), InvalidArgument (does not fit its geometry)
      Bump(counters_.demotion_rejections);
      return;
  }
}

void Demoter::WriteToTier(size_t level, const NamespaceFingerprint& ns, const BlockKey& key, uint32_t layers,
                          std::span<const std::byte> payload, uint64_t checksum, BlockTier::WriteDone done) {
  // Every end of a write wakes the demoter's waits for room.
  BlockTier::WriteDone ended = [this, done = std::move(done)](Status written) {
    {
      MutexLock lock(mu_);
      ++writes_ended_;
    }
    write_ended_.NotifyAll();
    done(std::move(written));
  };
  BlockTier& tier = *below_[level]->tier;
  Status accepted = tier.Write(ns, key, layers, payload, ended, checksum);
  if (accepted.code() != StatusCode::kBusy) {
    if (!accepted.ok()) ended(accepted);
    return;
  }
  // The tier is out of staging or writable regions for now. Nothing here
  // waits: a copy of the bytes waits in the demoter for room, or, when the
  // demoter is full too, the block is dropped (the host tier stays a
  // working cache even when the tier below stalls).
  const uint64_t size = payload.size();
  if (!mover_.TryReserve(size)) {
    Bump(counters_.demotion_busy_drops);
    return ended(Busy("the " + std::string(tier.name()) + " tier and the demoter are both full"));
  }
  std::shared_ptr<std::byte[]> copy(new std::byte[size]);
  std::memcpy(copy.get(), payload.data(), size);
  Bump(counters_.demotions_queued);
  mover_.Submit(size, [this, &tier, ns, key, layers, copy, size, checksum, ended = std::move(ended)] {
    WriteQueued(tier, ns, key, layers, std::span<const std::byte>(copy.get(), size), checksum, ended);
  });
}

void Demoter::WriteQueued(BlockTier& tier, const NamespaceFingerprint& ns, const BlockKey& key, uint32_t layers,
                          std::span<const std::byte> bytes, uint64_t checksum, const BlockTier::WriteDone& ended) {
  const uint64_t deadline_us = clock_.NowUs() + kQueuedDemotionWaitUs;
  for (;;) {
    uint64_t finished_before;
    {
      MutexLock lock(mu_);
      finished_before = writes_ended_;
    }
    // Erased while it waited: nothing to write. (An Erase from here on
    // finds the write in the tier, or FinishDemotion undoes it.)
    if (hooks_.erased(key)) return ended(Cancelled("block " + key.ToHex() + " was erased before its demotion"));
    Status accepted = tier.Write(ns, key, layers, bytes, ended, checksum);
    if (accepted.code() != StatusCode::kBusy) {
      if (!accepted.ok()) ended(accepted);
      return;
    }
    // Room comes back when a write in flight ends, or when the tier's own
    // background work (a region read out to the tier below) does, which
    // it does not signal: look again every kQueuedDemotionPollUs.
    bool give_up;
    {
      MutexLock lock(mu_);
      const uint64_t now_us = clock_.NowUs();
      give_up = stopping_ || now_us >= deadline_us;
      const uint64_t until_us = std::min(deadline_us, now_us + kQueuedDemotionPollUs);
      while (!give_up && writes_ended_ == finished_before && !stopping_ && clock_.NowUs() < until_us) {
        clock_.WaitUntilUs(mu_, write_ended_, until_us);
      }
    }
    if (give_up) {
      Bump(counters_.demotion_busy_drops);
      return ended(accepted);
    }
    Bump(counters_.demotion_waits);
  }
}

void Demoter::DemoteBelow(size_t from, const BlockTier::Evicted& block, std::span<const std::byte> payload) {
  const TierAdmission::Facts facts = hooks_.facts(block.key, block.hits);
  // The evictor's walk (ChooseDemotionTarget) over the tiers under `from`;
  // a block a lower tier evicts is never forced (no queue lookahead there).
  const size_t first = from + 1;
  const DemotionTarget choice = ChooseDemotionTarget(
      below_.size() - first, /*needed=*/false,
      [&](size_t level) { return below_[first + level]->tier->Find(block.key).has_value(); },
      [](size_t) { return false; },
      [&](size_t level) { return below_[first + level]->admission->Admit(payload.size(), facts); });
  if (choice.held_below) return;  // already there: nothing to write
  if (!choice.level) {
    Bump(below_[from]->demotion_drops);
    return;
  }
  const size_t level = first + *choice.level;
  TierLevel& b = *below_[level];
  hooks_.io_started();
  WriteToTier(level, block.ns, block.key, block.layer_count, payload, block.payload_checksum,
              [this, &b](Status written) {
                if (written.ok()) Bump(b.demotions_in);
                CountFailedWrite(written);
                hooks_.io_finished();
              });
}

}  // namespace kvtier

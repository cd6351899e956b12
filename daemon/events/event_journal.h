// EventJournal: the bounded buffer between the engine, which reports each
// block event with its locks held (BlockEvents::Emit), and the publisher
// thread, which takes them in order (Take). Emit never waits and never
// allocates past the bound: an event that finds the journal full is
// dropped and counted, and the Take that empties the queue says how many were lost after
// the events it returns (the publisher marks that gap in its sequence
// numbers, so a subscriber knows to ask for a snapshot).
//
// Thread-safe: one mutex, a leaf (nothing is called while it is held).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "common/mutex.h"
#include "daemon/engine/block_events.h"

namespace kvtier {

class EventJournal final : public BlockEvents {
 public:
  explicit EventJournal(size_t capacity_events) : capacity_(capacity_events) {}

  void Emit(const BlockEvent& event) override EXCLUDES(mu_);

  struct Taken {
    std::vector<BlockEvent> events;  // oldest first, at most `max`
    uint64_t dropped_after = 0;      // events lost to a full journal right after the last of these
  };
  Taken Take(size_t max) EXCLUDES(mu_);

  size_t capacity() const { return capacity_; }
  size_t queued() const EXCLUDES(mu_);
  uint64_t emitted() const EXCLUDES(mu_);
  uint64_t dropped() const EXCLUDES(mu_);

 private:
  const size_t capacity_;
  mutable Mutex mu_;
  std::deque<BlockEvent> queue_ GUARDED_BY(mu_);
  uint64_t pending_drops_ GUARDED_BY(mu_) = 0;  // dropped since the last Take
  uint64_t emitted_ GUARDED_BY(mu_) = 0;
  uint64_t dropped_ GUARDED_BY(mu_) = 0;
};

}  // namespace kvtier

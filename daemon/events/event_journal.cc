#include "daemon/events/event_journal.h"

#include <algorithm>

namespace kvtier {

void EventJournal::Emit(const BlockEvent& event) {
  MutexLock lock(mu_);
  ++emitted_;
  if (queue_.size() >= capacity_) {
    ++dropped_;
    ++pending_drops_;
    return;
  }
  queue_.push_back(event);
}

EventJournal::Taken EventJournal::Take(size_t max) {
  Taken out;
  MutexLock lock(mu_);
  const size_t n = std::min(max, queue_.size());
  out.events.assign(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(n));
  queue_.erase(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(n));
  // Events dropped while these waited came after them: the gap is reported
  // once the queue has been emptied up to it.
  if (queue_.empty()) {
    out.dropped_after = pending_drops_;
    pending_drops_ = 0;
  }
  return out;
}

size_t EventJournal::queued() const {
  MutexLock lock(mu_);
  return queue_.size();
}

uint64_t EventJournal::emitted() const {
  MutexLock lock(mu_);
  return emitted_;
}

uint64_t EventJournal::dropped() const {
  MutexLock lock(mu_);
  return dropped_;
}

}  // namespace kvtier

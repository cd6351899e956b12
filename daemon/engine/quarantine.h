// Quarantine: keys whose copy in one tier failed verification (its bytes
// did not match their checksum or MAC). A quarantined copy is never served:
// the tier's MeasuredTier hides the key from Find (so no lookup, pin,
// promotion or load reads it there), until the key is written to that
// tier again; the host tier drops a bad copy at once, and its quarantine
// only remembers the key until a client puts it again. Keys are listed by
// `kvtier health` (Engine::CheckHealth) and counted.
//
// Bounded: at most kMaxKeys keys; past it the oldest is let go (counted as
// an overflow): a disk going bad must not grow the daemon without bound.
//
// Thread-safe: its own mutex (a leaf lock, taken under a shard's lock by
// Find); Contains costs one atomic load while it is empty.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/counters.h"
#include "common/mutex.h"
#include "kvtier/block_key.h"

namespace kvtier {

class Quarantine {
 public:
  static constexpr size_t kMaxKeys = 65536;
  explicit Quarantine(size_t max_keys = kMaxKeys) : max_keys_(max_keys == 0 ? 1 : max_keys) {}

  // Puts `key` in quarantine (again: it stays, not counted twice).
  void Add(const BlockKey& key) EXCLUDES(mu_);
  // Lets `key` go (it was written again); false when it was not in.
  bool Release(const BlockKey& key) EXCLUDES(mu_);
  bool Contains(const BlockKey& key) const EXCLUDES(mu_);
  size_t size() const { return size_.load(std::memory_order_acquire); }
  // The most recently quarantined keys, newest first, at most `max`.
  std::vector<BlockKey> Newest(size_t max) const EXCLUDES(mu_);
  // tier.quarantined<label> (gauge), tier.quarantine_added<label>,
  // tier.quarantine_released<label>, tier.quarantine_overflows<label>.
  void VisitCounters(CounterVisitor& v, const std::string& label) const;

 private:
  const size_t max_keys_;
  mutable Mutex mu_;
  // Each key with the sequence number of its Add; order_ holds (key,
  // sequence) oldest first, stale pairs (released, or added again) skipped.
  std::unordered_map<BlockKey, uint64_t> keys_ GUARDED_BY(mu_);
  std::deque<std::pair<BlockKey, uint64_t>> order_ GUARDED_BY(mu_);
  uint64_t next_ GUARDED_BY(mu_) = 0;
  std::atomic<size_t> size_{0};
  std::atomic<int64_t> added_{0}, released_{0}, overflows_{0};
};

}  // namespace kvtier

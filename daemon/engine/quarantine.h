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
// With a lifetime, a key is let go that long after it came in (for a tier
// others write too, the remote cluster or a peer's memory, whose good copy
// this daemon would never learn of otherwise).
//
// Thread-safe: its own mutex (a leaf lock, taken under a shard's lock by
// Find); Contains costs one atomic load while it is empty.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
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
  // `lifetime_us` 0: a key stays until released (or pushed out); `clock`:
  // microseconds now (monotonic), needed only with a lifetime.
  explicit Quarantine(size_t max_keys = kMaxKeys, uint64_t lifetime_us = 0, std::function<uint64_t()> clock = {})
      : max_keys_(max_keys == 0 ? 1 : max_keys), lifetime_us_(lifetime_us), clock_(std::move(clock)) {}

  // Puts `key` in quarantine (again: it stays, not counted twice).
  void Add(const BlockKey& key) EXCLUDES(mu_);

  // For a tier whose reads may end after a write replaced the copy they
  // read (MeasuredTier): without this, a late read of a bad copy would
  // quarantine the good one written meanwhile. WriteSequence() as a read
  // starts; NoteWritten(key) as a write of `key` lands (it also releases
  // the key); AddUnlessWrittenSince(key, sequence) as a read that started
  // at `sequence` fails verification: the key goes in unless a write of it
  // landed since (the failure was the old copy's), or more than kWriteLog
  // writes did (it cannot tell: the key stays out, and the next read that
  // fails puts it in). Returns whether the key went in.
  static constexpr size_t kWriteLog = 4096;
  uint64_t WriteSequence() const { return writes_.load(std::memory_order_acquire); }
  void NoteWritten(const BlockKey& key) EXCLUDES(mu_);
  bool AddUnlessWrittenSince(const BlockKey& key, uint64_t sequence) EXCLUDES(mu_);
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
  // With a lifetime: drops the keys past it, oldest first.
  void Expire() REQUIRES(mu_);
  void AddLocked(const BlockKey& key) REQUIRES(mu_);

  const size_t max_keys_;
  const uint64_t lifetime_us_;
  const std::function<uint64_t()> clock_;
  mutable Mutex mu_;
  // Each key with the sequence number of its Add; order_ holds the Adds
  // oldest first, stale ones (released, or added again) skipped.
  struct Added {
    BlockKey key;
    uint64_t sequence = 0;
    uint64_t at_us = 0;  // with a lifetime: when
  };
  // Whether `a` is the key's current Add.
  bool Live(const Added& a) const REQUIRES(mu_);
  std::unordered_map<BlockKey, Added> keys_ GUARDED_BY(mu_);  // each key's current Add
  std::deque<Added> order_ GUARDED_BY(mu_);
  uint64_t next_ GUARDED_BY(mu_) = 0;
  // The keys of the last kWriteLog NoteWritten calls, write i at
  // i % kWriteLog (sized at the first); writes_ counts them (changed under
  // mu_, read without it by WriteSequence).
  std::vector<BlockKey> write_log_ GUARDED_BY(mu_);
  std::atomic<uint64_t> writes_{0};
  std::atomic<size_t> size_{0};
  std::atomic<int64_t> added_{0}, released_{0}, overflows_{0};
};

}  // namespace kvtier

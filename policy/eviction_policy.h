// Eviction policies: pure, synchronous bookkeeping that names the next
// victim. They never do I/O and never see block bytes; time is passed in.
// The daemon's engine and the replay tool drive the same classes.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>

namespace kvtier {

// An engine-assigned id of one evictable block copy in one tier. Unique
// among the handles a policy instance tracks at one time.
using BlockHandle = uint64_t;

// The block a policy would evict next. `rank` orders candidates of
// different instances of the same policy (an engine has one per shard): the
// lowest rank goes first. LRU and FIFO rank by the time of the last use or
// of the insertion.
struct EvictionCandidate {
  BlockHandle handle = 0;
  uint64_t rank = 0;
};

// Not thread-safe: each engine shard owns its instances and calls them under
// its own mutex. A tracked handle is one that is evictable right now: the
// engine removes a block while it is pinned or being written, and inserts it
// again afterwards.
class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;

  // Starts tracking `h`. Precondition: not tracked.
  virtual void OnInsert(BlockHandle h, uint64_t now_us) = 0;
  // Records a use of `h`. Ignored if `h` is not tracked.
  virtual void OnAccess(BlockHandle h, uint64_t now_us) = 0;
  // Stops tracking `h`. Ignored if `h` is not tracked.
  virtual void OnRemove(BlockHandle h) = 0;
  // The block to evict first, without removing it; nullopt when empty.
  virtual std::optional<EvictionCandidate> Victim() const = 0;

  virtual size_t size() const = 0;
  virtual std::string_view name() const = 0;
};

// Least recently used (insert and access make a block most recent). O(1).
std::unique_ptr<EvictionPolicy> MakeLruPolicy();
// First in, first out (accesses do not reorder). O(1).
std::unique_ptr<EvictionPolicy> MakeFifoPolicy();

}  // namespace kvtier

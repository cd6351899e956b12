// Eviction policies: pure, synchronous bookkeeping that names the next
// victim. They never do I/O and never see block bytes; time is passed in.
// The daemon's engine and the replay tool drive the same classes.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>

#include "kvtier/block_key.h"

namespace kvtier {

// An engine-assigned id of one evictable block copy in one tier. Unique
// among the handles a policy instance tracks at one time.
using BlockHandle = uint64_t;

// One block of a queued request's chain: its key and its depth in the chain
// (0: the root).
struct QueuedBlock {
  BlockKey key;
  uint32_t depth = 0;
};

// The block a policy would evict next. `rank` orders candidates of
// different instances of the same policy (an engine has one per shard): the
// lowest rank goes first. LRU and FIFO rank by the time of the last use or
// of the insertion.
struct EvictionCandidate {
  BlockHandle handle = 0;
  uint64_t rank = 0;
};

// Not thread-safe: each engine shard owns its instances and calls them under
// its own mutex. A tracked block is evictable unless it is pinned: the
// engine calls OnPin when a block gets its first lease and OnUnpin when the
// last one goes, and a pinned block is never named by Victim().
class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;

  // Starts tracking `h` (a block that just became visible). Precondition:
  // not tracked.
  virtual void OnInsert(BlockHandle h, uint64_t now_us) = 0;
  // Records a use of `h`. Ignored if `h` is not tracked.
  virtual void OnAccess(BlockHandle h, uint64_t now_us) = 0;
  // `h` may not be evicted until OnUnpin. Ignored if not tracked.
  virtual void OnPin(BlockHandle h) = 0;
  // `h` is evictable again; the pin counts as a use at `now_us` for
  // policies that order by use. Ignored if not tracked or not pinned.
  virtual void OnUnpin(BlockHandle h, uint64_t now_us) = 0;
  // Stops tracking `h`, pinned or not. Ignored if `h` is not tracked.
  virtual void OnRemove(BlockHandle h) = 0;
  // The unpinned block to evict first, without removing it; nullopt when
  // every tracked block is pinned or none is tracked.
  virtual std::optional<EvictionCandidate> Victim() const = 0;

  // Tracked blocks, pinned ones included.
  virtual size_t size() const = 0;
  virtual std::string_view name() const = 0;

  // Queue hints from the inference engine's scheduler. Only queue_aware
  // uses them; the defaults make LRU and FIFO ignore them.
  // OnInsert for a block whose key queue hints may name.
  virtual void OnInsertKeyed(BlockHandle h, const BlockKey& key, uint64_t now_us) { OnInsert(h, now_us); }
  // Request `request` (of conversation `session`, 0: none) is queued to
  // start at `expected_start_us` and needs `blocks` (this instance's share
  // of its chain). Again with the same id replaces it.
  virtual void OnEnqueue(uint64_t request, std::span<const QueuedBlock> blocks, uint64_t expected_start_us,
                         uint64_t session) {}
  // The request started, finished or was dropped. Unknown ids are ignored.
  virtual void OnDequeue(uint64_t request) {}
  virtual void OnSessionOpened(uint64_t session) {}
  virtual void OnSessionClosed(uint64_t session) {}
  // Whether `h` is needed by a queued request expected to start before
  // now + window: the engine must then demote it, never drop it.
  virtual bool NeededWithin(BlockHandle h, uint64_t now_us, uint64_t window_us) const { return false; }

  // What an adaptive policy has learned of the workload, as a share of its
  // capacity in [0, 1] (ARC: T1's target p / c); nullopt for a policy that
  // learns nothing. A new instance can start from what a simulation of the
  // same policy learned (ExpertPanel::Rebuild); the others ignore the set.
  virtual std::optional<double> learned_share() const { return std::nullopt; }
  virtual void SetLearnedShare(double share) {}
};

// Least recently used: insert, access and unpin make a block most recent.
// Every operation O(1).
std::unique_ptr<EvictionPolicy> MakeLruPolicy();
// First in, first out by insertion time: accesses and pins do not reorder.
// Insert, unpin and remove O(log n); the rest O(1).
std::unique_ptr<EvictionPolicy> MakeFifoPolicy();
// LRU-2 (LRU-K, K = 2; lru_k_policy.cc): blocks used once go first, least
// recently used first; then blocks used twice or more, the oldest
// second-to-last use first. A use is an access or the end of a pin. Remembers
// the last use of up to 8 x size() removed keyed blocks (OnInsertKeyed), so one
// inserted again counts as used twice. rank: the last use for a once-used
// block, (1 << 63) | the second-to-last use for the others (63 bits of
// time). Insert, access and unpin O(log n) (amortised O(1) when times
// arrive in order); pin and remove O(1); victim amortised O(log n).
std::unique_ptr<EvictionPolicy> MakeLru2Policy();
// S3-FIFO (s3fifo_policy.cc): a small FIFO queue (10% of the tracked
// blocks) that one-use blocks leave by eviction, a main FIFO queue that
// blocks used twice in the small one (or found in the ghost queue) enter
// and leave once their uses (up to 3, one spent per round) run out, and a
// ghost queue of keys evicted from the small queue, bounded by the main
// queue's share (90% of the tracked blocks). Capacity = size(). Victim()
// moves blocks between the queues on mutable state (logically const).
// rank: the time the victim entered its queue; small-queue victims below
// (1 << 63), main-queue victims (1 << 63) | time. Insert, access O(1)
// amortised; pin, unpin, remove O(log n); victim amortised O(log n).
std::unique_ptr<EvictionPolicy> MakeS3FifoPolicy();
// ARC (arc_policy.cc): LRU lists T1 (used once) and T2 (used again), ghost
// key lists B1 and B2 (|B1| + |B2| <= c), T1's target p in [0, c] adapted
// by ghost hits; capacity c = size(). Victim: T1's LRU block when T1 is
// above p, else T2's. rank: the time the victim became MRU of its list;
// T1 victims below (1 << 63), T2 victims (1 << 63) | time. Every
// operation O(1).
std::unique_ptr<EvictionPolicy> MakeArcPolicy();
// The policy of that name in the registry (policy_registry.h, which
// defines this); null for a name not in it.
std::unique_ptr<EvictionPolicy> MakeEvictionPolicy(std::string_view name);

}  // namespace kvtier

// Reclaim policies of a log-structured tier (the NVMe tier's eviction):
// the tier frees whole regions, oldest first, and may copy some blocks of
// the region about to go forward into the open region (reinsertion) so
// that reclaim drops only what is least worth keeping. This decides which,
// in what order; the tier supplies the facts and a byte budget.
//
//   fifo         nothing is copied: the oldest region's blocks all go
//   lru          blocks read since they were written, the most read first
//   queue_aware  blocks a queued request needs first (the most read first
//                among them), then lru's
//   lru2, s3fifo, arc
//                the eviction policy of that name (MakeEvictionPolicy), fed
//                the tier's own writes, reads and drops (ReclaimPolicy),
//                evicts as many blocks as it tracks in the region; those
//                of the region it spares are copied, the most read first
//
// A log cannot evict the block a policy names: only the oldest region's
// space comes free. So for the classic orders the policy's victims that
// live in other regions stay readable in the log until their own region
// goes (the policy no longer tracks them, and their region's reclaim copies
// none of them); a read of one gives it back to the policy as a
// re-insertion of its key (a ghost or history hit). Each block the policy
// spares in the region thus costs it one victim elsewhere, and the policy
// holds as many blocks as if it had evicted the region itself.
//
// Pure and synchronous like every policy; O(b log b) for b candidates,
// plus b victims of the policy (each its Victim() and OnRemove) for the
// classic orders.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kvtier/block_key.h"
#include "policy/eviction_policy.h"

namespace kvtier {

enum class ReclaimOrder : uint8_t { kFifo, kLru, kQueueAware, kLru2, kS3Fifo, kArc };

// The order of each eviction policy in the registry (policy_registry.h);
// nullopt for any other name.
std::optional<ReclaimOrder> ParseReclaimOrder(std::string_view name);
std::string_view ReclaimOrderName(ReclaimOrder order);
// The names ParseReclaimOrder accepts, "|"-separated (for messages).
std::string_view ReclaimOrderChoices();

struct ReclaimCandidate {
  BlockKey key;
  uint64_t hits = 0;          // reads since it was written
  bool needed = false;        // a queued request names it (queue_aware only)
  uint64_t offset = 0;        // where its record lies: PlanReclaimTurn breaks ties in log order
  uint64_t record_bytes = 0;  // what copying it forward writes (PlanReclaimTurn's budget)
};

// The candidates worth copying forward, most deserving first, for fifo,
// lru and queue_aware (stateless). The classic orders need a
// ReclaimPolicy; here they copy nothing.
std::vector<ReclaimCandidate> ChooseReinsertions(std::vector<ReclaimCandidate> candidates, ReclaimOrder order);

// A tier's reclaim order with the state it needs: for lru2, s3fifo and arc
// an EvictionPolicy of that name whose handles are the tier's blocks; for
// fifo, lru and queue_aware nothing (the events are no-ops and Choose is
// ChooseReinsertions).
//
// The tier reports every block's life: OnWritten when it becomes readable
// (a Write, or found at start-up; never a reinsertion, which moves a block
// the policy goes on tracking), OnRead for every verified read, OnDropped
// when it leaves (reclaimed, erased, found corrupt). Times are the tier
// clock's microseconds. A use, for the policy, is a read; the write is the
// insertion (what LRU-2 counts as the first use, S3-FIFO and ARC as the
// entry into the small queue or T1).
//
// Not thread-safe: the tier calls it under its own mutex.
class ReclaimPolicy {
 public:
  explicit ReclaimPolicy(ReclaimOrder order);
  ~ReclaimPolicy();
  ReclaimPolicy(const ReclaimPolicy&) = delete;
  ReclaimPolicy& operator=(const ReclaimPolicy&) = delete;

  ReclaimOrder order() const { return order_; }

  // `key` is readable now. A key the policy tracks already is ignored.
  void OnWritten(const BlockKey& key, uint64_t now_us);
  // A verified read of `key`, a block the tier holds. One the policy
  // evicted (still in the log) comes back to it as a re-insertion of its
  // key, which its ghosts or history may recognise; the insertion
  // stands for the read (no separate use).
  void OnRead(const BlockKey& key, uint64_t now_us);
  // `key` left the tier. Unknown keys are ignored.
  void OnDropped(const BlockKey& key);

  // The region about to be reclaimed holds `candidates`; returns those
  // worth copying forward, most deserving first (the tier copies them in
  // that order while its budget lasts; the rest go with the region).
  // fifo, lru, queue_aware: ChooseReinsertions. lru2, s3fifo, arc: the
  // policy evicts (Victim, OnRemove) as many blocks as it tracks among
  // `candidates`, wherever they are; the tracked candidates it did not
  // evict are returned, the most read first (ties in the order given).
  std::vector<ReclaimCandidate> Choose(std::vector<ReclaimCandidate> candidates);

  // Blocks the policy tracks (0 for fifo, lru, queue_aware).
  size_t tracked_blocks() const { return keys_.size(); }
  // Candidates the policy spared in all Choose calls so far.
  int64_t spared() const { return spared_; }

 private:
  void Track(const BlockKey& key, uint64_t now_us);
  void Forget(BlockHandle handle);

  const ReclaimOrder order_;
  std::unique_ptr<EvictionPolicy> policy_;  // null for fifo, lru, queue_aware
  std::unordered_map<BlockKey, BlockHandle> handles_;
  std::unordered_map<BlockHandle, BlockKey> keys_;
  BlockHandle next_handle_ = 1;
  int64_t spared_ = 0;
};

// The reinsertion budget of a log-structured tier: a token bucket that
// every record a client write stores fills with `share` of its bytes,
// holding at most `cap_bytes` (the tier uses one region); a record copied
// forward takes its bytes. share 0: reinsertion is off.
class ReinsertBudget {
 public:
  ReinsertBudget(double share, uint64_t cap_bytes) : share_(share), cap_(double(cap_bytes)) {}
  bool enabled() const { return share_ > 0; }
  // A client write (not a reinsertion) stored `record_bytes`.
  void OnWrite(uint64_t record_bytes);
  // Takes `record_bytes` when the bucket holds them; false (nothing taken) otherwise.
  bool Take(uint64_t record_bytes);
  double bytes() const { return bytes_; }

 private:
  const double share_;
  const double cap_;
  double bytes_ = 0;
};

// One reclaim turn: what happens to the blocks of the region reclaim takes
// next, before it goes.
struct ReclaimTurn {
  std::vector<ReclaimCandidate> reinsert;  // copy forward, in this order
  std::vector<ReclaimCandidate> evict;     // leave with the region (offered to the tier below), log order
  int64_t over_budget = 0;                 // chosen by the policy, left for want of budget
  int64_t needed = 0;                      // of `reinsert`, those a queued request needs
};

// The decision of a turn, the same in the NVMe tier and the replay
// simulator: the candidates are put in log order (offset); with the budget
// enabled, `policy` chooses (ReclaimPolicy::Choose) and each chosen record
// is copied forward while the budget pays for it (one it cannot pay for is
// skipped, a smaller one after it may still fit); every other candidate is
// evicted. Without the budget nothing is chosen (and the policy is not
// asked, so its state does not move) and all are evicted.
ReclaimTurn PlanReclaimTurn(std::vector<ReclaimCandidate> candidates, ReclaimPolicy& policy, ReinsertBudget& budget);

}  // namespace kvtier

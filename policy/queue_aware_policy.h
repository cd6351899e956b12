// QueueAwarePolicy: eviction that knows the engine's request queue
// (DESIGN.md section 5). The inference engine reports queued requests (id,
// the key chain of their prompt, expected start); a block's next use is the
// earliest expected start among queued requests containing it.
//
// Victim order (first evicted first):
//   1. blocks no queued request needs, ordered by: blocks of closed
//      sessions first, then fewer uses, then least recently used, then the
//      deeper in its chain (children before parents);
//   2. then blocks some queued request needs, the furthest next use first,
//      deeper first among equals.
// NeededWithin(h, now, window) tells the engine a block is needed inside
// the look-ahead window: such a victim must be demoted, never dropped.
//
// Blocks inserted without a key (plain OnInsert) are never matched by a
// queued request and count as depth 0.
//
// Costs (n tracked blocks, k queued requests containing a key): insert,
// access, pin, unpin, remove O(log n), victim O(1); OnEnqueue O(c (log k +
// log n)) for c blocks; OnDequeue the same; a session hint O(s log n) for
// its s blocks. Not thread-safe, like every policy.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kvtier/block_key.h"
#include "policy/eviction_policy.h"

namespace kvtier {

class QueueAwarePolicy final : public EvictionPolicy {
 public:
  // EvictionPolicy. `rank` for comparing shards: the victim order packed
  // into 64 bits (group, closed, uses up to 255, 54 bits of time in us), so
  // across shards the order is that of this comment up to 255 uses and
  // except the depth tie-break.
  void OnInsert(BlockHandle h, uint64_t now_us) override;
  void OnAccess(BlockHandle h, uint64_t now_us) override;
  void OnPin(BlockHandle h) override;
  void OnUnpin(BlockHandle h, uint64_t now_us) override;
  void OnRemove(BlockHandle h) override;
  std::optional<EvictionCandidate> Victim() const override;
  size_t size() const override { return blocks_.size(); }
  std::string_view name() const override { return "queue_aware"; }

  // Starts tracking `h` holding `key`, at `depth` in its chain (0: the
  // root), of conversation `session` (0: none). Precondition: `h` not tracked.
  void OnInsertKeyed(BlockHandle h, const BlockKey& key, uint32_t depth, uint64_t session, uint64_t now_us);
  // The same with the depth and session a queued request gave the key
  // (0 and none when no queued request names it).
  void OnInsertKeyed(BlockHandle h, const BlockKey& key, uint64_t now_us) override;

  // A request waits in the engine's queue, expected to start at
  // `expected_start_us`, needing `blocks`; a tracked block takes the depth
  // given here and, if it had none, the session. Again with the same id
  // replaces it.
  void OnEnqueue(uint64_t request, std::span<const QueuedBlock> blocks, uint64_t expected_start_us,
                 uint64_t session) override;
  // OnEnqueue of a whole chain (depth = position), no session.
  void Enqueue(uint64_t request, std::span<const BlockKey> chain, uint64_t expected_start_us);
  // The request started, finished or was dropped: its blocks no longer wait
  // for it. Unknown ids are ignored.
  void OnDequeue(uint64_t request) override { Dequeue(request); }
  void Started(uint64_t request) { Dequeue(request); }
  void Finished(uint64_t request) { Dequeue(request); }
  // Blocks of `session` count as of a closed session (evicted first among
  // the unneeded) until it opens again.
  void OnSessionClosed(uint64_t session) override { SetSessionClosed(session, true); }
  void OnSessionOpened(uint64_t session) override { SetSessionClosed(session, false); }
  void CloseSession(uint64_t session) { SetSessionClosed(session, true); }

  // The earliest expected start of a queued request containing `h`'s key.
  std::optional<uint64_t> NextUse(BlockHandle h) const;
  // Whether `h` is needed by a request expected to start before now + window.
  bool NeededWithin(BlockHandle h, uint64_t now_us, uint64_t window_us) const override;
  size_t queued_requests() const { return requests_.size(); }

 private:
  // The sort key of an unpinned block in order_.
  struct Order {
    uint8_t group = 0;    // 0: no queued request needs it; 1: one does
    uint8_t open = 0;     // group 0: 0 closed session, 1 otherwise
    uint32_t uses = 0;    // group 0: fewer first
    uint64_t time = 0;    // group 0: last use; group 1: ~next use (furthest first)
    uint32_t shallow = 0; // ~depth: deeper first
    BlockHandle handle = 0;
    friend auto operator<=>(const Order&, const Order&) = default;
  };
  struct Block {
    std::optional<BlockKey> key;
    uint32_t depth = 0;
    uint64_t session = 0;
    uint32_t uses = 0;
    uint64_t last_use_us = 0;
    bool closed = false;
    bool pinned = false;
    Order order;  // valid while !pinned
  };
  struct Request {
    std::vector<BlockKey> keys;
    uint64_t start_us = 0;
  };
  // What queued requests say of a key.
  struct KeyUses {
    std::multiset<uint64_t> starts;
    uint32_t depth = 0;
    uint64_t session = 0;
  };

  Order OrderOf(const Block& b, BlockHandle h) const;
  // Re-files `h` after its state changed (no-op while pinned).
  void Refile(BlockHandle h, Block& b);
  void RefileKey(const BlockKey& key);
  void Dequeue(uint64_t request);
  void SetSessionClosed(uint64_t session, bool closed);
  static uint64_t Rank(const Order& o);

  std::unordered_map<BlockHandle, Block> blocks_;
  std::set<Order> order_;                                 // unpinned blocks, begin = first victim
  std::unordered_map<BlockKey, BlockHandle> by_key_;
  std::unordered_map<BlockKey, KeyUses> next_uses_;  // keys named by queued requests
  std::unordered_map<uint64_t, Request> requests_;
  std::unordered_map<uint64_t, std::unordered_set<BlockHandle>> sessions_;
};

std::unique_ptr<QueueAwarePolicy> MakeQueueAwarePolicy();

}  // namespace kvtier

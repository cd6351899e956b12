// QueueAwarePolicy: eviction that knows the engine's request queue
// (docs/POLICIES.md), the daemon's default. The inference engine reports
// queued requests (id, the key chain of their prompt, expected start,
// conversation) and closed conversations; a block's next use is the
// earliest expected start among queued requests containing it.
//
// Knowledge comes in three grades, and the victim order (first evicted
// first) uses each where it is strong:
//   1. blocks of closed conversations (no queued request needs them):
//      nothing will read them again except another conversation sharing
//      the prefix, so they go first, least recently used first, deeper
//      first among equals. A block two conversations' hints name is shared
//      and never counts as of a closed conversation;
//   2. the rest of the unneeded blocks, open conversations' tails among
//      them: in the order of ExpertPanel (expert_panel.h), the classic
//      policy (LRU, LRU-2, ARC) that would be hitting most on the
//      workload seen lately;
//   3. blocks some queued request needs: the furthest next use first,
//      deeper first among equals, as the offline optimum would.
// Without hints (no queue, no closed conversations) the order is the
// panel's alone. NeededWithin(h, now, window) tells the engine a block is
// needed inside the look-ahead window: such a victim must be demoted,
// never dropped.
//
// Uses: an OnAccess, the end of a pin (OnUnpin: the engine pins a block to
// read it) and an insertion each reference the block's key for the
// panel's shadows and count as a use in its real instance. A block that
// returns to group 2 from a tree (its last queued request started,
// finished or was dropped, or its conversation reopened) counts a use at
// the latest time the policy was given: the request that runs is about to
// read it. While in a tree a block keeps its place in the panel's real
// instance (taking it out on every hint would cost a call more); the first
// time the panel names it as a victim it is held out of its order until it
// returns. Blocks inserted without a key (plain OnInsert) are never
// matched by a queued request, count as depth 0 and are not seen by the
// shadows.
//
// Costs (n tracked blocks, m needed, c closed-conversation blocks, k
// queued requests naming a key): insert, access, pin, unpin and remove
// cost one call on the panel's real instance, plus 3 shadow calls for a
// sampled key, plus O(log m) or O(log c) for a needed or closed block;
// victim the leader's victim, plus a hold for each block of a tree it
// names first, plus the panel's rebuild (O(n log n)) after a change of
// leader; OnEnqueue of c keys O(c (k + log m)); OnDequeue the same; a
// session hint O(s log c) for its s blocks. Not thread-safe, like every
// policy.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kvtier/block_key.h"
#include "policy/eviction_policy.h"
#include "policy/expert_panel.h"

namespace kvtier {

class QueueAwarePolicy final : public EvictionPolicy {
 public:
  // EvictionPolicy. `rank` for comparing shards: the group in the top two
  // bits, then within group 1 the last use, within group 2 the leader's
  // own rank (its band bit moved from 63 to 61, 61 bits of time), within
  // group 3 the complement of the next use; shards with the same leader
  // order as one policy would, except the depth tie-break.
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
  // Blocks of `session` count as of a closed conversation until it opens
  // again.
  void OnSessionClosed(uint64_t session) override { SetSessionClosed(session, true); }
  void OnSessionOpened(uint64_t session) override { SetSessionClosed(session, false); }
  void CloseSession(uint64_t session) { SetSessionClosed(session, true); }

  // The earliest expected start of a queued request containing `h`'s key.
  std::optional<uint64_t> NextUse(BlockHandle h) const;
  // Whether `h` is needed by a request expected to start before now + window.
  bool NeededWithin(BlockHandle h, uint64_t now_us, uint64_t window_us) const override;
  size_t queued_requests() const { return requests_.size(); }
  // The panel's current leader ("lru", "lru2" or "arc").
  std::string_view leader() const { return panel_.expert_name(panel_.leader()); }

 private:
  struct Block;
  // The expected starts of the queued requests naming a key, ascending:
  // a pointer while none does (most keys), so that they cost 8 bytes.
  class Starts {
   public:
    bool empty() const { return list_ == nullptr; }
    uint64_t front() const { return list_->front(); }  // precondition: !empty()
    void Insert(uint64_t start_us);
    // Removes one `start_us`; false when there is none.
    bool Erase(uint64_t start_us);

   private:
    std::unique_ptr<std::vector<uint64_t>> list_;  // null or non-empty
  };
  // What queue hints and the cache say of one key. Lives while a block
  // holds the key or a queued request names it.
  struct KeyEntry {
    Block* block = nullptr;  // the tracked block holding the key
    Starts starts;
    uint64_t session = 0;  // from the latest hint naming it with a session
    uint32_t depth = 0;    // from the latest hint naming it
    bool shared = false;   // two conversations named it (hints, or a hint and the insertion): never closed
  };
  using KeyNode = std::pair<const BlockKey, KeyEntry>;
  // The sort key of a block in one of the two trees: `order` is the last
  // use in the closed group's, ~the next use (the furthest first) in the
  // needed group's; `shallow` = ~depth.
  struct TreeOrder {
    uint64_t order = 0;
    uint32_t shallow = 0;
    BlockHandle handle = 0;
    friend auto operator<=>(const TreeOrder&, const TreeOrder&) = default;
  };
  using Tree = std::set<TreeOrder>;
  // Where a block is ordered: pinned by the engine (nowhere), the panel
  // (group 2), or one of the trees (groups 1 and 3).
  enum class Group : uint8_t { kPinned, kPanel, kClosed, kNeeded };
  struct Block {
    BlockHandle handle = 0;
    KeyNode* key = nullptr;  // null: inserted without a key
    uint64_t session = 0;
    uint64_t time = 0;             // last use
    ExpertPanel::Uses panel_uses;  // the uses the panel's real instance saw
    uint32_t depth = 0;
    bool closed = false;
    bool pinned = false;
    // Pinned in the panel's real instance: at once for an engine pin, and
    // for a block in a tree once the panel names it (Victim() sets it).
    mutable bool held = false;
    Group group = Group::kPanel;
    Block* session_prev = nullptr;  // the blocks of its session
    Block* session_next = nullptr;
    Tree::iterator tree_at;  // in closed_ (kClosed) or needed_ (kNeeded)
  };
  struct Request {
    std::vector<BlockKey> keys;
    uint64_t start_us = 0;
  };

  static bool Needed(const Block& b) { return b.key != nullptr && !b.key->second.starts.empty(); }
  Group GroupOf(const Block& b) const;
  TreeOrder NeededOrderOf(const Block& b) const;
  // Moves `b` to the group its state names; a return to the panel counts
  // as a use at `use_us`.
  void Refile(Block& b, uint64_t use_us);
  void Use(Block& b, uint64_t now_us);
  // Gives the panel its new leader's real instance when it waits for one.
  void RebuildPanelIfWanted() const;
  void AddStart(const QueuedBlock& qb, uint64_t start_us, uint64_t session);
  void RemoveStart(const BlockKey& key, uint64_t start_us);
  void JoinSession(Block& b, uint64_t session);
  void LinkSession(Block& b, uint64_t session);
  void UnlinkSession(Block& b);
  void Dequeue(uint64_t request);
  void SetSessionClosed(uint64_t session, bool closed);

  std::unordered_map<BlockHandle, Block> blocks_;
  std::unordered_map<BlockKey, KeyEntry> keys_;
  mutable ExpertPanel panel_;  // Victim() tells it the capacity
  Tree closed_;
  Tree needed_;
  std::unordered_map<uint64_t, Block*> sessions_;  // session -> first of its blocks
  std::unordered_map<uint64_t, Request> requests_;
  uint64_t latest_us_ = 0;  // the latest time passed in
};

std::unique_ptr<QueueAwarePolicy> MakeQueueAwarePolicy();

}  // namespace kvtier

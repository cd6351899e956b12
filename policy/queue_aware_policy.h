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
// queued request and count as depth 0. A use is an OnAccess or the end of
// a pin (OnUnpin: the engine pins a block to read it); uses count up to 255. Among equal
// keys the block whose last use was recorded first goes first.
//
// Two events count as a use at the latest time the policy was given (the
// use count does not change): a block leaving the needed group (its last
// queued request started, finished or was dropped; the request that ran
// touches it anyway) and a block whose session reopens. Both return blocks
// to the tail of the recency order in O(1), where restoring their old place
// would cost a walk over every block used since.
//
// Layout: closed-session blocks in a tree; open unneeded blocks in one
// recency list per use count (0..255) with a bitmap of the non-empty ones;
// needed blocks in a tree by next use. Tree nodes are recycled.
//
// Costs (n tracked blocks, m needed, c closed-session blocks, k queued
// requests naming a key): insert, access, unpin O(1) when times arrive in
// order (a time older than the newest in the list walks back over the
// newer ones), O(log m) or O(log c) when the block is needed or closed;
// pin and remove O(1) (O(log) for a needed or closed block); victim O(1);
// OnEnqueue of c keys O(c (k + log m)); OnDequeue the same; a session hint
// O(s log c) for its s blocks. Not thread-safe, like every policy.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kvtier/block_key.h"
#include "policy/eviction_policy.h"

namespace kvtier {

class QueueAwarePolicy final : public EvictionPolicy {
 public:
  // EvictionPolicy. `rank` for comparing shards: the victim order packed
  // into 64 bits (group, closed, uses up to 255, 54 bits of time in us), so
  // across shards the order is that of this comment except the depth
  // tie-break.
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
  struct Block;
  // What queue hints and the cache say of one key. Lives while a block
  // holds the key or a queued request names it.
  struct KeyEntry {
    Block* block = nullptr;        // the tracked block holding the key
    std::vector<uint64_t> starts;  // expected starts of queued requests naming it, ascending
    uint32_t depth = 0;            // from the latest hint naming it
    uint64_t session = 0;          // from the latest hint naming it with a session
  };
  using KeyNode = std::pair<const BlockKey, KeyEntry>;
  // Sort keys of the two tree-ordered groups; `shallow` = ~depth.
  struct ClosedOrder {
    uint32_t uses = 0;
    uint64_t time = 0;
    uint32_t shallow = 0;
    uint64_t seq = 0;
    BlockHandle handle = 0;
    friend auto operator<=>(const ClosedOrder&, const ClosedOrder&) = default;
  };
  struct NeededOrder {
    uint64_t later = 0;  // ~next use: the furthest first
    uint32_t shallow = 0;
    BlockHandle handle = 0;
    friend auto operator<=>(const NeededOrder&, const NeededOrder&) = default;
  };
  using ClosedSet = std::set<ClosedOrder>;
  using NeededSet = std::set<NeededOrder>;
  // Where an unpinned block is filed.
  enum class Place : uint8_t { kNone, kOpen, kClosed, kNeeded };
  struct Block {
    BlockHandle handle = 0;
    KeyNode* key = nullptr;  // null: inserted without a key
    uint64_t session = 0;
    uint64_t time = 0;  // last use
    uint64_t seq = 0;   // when `time` was set: the last tie-break
    uint32_t depth = 0;
    uint32_t uses = 0;
    bool closed = false;
    bool pinned = false;
    Place place = Place::kNone;
    Block* prev = nullptr;  // kOpen: neighbours in its list
    Block* next = nullptr;
    Block* session_prev = nullptr;  // the blocks of its session
    Block* session_next = nullptr;
    ClosedSet::iterator closed_at;  // kClosed
    NeededSet::iterator needed_at;  // kNeeded
  };
  // Open, unneeded blocks with one use count, ordered by (time, deeper
  // first, seq). The run (the blocks sharing the tail's time) is indexed by
  // depth once a block joins it at that time, so chains written at one time
  // in any order file in O(log depths); `run_known` false: not indexed yet.
  struct List {
    Block* head = nullptr;
    Block* tail = nullptr;
    bool run_known = false;
    Block* run_first = nullptr;                 // run_known: the run's first block
    std::map<uint32_t, Block*> run_last;        // run_known: depth -> its last block in the run
  };
  static constexpr uint32_t kUseBuckets = 256;  // uses count up to 255
  struct Request {
    std::vector<BlockKey> keys;
    uint64_t start_us = 0;
  };

  static uint32_t Bucket(const Block& b) { return b.uses < kUseBuckets ? b.uses : kUseBuckets - 1; }
  static bool Needed(const Block& b) { return b.key != nullptr && !b.key->second.starts.empty(); }
  NeededOrder NeededOrderOf(const Block& b) const;
  void Touch(Block& b, uint64_t time_us);
  // Files an unpinned, unfiled block by its state; Unfile takes it out.
  void File(Block& b);
  void Unfile(Block& b);
  void Link(List& list, Block& b);
  void Unlink(List& list, Block& b);
  // Indexes the run of `list` (not empty) if it is not yet.
  void IndexRun(List& list);
  // After a block's queue state changed: moves it between the needed and
  // the unneeded groups (leaving the queue counts as a use at latest_us_).
  void Refile(Block& b);
  void AddStart(const QueuedBlock& qb, uint64_t start_us, uint64_t session);
  void RemoveStart(const BlockKey& key, uint64_t start_us);
  void LinkSession(Block& b, uint64_t session);
  void UnlinkSession(Block& b);
  void Dequeue(uint64_t request);
  void SetSessionClosed(uint64_t session, bool closed);
  static uint64_t Rank(uint64_t group, uint64_t open, uint32_t uses, uint64_t time);

  std::unordered_map<BlockHandle, Block> blocks_;
  std::unordered_map<BlockKey, KeyEntry> keys_;
  std::array<List, kUseBuckets> lists_;
  std::array<uint64_t, kUseBuckets / 64> nonempty_{};  // bit b: lists_[b] has blocks
  ClosedSet closed_;
  NeededSet needed_;
  std::vector<ClosedSet::node_type> spare_closed_;  // tree nodes kept for reuse
  std::vector<NeededSet::node_type> spare_needed_;
  std::unordered_map<uint64_t, Block*> sessions_;    // session -> first of its blocks
  std::unordered_map<uint64_t, Request> requests_;
  uint64_t latest_us_ = 0;  // the latest time passed in
  uint64_t seq_ = 0;
};

std::unique_ptr<QueueAwarePolicy> MakeQueueAwarePolicy();

}  // namespace kvtier

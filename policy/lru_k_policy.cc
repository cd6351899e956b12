// LRU-2 (LRU-K with K = 2, O'Neil, O'Neil and Weikum 1993): a block's
// priority is the time of its second-to-last use. Blocks used only once
// (no second-to-last use known) go first, least recently used first; then
// blocks used twice or more, the oldest second-to-last use first.
//
// Layout: the once-used unpinned blocks in a list in order of last use
// (front = evicted first), the twice-used unpinned blocks in a binary heap
// on (second-to-last use, its sequence number) with lazy deletion: an entry
// is live while its stamp matches the block's. Victim() drops stale heap
// tops (mutable state, logically const: the order does not change). The
// heap is compacted when stale entries outnumber live ones, so it holds at
// most about twice the twice-used blocks. Pinned blocks are out of both.
//
// History: the last use of removed blocks inserted with a key
// (OnInsertKeyed) is remembered, keyed by BlockKey, for at most 8 x size()
// removed blocks, oldest removal dropped first; a block inserted again
// while remembered is twice-used at once. Plain OnInsert keeps no history
// (handles may be reused). On the Mooncake conversation trace at 1000 /
// 2000 / 5000 blocks (token hit rate), history bounded by 1 x size() gave
// 0.057 / 0.080 / 0.143, 8 x size() 0.076 / 0.112 / 0.168, unbounded
// 0.074 / 0.112 / 0.168; a remembered key costs about 100 bytes.
#include <algorithm>
#include <list>
#include <unordered_map>
#include <vector>

#include "policy/eviction_policy.h"

namespace kvtier {
namespace {

constexpr uint64_t kTwiceBand = uint64_t{1} << 63;
constexpr uint64_t kTimeMask = kTwiceBand - 1;
constexpr size_t kHistoryFactor = 8;  // remembered keys per tracked block

class Lru2Policy final : public EvictionPolicy {
 public:
  void OnInsert(BlockHandle h, uint64_t now_us) override { Insert(h, nullptr, now_us); }
  void OnInsertKeyed(BlockHandle h, const BlockKey& key, uint64_t now_us) override { Insert(h, &key, now_us); }

  void OnAccess(BlockHandle h, uint64_t now_us) override {
    auto it = blocks_.find(h);
    if (it == blocks_.end()) return;
    Block& b = it->second;
    if (!b.pinned) Unlink(h, b);
    Use(b, now_us);
    if (!b.pinned) Link(h, b);
  }

  void OnPin(BlockHandle h) override {
    auto it = blocks_.find(h);
    if (it == blocks_.end() || it->second.pinned) return;
    Unlink(h, it->second);
    it->second.pinned = true;
  }

  void OnUnpin(BlockHandle h, uint64_t now_us) override {
    auto it = blocks_.find(h);
    if (it == blocks_.end() || !it->second.pinned) return;
    it->second.pinned = false;
    Use(it->second, now_us);
    Link(h, it->second);
  }

  void OnRemove(BlockHandle h) override {
    auto it = blocks_.find(h);
    if (it == blocks_.end()) return;
    Block& b = it->second;
    if (!b.pinned) Unlink(h, b);
    if (b.has_key) Remember(b);
    blocks_.erase(it);
    TrimHistory();
  }

  std::optional<EvictionCandidate> Victim() const override {
    if (!once_.empty()) return EvictionCandidate{once_.front(), blocks_.at(once_.front()).last_us & kTimeMask};
    while (!heap_.empty() && !Live(heap_.front())) {
      std::pop_heap(heap_.begin(), heap_.end(), Later);
      heap_.pop_back();
    }
    if (heap_.empty()) return std::nullopt;
    return EvictionCandidate{heap_.front().handle, kTwiceBand | (heap_.front().prev_us & kTimeMask)};
  }

  size_t size() const override { return blocks_.size(); }
  std::string_view name() const override { return "lru2"; }

 private:
  struct Block {
    uint64_t last_us = 0, last_seq = 0;  // the last use
    uint64_t prev_us = 0, prev_seq = 0;  // the use before it, if twice
    bool twice = false;
    bool pinned = false;
    bool has_key = false;
    BlockKey key;
    uint64_t stamp = 0;                            // of its live heap entry, if twice and unpinned
    std::list<BlockHandle>::iterator once_node{};  // if once and unpinned
  };
  struct HeapEntry {
    uint64_t prev_us, prev_seq, stamp;
    BlockHandle handle;
  };
  struct Remembered {
    uint64_t last_us, last_seq;
    std::list<BlockKey>::iterator node;
  };
  // Heap comparator: the top is the earliest second-to-last use.
  static bool Later(const HeapEntry& a, const HeapEntry& b) {
    return a.prev_us != b.prev_us ? a.prev_us > b.prev_us : a.prev_seq > b.prev_seq;
  }

  void Insert(BlockHandle h, const BlockKey* key, uint64_t now_us) {
    Block& b = blocks_[h];
    b = Block{};
    if (key != nullptr) {
      b.has_key = true;
      b.key = *key;
      auto r = history_.find(*key);
      if (r != history_.end()) {
        b.twice = true;
        b.last_us = r->second.last_us;  // shifted to prev by Use below
        b.last_seq = r->second.last_seq;
        history_order_.erase(r->second.node);
        history_.erase(r);
      }
    }
    if (b.twice) {
      Use(b, now_us);
    } else {
      b.last_us = now_us;
      b.last_seq = ++seq_;
    }
    Link(h, b);
    TrimHistory();
  }

  void Use(Block& b, uint64_t now_us) {
    b.prev_us = b.last_us;
    b.prev_seq = b.last_seq;
    b.twice = true;
    b.last_us = now_us;
    b.last_seq = ++seq_;
  }

  // Puts an unpinned block in its order.
  void Link(BlockHandle h, Block& b) {
    if (!b.twice) {
      b.once_node = once_.insert(once_.end(), h);
      return;
    }
    b.stamp = ++stamp_;
    heap_.push_back({b.prev_us, b.prev_seq, b.stamp, h});
    std::push_heap(heap_.begin(), heap_.end(), Later);
    ++live_;
    if (heap_.size() > 2 * live_ + 64) Compact();
  }

  // Takes an unpinned block out of its order.
  void Unlink(BlockHandle, Block& b) {
    if (!b.twice) {
      once_.erase(b.once_node);
      return;
    }
    b.stamp = 0;  // its heap entry is stale now
    --live_;
  }

  bool Live(const HeapEntry& e) const {
    auto it = blocks_.find(e.handle);
    return it != blocks_.end() && it->second.stamp == e.stamp && e.stamp != 0;
  }

  void Compact() {
    std::erase_if(heap_, [this](const HeapEntry& e) { return !Live(e); });
    std::make_heap(heap_.begin(), heap_.end(), Later);
  }

  void Remember(const Block& b) {
    auto [it, fresh] = history_.try_emplace(b.key);
    if (!fresh) history_order_.erase(it->second.node);
    it->second = {b.last_us, b.last_seq, history_order_.insert(history_order_.end(), b.key)};
  }

  void TrimHistory() {
    while (history_.size() > blocks_.size() * kHistoryFactor) {
      history_.erase(history_order_.front());
      history_order_.pop_front();
    }
  }

  std::unordered_map<BlockHandle, Block> blocks_;
  std::list<BlockHandle> once_;          // once used, unpinned; front = least recent
  mutable std::vector<HeapEntry> heap_;  // twice used, unpinned, plus stale entries
  size_t live_ = 0;                      // live entries in heap_
  std::unordered_map<BlockKey, Remembered> history_;
  std::list<BlockKey> history_order_;  // front = removed first
  uint64_t seq_ = 0;
  uint64_t stamp_ = 0;
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeLru2Policy() { return std::make_unique<Lru2Policy>(); }

}  // namespace kvtier

// LRU and FIFO. LRU keeps a list ordered by last use (front = evicted
// first); FIFO keeps an ordered map keyed by insertion time, so a block that
// comes back from a pin returns to its original place. Pinned blocks are
// parked outside the order and keep their rank.
#include <list>
#include <map>
#include <unordered_map>

#include "policy/eviction_policy.h"

namespace kvtier {
namespace {

class LruPolicy final : public EvictionPolicy {
 public:
  void OnInsert(BlockHandle h, uint64_t now_us) override {
    order_.push_back({h, now_us});
    where_[h] = {std::prev(order_.end()), false};
  }

  void OnAccess(BlockHandle h, uint64_t now_us) override {
    auto it = where_.find(h);
    if (it == where_.end()) return;
    it->second.node->rank = now_us;
    if (!it->second.pinned) order_.splice(order_.end(), order_, it->second.node);
  }

  void OnPin(BlockHandle h) override {
    auto it = where_.find(h);
    if (it == where_.end() || it->second.pinned) return;
    parked_.splice(parked_.end(), order_, it->second.node);
    it->second.pinned = true;
  }

  void OnUnpin(BlockHandle h, uint64_t now_us) override {
    auto it = where_.find(h);
    if (it == where_.end() || !it->second.pinned) return;
    it->second.node->rank = now_us;
    order_.splice(order_.end(), parked_, it->second.node);
    it->second.pinned = false;
  }

  void OnRemove(BlockHandle h) override {
    auto it = where_.find(h);
    if (it == where_.end()) return;
    (it->second.pinned ? parked_ : order_).erase(it->second.node);
    where_.erase(it);
  }

  std::optional<EvictionCandidate> Victim() const override {
    if (order_.empty()) return std::nullopt;
    return order_.front();
  }

  size_t size() const override { return where_.size(); }
  std::string_view name() const override { return "lru"; }

 private:
  struct Position {
    std::list<EvictionCandidate>::iterator node;
    bool pinned;  // node lives in parked_
  };
  std::list<EvictionCandidate> order_;   // unpinned, front = least recent
  std::list<EvictionCandidate> parked_;  // pinned, unordered
  std::unordered_map<BlockHandle, Position> where_;
};

class FifoPolicy final : public EvictionPolicy {
 public:
  void OnInsert(BlockHandle h, uint64_t now_us) override {
    Key key{now_us, next_seq_++};
    order_.emplace(key, h);
    where_[h] = {key, false};
  }

  void OnAccess(BlockHandle, uint64_t) override {}

  void OnPin(BlockHandle h) override {
    auto it = where_.find(h);
    if (it == where_.end() || it->second.pinned) return;
    order_.erase(it->second.key);
    it->second.pinned = true;
  }

  void OnUnpin(BlockHandle h, uint64_t) override {
    auto it = where_.find(h);
    if (it == where_.end() || !it->second.pinned) return;
    order_.emplace(it->second.key, h);
    it->second.pinned = false;
  }

  void OnRemove(BlockHandle h) override {
    auto it = where_.find(h);
    if (it == where_.end()) return;
    if (!it->second.pinned) order_.erase(it->second.key);
    where_.erase(it);
  }

  std::optional<EvictionCandidate> Victim() const override {
    if (order_.empty()) return std::nullopt;
    return EvictionCandidate{order_.begin()->second, order_.begin()->first.inserted_us};
  }

  size_t size() const override { return where_.size(); }
  std::string_view name() const override { return "fifo"; }

 private:
  struct Key {
    uint64_t inserted_us;
    uint64_t seq;  // keeps insertion order among equal times
    friend auto operator<=>(const Key&, const Key&) = default;
  };
  struct Position {
    Key key;
    bool pinned;  // not in order_
  };
  std::map<Key, BlockHandle> order_;  // unpinned, begin = oldest
  std::unordered_map<BlockHandle, Position> where_;
  uint64_t next_seq_ = 0;
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeLruPolicy() { return std::make_unique<LruPolicy>(); }
std::unique_ptr<EvictionPolicy> MakeFifoPolicy() { return std::make_unique<FifoPolicy>(); }

}  // namespace kvtier

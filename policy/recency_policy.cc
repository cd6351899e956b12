// LRU and FIFO share one structure: a list ordered oldest-first plus a map
// from handle to list position. They differ only in whether an access moves
// the block to the back. Every operation is O(1).
#include <list>
#include <unordered_map>

#include "policy/eviction_policy.h"

namespace kvtier {
namespace {

class RecencyPolicy final : public EvictionPolicy {
 public:
  explicit RecencyPolicy(bool reorder_on_access) : reorder_on_access_(reorder_on_access) {}

  void OnInsert(BlockHandle h, uint64_t now_us) override {
    order_.push_back({h, now_us});
    where_[h] = std::prev(order_.end());
  }

  void OnAccess(BlockHandle h, uint64_t now_us) override {
    if (!reorder_on_access_) return;
    auto it = where_.find(h);
    if (it == where_.end()) return;
    it->second->rank = now_us;
    order_.splice(order_.end(), order_, it->second);
  }

  void OnRemove(BlockHandle h) override {
    auto it = where_.find(h);
    if (it == where_.end()) return;
    order_.erase(it->second);
    where_.erase(it);
  }

  std::optional<EvictionCandidate> Victim() const override {
    if (order_.empty()) return std::nullopt;
    return order_.front();
  }

  size_t size() const override { return order_.size(); }
  std::string_view name() const override { return reorder_on_access_ ? "lru" : "fifo"; }

 private:
  const bool reorder_on_access_;
  std::list<EvictionCandidate> order_;  // front = evicted first
  std::unordered_map<BlockHandle, std::list<EvictionCandidate>::iterator> where_;
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeLruPolicy() { return std::make_unique<RecencyPolicy>(true); }
std::unique_ptr<EvictionPolicy> MakeFifoPolicy() { return std::make_unique<RecencyPolicy>(false); }

}  // namespace kvtier

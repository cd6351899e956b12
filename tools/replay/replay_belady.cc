#include "tools/replay/replay_belady.h"

namespace kvtier::tools {

BeladyPolicy::Order BeladyPolicy::OrderOf(BlockHandle h) const {
  return {h < next_use_.size() ? next_use_[h] : kNever, h < depth_.size() ? depth_[h] : 0, h};
}

void BeladyPolicy::Reorder(BlockHandle h) {
  auto it = blocks_.find(h);
  if (it == blocks_.end() || it->second.pinned) return;
  order_.erase(it->second.filed);
  it->second.filed = OrderOf(h);
  order_.insert(it->second.filed);
}

void BeladyPolicy::OnInsert(BlockHandle h, uint64_t) {
  Entry& e = blocks_[h];
  e.filed = OrderOf(h);
  order_.insert(e.filed);
}

void BeladyPolicy::OnPin(BlockHandle h) {
  auto it = blocks_.find(h);
  if (it == blocks_.end() || it->second.pinned) return;
  order_.erase(it->second.filed);
  it->second.pinned = true;
}

void BeladyPolicy::OnUnpin(BlockHandle h, uint64_t) {
  auto it = blocks_.find(h);
  if (it == blocks_.end() || !it->second.pinned) return;
  it->second.pinned = false;
  it->second.filed = OrderOf(h);
  order_.insert(it->second.filed);
}

void BeladyPolicy::OnRemove(BlockHandle h) {
  auto it = blocks_.find(h);
  if (it == blocks_.end()) return;
  if (!it->second.pinned) order_.erase(it->second.filed);
  blocks_.erase(it);
}

std::optional<EvictionCandidate> BeladyPolicy::Victim() const {
  if (order_.empty()) return std::nullopt;
  const Order& first = *order_.begin();
  return EvictionCandidate{std::get<2>(first), ~std::get<0>(first)};
}

}  // namespace kvtier::tools

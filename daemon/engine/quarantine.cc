#include "daemon/engine/quarantine.h"

namespace kvtier {

void Quarantine::Add(const BlockKey& key) {
  MutexLock lock(mu_);
  auto [it, fresh] = keys_.try_emplace(key, next_);
  if (!fresh) return;
  order_.emplace_back(key, next_++);
  added_.fetch_add(1, std::memory_order_relaxed);
  while (keys_.size() > max_keys_ && !order_.empty()) {
    auto [oldest, sequence] = order_.front();
    order_.pop_front();
    auto found = keys_.find(oldest);
    if (found == keys_.end() || found->second != sequence) continue;  // released meanwhile
    keys_.erase(found);
    overflows_.fetch_add(1, std::memory_order_relaxed);
  }
  // Stale pairs of released keys are dropped once they pass the live ones.
  if (order_.size() > 2 * max_keys_) {
    std::deque<std::pair<BlockKey, uint64_t>> live;
    for (const auto& [k, sequence] : order_) {
      auto found = keys_.find(k);
      if (found != keys_.end() && found->second == sequence) live.emplace_back(k, sequence);
    }
    order_.swap(live);
  }
  size_.store(keys_.size(), std::memory_order_release);
}

bool Quarantine::Release(const BlockKey& key) {
  if (size() == 0) return false;
  MutexLock lock(mu_);
  if (keys_.erase(key) == 0) return false;
  released_.fetch_add(1, std::memory_order_relaxed);
  size_.store(keys_.size(), std::memory_order_release);
  return true;
}

bool Quarantine::Contains(const BlockKey& key) const {
  if (size() == 0) return false;
  MutexLock lock(mu_);
  return keys_.contains(key);
}

std::vector<BlockKey> Quarantine::Newest(size_t max) const {
  std::vector<BlockKey> out;
  MutexLock lock(mu_);
  for (auto it = order_.rbegin(); it != order_.rend() && out.size() < max; ++it) {
    auto found = keys_.find(it->first);
    if (found != keys_.end() && found->second == it->second) out.push_back(it->first);
  }
  return out;
}

void Quarantine::VisitCounters(CounterVisitor& v, const std::string& label) const {
  v.VisitGauge("tier.quarantined" + label, static_cast<int64_t>(size()));
  v.Visit("tier.quarantine_added" + label, added_.load(std::memory_order_relaxed));
  v.Visit("tier.quarantine_released" + label, released_.load(std::memory_order_relaxed));
  v.Visit("tier.quarantine_overflows" + label, overflows_.load(std::memory_order_relaxed));
}

}  // namespace kvtier

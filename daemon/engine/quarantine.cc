#include "daemon/engine/quarantine.h"

namespace kvtier {

bool Quarantine::Live(const Added& a) const {
  auto found = keys_.find(a.key);
  return found != keys_.end() && found->second.sequence == a.sequence;
}

void Quarantine::Expire() {
  if (lifetime_us_ == 0 || !clock_) return;
  const uint64_t now = clock_();
  while (!order_.empty() && order_.front().at_us + lifetime_us_ <= now) {
    if (Live(order_.front())) keys_.erase(order_.front().key);
    order_.pop_front();
  }
  size_.store(keys_.size(), std::memory_order_release);
}

void Quarantine::Add(const BlockKey& key) {
  MutexLock lock(mu_);
  AddLocked(key);
}

void Quarantine::NoteWritten(const BlockKey& key) {
  MutexLock lock(mu_);
  if (write_log_.empty()) write_log_.resize(kWriteLog);
  const uint64_t write = writes_.load(std::memory_order_relaxed);
  write_log_[write % kWriteLog] = key;
  writes_.store(write + 1, std::memory_order_release);
  if (keys_.erase(key) == 0) return;
  released_.fetch_add(1, std::memory_order_relaxed);
  size_.store(keys_.size(), std::memory_order_release);
}

bool Quarantine::AddUnlessWrittenSince(const BlockKey& key, uint64_t sequence) {
  MutexLock lock(mu_);
  const uint64_t writes = writes_.load(std::memory_order_relaxed);
  if (writes - sequence > kWriteLog) return false;
  for (uint64_t write = sequence; write < writes; ++write) {
    if (write_log_[write % kWriteLog] == key) return false;
  }
  AddLocked(key);
  return true;
}

void Quarantine::AddLocked(const BlockKey& key) {
  Expire();
  const Added added{key, next_, lifetime_us_ != 0 && clock_ ? clock_() : 0};
  if (!keys_.try_emplace(key, added).second) return;
  ++next_;
  order_.push_back(added);
  added_.fetch_add(1, std::memory_order_relaxed);
  while (keys_.size() > max_keys_ && !order_.empty()) {
    const Added oldest = order_.front();
    order_.pop_front();
    if (!Live(oldest)) continue;  // released meanwhile
    keys_.erase(oldest.key);
    overflows_.fetch_add(1, std::memory_order_relaxed);
  }
  // Stale Adds of released keys are dropped once they pass the live ones.
  if (order_.size() > 2 * max_keys_) {
    std::deque<Added> live;
    for (const Added& a : order_) {
      if (Live(a)) live.push_back(a);
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
  auto found = keys_.find(key);
  if (found == keys_.end()) return false;
  // Past its lifetime it is no longer in (Expire drops it at the next Add).
  return lifetime_us_ == 0 || !clock_ || found->second.at_us + lifetime_us_ > clock_();
}

std::vector<BlockKey> Quarantine::Newest(size_t max) const {
  std::vector<BlockKey> out;
  MutexLock lock(mu_);
  const uint64_t now = lifetime_us_ != 0 && clock_ ? clock_() : 0;
  for (auto it = order_.rbegin(); it != order_.rend() && out.size() < max; ++it) {
    if (Live(*it) && (now == 0 || it->at_us + lifetime_us_ > now)) out.push_back(it->key);
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

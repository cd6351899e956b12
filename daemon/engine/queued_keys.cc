#include "daemon/engine/queued_keys.h"

namespace kvtier {

void QueuedKeys::Add(std::span<const BlockKey> chain) {
  MutexLock lock(mu_);
  for (const BlockKey& key : chain) ++counts_[key];
}

void QueuedKeys::Remove(std::span<const BlockKey> chain) {
  MutexLock lock(mu_);
  for (const BlockKey& key : chain) {
    auto it = counts_.find(key);
    if (it != counts_.end() && --it->second == 0) counts_.erase(it);
  }
}

bool QueuedKeys::Contains(const BlockKey& key) const {
  MutexLock lock(mu_);
  return counts_.count(key) > 0;
}

size_t QueuedKeys::size() const {
  MutexLock lock(mu_);
  return counts_.size();
}

}  // namespace kvtier

// QueuedKeys: the keys the chains of queued requests name, with counts, so
// the NVMe tier's queue_aware reclaim can ask "does a queued request need
// this key?" from under its own lock. Thread-safe: one mutex, a leaf
// (nothing is called while it is held), so any lock may be held around it.
#pragma once

#include <cstdint>
#include <mutex>
#include <span>
#include <unordered_map>

#include "common/mutex.h"
#include "kvtier/block_key.h"

namespace kvtier {

class QueuedKeys {
 public:
  void Add(std::span<const BlockKey> chain);
  // Removes one count of each key of `chain` (as added before).
  void Remove(std::span<const BlockKey> chain);
  bool Contains(const BlockKey& key) const;
  size_t size() const;

 private:
  mutable Mutex mu_;
  std::unordered_map<BlockKey, uint32_t> counts_ GUARDED_BY(mu_);
};

}  // namespace kvtier

// Reclaim policies of a log-structured tier (the NVMe tier's eviction):
// the tier frees whole regions, oldest first, and may copy some blocks of
// the region about to go forward into the open region (reinsertion) so
// that reclaim drops only what is least worth keeping. This decides which,
// in what order; the tier supplies the facts and a byte budget.
//
//   fifo         nothing is copied: the oldest region's blocks all go
//   lru          blocks read since they were written, the most read first
//   queue_aware  blocks a queued request needs first (the most read first
//                among them), then lru's
//
// Pure and synchronous like every policy; O(b log b) for b candidates.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "kvtier/block_key.h"

namespace kvtier {

enum class ReclaimOrder : uint8_t { kFifo, kLru, kQueueAware };

// "fifo", "lru", "queue_aware"; nullopt for anything else.
std::optional<ReclaimOrder> ParseReclaimOrder(std::string_view name);
std::string_view ReclaimOrderName(ReclaimOrder order);

struct ReclaimCandidate {
  BlockKey key;
  uint64_t hits = 0;     // reads since it was written
  bool needed = false;   // a queued request names it (queue_aware only)
};

// The candidates worth copying forward, most deserving first.
std::vector<ReclaimCandidate> ChooseReinsertions(std::vector<ReclaimCandidate> candidates, ReclaimOrder order);

}  // namespace kvtier

#include "policy/reclaim_policy.h"

#include <algorithm>

namespace kvtier {

std::optional<ReclaimOrder> ParseReclaimOrder(std::string_view name) {
  if (name == "fifo") return ReclaimOrder::kFifo;
  if (name == "lru") return ReclaimOrder::kLru;
  if (name == "queue_aware") return ReclaimOrder::kQueueAware;
  return std::nullopt;
}

std::string_view ReclaimOrderName(ReclaimOrder order) {
  switch (order) {
    case ReclaimOrder::kFifo:
      return "fifo";
    case ReclaimOrder::kLru:
      return "lru";
    case ReclaimOrder::kQueueAware:
      return "queue_aware";
  }
  return "?";
}

std::vector<ReclaimCandidate> ChooseReinsertions(std::vector<ReclaimCandidate> candidates, ReclaimOrder order) {
  if (order == ReclaimOrder::kFifo) return {};
  const bool queue = order == ReclaimOrder::kQueueAware;
  std::erase_if(candidates, [queue](const ReclaimCandidate& c) { return c.hits == 0 && !(queue && c.needed); });
  // Ties keep the order the tier gave (stable).
  std::stable_sort(candidates.begin(), candidates.end(), [queue](const ReclaimCandidate& a, const ReclaimCandidate& b) {
    if (queue && a.needed != b.needed) return a.needed;
    return a.hits > b.hits;
  });
  return candidates;
}

}  // namespace kvtier

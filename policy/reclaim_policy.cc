#include "policy/reclaim_policy.h"

#include <algorithm>
#include <unordered_set>

#include "policy/policy_registry.h"

namespace kvtier {

std::optional<ReclaimOrder> ParseReclaimOrder(std::string_view name) {
  auto id = ParseEvictionPolicy(name);
  if (!id.ok()) return std::nullopt;
  switch (*id) {
    case EvictionPolicyId::kFifo:
      return ReclaimOrder::kFifo;
    case EvictionPolicyId::kLru:
      return ReclaimOrder::kLru;
    case EvictionPolicyId::kQueueAware:
      return ReclaimOrder::kQueueAware;
    case EvictionPolicyId::kLru2:
      return ReclaimOrder::kLru2;
    case EvictionPolicyId::kS3Fifo:
      return ReclaimOrder::kS3Fifo;
    case EvictionPolicyId::kArc:
      return ReclaimOrder::kArc;
  }
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
    case ReclaimOrder::kLru2:
      return "lru2";
    case ReclaimOrder::kS3Fifo:
      return "s3fifo";
    case ReclaimOrder::kArc:
      return "arc";
  }
  return "?";
}

std::string_view ReclaimOrderChoices() { return kEvictionPolicyChoices; }

std::vector<ReclaimCandidate> ChooseReinsertions(std::vector<ReclaimCandidate> candidates, ReclaimOrder order) {
  if (order != ReclaimOrder::kLru && order != ReclaimOrder::kQueueAware) return {};
  const bool queue = order == ReclaimOrder::kQueueAware;
  std::erase_if(candidates, [queue](const ReclaimCandidate& c) { return c.hits == 0 && !(queue && c.needed); });
  // Ties keep the order the tier gave (stable).
  std::stable_sort(candidates.begin(), candidates.end(), [queue](const ReclaimCandidate& a, const ReclaimCandidate& b) {
    if (queue && a.needed != b.needed) return a.needed;
    return a.hits > b.hits;
  });
  return candidates;
}

ReclaimPolicy::ReclaimPolicy(ReclaimOrder order) : order_(order) {
  switch (order) {
    case ReclaimOrder::kLru2:
    case ReclaimOrder::kS3Fifo:
    case ReclaimOrder::kArc:
      policy_ = MakeEvictionPolicy(ReclaimOrderName(order));
      break;
    case ReclaimOrder::kFifo:
    case ReclaimOrder::kLru:
    case ReclaimOrder::kQueueAware:
      break;
  }
}

ReclaimPolicy::~ReclaimPolicy() = default;

void ReclaimPolicy::Track(const BlockKey& key, uint64_t now_us) {
  const BlockHandle h = next_handle_++;
  handles_.emplace(key, h);
  keys_.emplace(h, key);
  policy_->OnInsertKeyed(h, key, now_us);
}

void ReclaimPolicy::Forget(BlockHandle handle) {
  auto it = keys_.find(handle);
  if (it == keys_.end()) return;
  policy_->OnRemove(handle);
  handles_.erase(it->second);
  keys_.erase(it);
}

void ReclaimPolicy::OnWritten(const BlockKey& key, uint64_t now_us) {
  if (!policy_ || handles_.count(key) != 0) return;
  Track(key, now_us);
}

void ReclaimPolicy::OnRead(const BlockKey& key, uint64_t now_us) {
  if (!policy_) return;
  auto it = handles_.find(key);
  if (it == handles_.end()) {
    Track(key, now_us);  // evicted by the policy, still in the log: back
    return;
  }
  policy_->OnAccess(it->second, now_us);
}

void ReclaimPolicy::OnDropped(const BlockKey& key) {
  if (!policy_) return;
  auto it = handles_.find(key);
  if (it != handles_.end()) Forget(it->second);
}

std::vector<ReclaimCandidate> ReclaimPolicy::Choose(std::vector<ReclaimCandidate> candidates) {
  if (!policy_) return ChooseReinsertions(std::move(candidates), order_);
  // The region's blocks the policy tracks; the others it evicted already.
  std::unordered_set<BlockHandle> region;
  for (const ReclaimCandidate& c : candidates) {
    auto it = handles_.find(c.key);
    if (it != handles_.end()) region.insert(it->second);
  }
  // Room for as many blocks as the region gives back to the policy: its
  // next victims, wherever they are. One that lives elsewhere stays in the
  // log, untracked, until its region goes.
  for (size_t n = region.size(); n > 0; --n) {
    auto victim = policy_->Victim();
    if (!victim) break;
    region.erase(victim->handle);
    Forget(victim->handle);
  }
  std::erase_if(candidates, [this](const ReclaimCandidate& c) { return handles_.count(c.key) == 0; });
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const ReclaimCandidate& a, const ReclaimCandidate& b) { return a.hits > b.hits; });
  spared_ += static_cast<int64_t>(candidates.size());
  return candidates;
}

void ReinsertBudget::OnWrite(uint64_t record_bytes) { bytes_ = std::min(bytes_ + share_ * double(record_bytes), cap_); }

bool ReinsertBudget::Take(uint64_t record_bytes) {
  if (double(record_bytes) > bytes_) return false;
  bytes_ -= double(record_bytes);
  return true;
}

ReclaimTurn PlanReclaimTurn(std::vector<ReclaimCandidate> candidates, ReclaimPolicy& policy, ReinsertBudget& budget) {
  std::sort(candidates.begin(), candidates.end(),
            [](const ReclaimCandidate& a, const ReclaimCandidate& b) { return a.offset < b.offset; });
  ReclaimTurn turn;
  std::unordered_set<BlockKey> kept;
  if (budget.enabled()) {
    for (ReclaimCandidate& c : policy.Choose(candidates)) {
      if (!budget.Take(c.record_bytes)) {
        ++turn.over_budget;
        continue;
      }
      kept.insert(c.key);
      if (c.needed) ++turn.needed;
      turn.reinsert.push_back(std::move(c));
    }
  }
  for (ReclaimCandidate& c : candidates) {
    if (kept.count(c.key) == 0) turn.evict.push_back(std::move(c));
  }
  return turn;
}

}  // namespace kvtier

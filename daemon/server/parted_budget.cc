#include "daemon/server/parted_budget.h"

#include <algorithm>

namespace kvtier {

PartedBudget::PartedBudget(uint64_t limit, size_t parties, uint32_t reserved_percent)
    : limit_(limit), used_of_(std::max<size_t>(parties, 1), 0) {
  // limit * percent could pass 64 bits for limits near 2^64 (no limit).
  const uint64_t reserved = limit / 100 * std::min<uint32_t>(reserved_percent, 100) +
                            limit % 100 * std::min<uint32_t>(reserved_percent, 100) / 100;
  part_ = reserved / used_of_.size();
  shared_ = limit - part_ * used_of_.size();
}

bool PartedBudget::TryTake(size_t party, uint64_t amount) {
  if (amount > Room(party)) return false;
  Take(party, amount);
  return true;
}

uint64_t PartedBudget::Room(size_t party) const {
  const uint64_t in_part = used_of_[party] < part_ ? part_ - used_of_[party] : 0;
  const uint64_t shared_left = shared_used_ < shared_ ? shared_ - shared_used_ : 0;
  return in_part > UINT64_MAX - shared_left ? UINT64_MAX : in_part + shared_left;
}

void PartedBudget::Take(size_t party, uint64_t amount) {
  const uint64_t over_before = OverPart(party);
  used_of_[party] += amount;
  used_ += amount;
  shared_used_ += OverPart(party) - over_before;
}

void PartedBudget::Give(size_t party, uint64_t amount) {
  amount = std::min(amount, used_of_[party]);
  const uint64_t over_before = OverPart(party);
  used_of_[party] -= amount;
  used_ -= amount;
  shared_used_ -= over_before - OverPart(party);
}

}  // namespace kvtier

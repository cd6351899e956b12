#include "daemon/connection_slots.h"

#include <algorithm>

namespace kvtier {

ConnectionSlots::ConnectionSlots(uint32_t max_connections, size_t parties, uint32_t reserved_percent)
    : open_(std::max<size_t>(parties, 1), 0) {
  const uint64_t reserved = uint64_t{max_connections} * std::min<uint32_t>(reserved_percent, 100) / 100;
  part_ = static_cast<uint32_t>(reserved / open_.size());
  shared_ = max_connections - static_cast<uint32_t>(part_ * open_.size());
}

bool ConnectionSlots::TryTake(size_t party) {
  if (open_[party] >= part_) {
    if (shared_used_ >= shared_) return false;
    ++shared_used_;
  }
  ++open_[party];
  ++open_total_;
  return true;
}

void ConnectionSlots::Give(size_t party) {
  if (open_[party] == 0) return;
  if (open_[party] > part_) --shared_used_;
  --open_[party];
  --open_total_;
}

}  // namespace kvtier

// ConnectionSlots: who may hold how many of server.max_connections, so one
// tenant cannot take every slot from the others.
//
// The slots are split in two: reserved_percent of them are divided equally
// among the parties (each tenant, and the operator), each part kept for
// its owner; the rest are shared, first come. A party below its part
// always gets a slot; past it, it takes a shared one while any is free;
// then it is refused, and only it: every other party still has its part.
// Without tenants there is one party, and every slot is its own.
//
// Thread-compatible: the Server calls it under its mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvtier {

class ConnectionSlots {
 public:
  // `parties` >= 1; `reserved_percent` in [0, 100]. The parts are rounded
  // down; what rounding leaves over is shared.
  ConnectionSlots(uint32_t max_connections, size_t parties, uint32_t reserved_percent);

  // Takes a slot for `party` (< parties): true when it may connect.
  bool TryTake(size_t party);
  // Gives back a slot `party` took.
  void Give(size_t party);

  uint32_t open() const { return open_total_; }
  uint32_t open_of(size_t party) const { return open_[party]; }
  // The slots kept for each party (fixed at construction: safe to read
  // without the Server's mutex).
  uint32_t part() const { return part_; }

 private:
  uint32_t part_;
  uint32_t shared_;           // slots beyond the parts
  uint32_t shared_used_ = 0;  // sum over parties of max(0, open - part)
  uint32_t open_total_ = 0;
  std::vector<uint32_t> open_;  // by party
};

}  // namespace kvtier

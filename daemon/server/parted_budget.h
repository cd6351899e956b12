// PartedBudget: who may hold how much of a limited resource (connection
// slots, client-state memory), so one party cannot take it all from the
// others.
//
// The limit is split in two: reserved_percent of it is divided equally
// among the parties (each tenant, and the operator), each part kept for
// its owner; the rest is shared, first come. A party within its part
// always gets what it asks; past it, it takes from the shared rest while
// that lasts; then it is refused, and only it: every other party still has
// its part. With one party the whole limit is its own.
//
// Thread-compatible: callers hold their own lock around it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvtier {

class PartedBudget {
 public:
  // `parties` >= 1 (0 is taken as 1); `reserved_percent` in [0, 100]. The
  // parts are rounded down; what rounding leaves over is shared.
  PartedBudget(uint64_t limit, size_t parties, uint32_t reserved_percent);

  // Takes `amount` for `party` (< parties) if it fits: within the party's
  // part, or past it from the shared rest. False (taking nothing) if not.
  bool TryTake(size_t party, uint64_t amount);
  // Takes `amount` even past every bound (what is already spent and must
  // be counted); later TryTakes of the party see it.
  void Take(size_t party, uint64_t amount);
  // Gives back `amount` that `party` took (at most what it holds).
  void Give(size_t party, uint64_t amount);
  // The most `party` could take now (what TryTake would grant).
  uint64_t Room(size_t party) const;

  uint64_t used() const { return used_; }
  uint64_t used_of(size_t party) const { return used_of_[party]; }
  uint64_t limit() const { return limit_; }
  // What is kept for each party (fixed at construction).
  uint64_t part() const { return part_; }
  size_t parties() const { return used_of_.size(); }

 private:
  // What `party` holds past its part (charged to the shared rest).
  uint64_t OverPart(size_t party) const { return used_of_[party] > part_ ? used_of_[party] - part_ : 0; }

  uint64_t limit_;
  uint64_t part_;
  uint64_t shared_;           // the limit beyond the parts
  uint64_t shared_used_ = 0;  // sum over parties of OverPart
  uint64_t used_ = 0;
  std::vector<uint64_t> used_of_;  // by party
};

}  // namespace kvtier

// Belady's MIN for `kvtier replay --policy belady` (simulation only): the
// victim is the block whose next use lies furthest in the future, the
// deeper in its chain first among equals (a child is worth no more than its
// parent: every request naming it names the parent too). The simulator
// knows the future from the trace: it owns each block's next use (the
// index of the next request that will look the block up, or kNever) and
// its depth, and calls Reorder whenever it changes one of them for a block
// this policy tracks.
//
// With unit-size blocks and one tier this is the offline optimum of block
// hits; with a partial last block and the prefix rule (a block counts only
// under a hit parent) it is the classic bound's rule, the reference
// ceiling the replay's gap-closed column measures against
// (docs/POLICIES.md). Not thread-safe, like every policy.
#pragma once

#include <cstdint>
#include <set>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "policy/eviction_policy.h"

namespace kvtier::tools {

class BeladyPolicy final : public EvictionPolicy {
 public:
  static constexpr uint64_t kNever = UINT64_MAX;
  // `next_use[h]` and `depth[h]` for every handle h the policy will see;
  // the vectors outlive the policy and may grow (they are read, never
  // written, by it).
  BeladyPolicy(const std::vector<uint64_t>& next_use, const std::vector<uint32_t>& depth)
      : next_use_(next_use), depth_(depth) {}

  // Refiles `h` after its next use or depth changed. Ignored if untracked.
  void Reorder(BlockHandle h);

  // EvictionPolicy. rank: ~next use, so a further next use ranks lower.
  void OnInsert(BlockHandle h, uint64_t now_us) override;
  void OnAccess(BlockHandle h, uint64_t) override { Reorder(h); }
  void OnPin(BlockHandle h) override;
  void OnUnpin(BlockHandle h, uint64_t now_us) override;
  void OnRemove(BlockHandle h) override;
  std::optional<EvictionCandidate> Victim() const override;
  size_t size() const override { return blocks_.size(); }
  std::string_view name() const override { return "belady"; }

 private:
  // Furthest next use first, then deepest, then the higher handle.
  using Order = std::tuple<uint64_t, uint32_t, BlockHandle>;  // (next use, depth, handle), largest first
  struct Entry {
    bool pinned = false;
    Order filed{};  // unpinned: its key in order_
  };
  Order OrderOf(BlockHandle h) const;

  const std::vector<uint64_t>& next_use_;
  const std::vector<uint32_t>& depth_;
  std::unordered_map<BlockHandle, Entry> blocks_;
  std::set<Order, std::greater<>> order_;
};

}  // namespace kvtier::tools

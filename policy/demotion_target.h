// Where a block evicted from a tier goes among the tiers below it: the rule
// the engine's evictor (daemon/engine/evictor.cc), its eviction
// sink for blocks a lower tier evicts (Demoter::DemoteBelow,
// daemon/engine/demoter.cc) and the replay
// (tools/replay/replay_placement.cc) all run.
//
// Walking the tiers below, highest first:
//   - a tier that holds the block already ends the walk: no write (it was
//     promoted from there and its copy is still good);
//   - when a queued request needs the block soon, the first tier takes it
//     whatever its admission says, if its budget can pay (`force`);
//   - otherwise the first tier whose admission admits it takes it;
//   - none: the block is dropped.
//
// Pure; the callables (bool(size_t level), 0 the highest below) are the
// caller's view of each tier, asked in walk order, at most once each. A
// template, so an eviction pays for no std::function.
#pragma once

#include <cstddef>
#include <optional>

namespace kvtier {

struct DemotionTarget {
  std::optional<size_t> level;  // the tier to write to; nullopt: no write
  bool held_below = false;      // a tier below holds it already
  bool forced = false;          // `level` took it through `force`
};

template <typename Holds, typename Force, typename Admit>
DemotionTarget ChooseDemotionTarget(size_t levels, bool needed, Holds&& holds, Force&& force, Admit&& admit) {
  DemotionTarget t;
  for (size_t level = 0; level < levels; ++level) {
    if (holds(level)) {
      t.held_below = true;
      return t;
    }
    if (needed && level == 0 && force(level)) {
      t.level = level;
      t.forced = true;
      return t;
    }
    if (admit(level)) {
      t.level = level;
      return t;
    }
  }
  return t;
}

}  // namespace kvtier

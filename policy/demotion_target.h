// Where a block evicted from a tier goes among the tiers below it: the rule
// the engine's evictor (daemon/engine_eviction.cc) and the replay
// (tools/replay_placement.cc) both run.
//
// Walking the tiers below, highest first:
//   - a tier that holds the block already ends the walk: no write (it was
//     promoted from there and its copy is still good);
//   - when a queued request needs the block soon, the first tier takes it
//     whatever its admission says, if its budget can pay (`force`);
//   - otherwise the first tier whose admission admits it takes it;
//   - none: the block is dropped.
//
// Pure; the callbacks are the caller's view of each tier (by level, 0 the
// highest below) and are asked in walk order, at most once each.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>

namespace kvtier {

struct DemotionTarget {
  std::optional<size_t> level;  // the tier to write to; nullopt: no write
  bool held_below = false;      // a tier below holds it already
  bool forced = false;          // `level` took it through `force`
};

DemotionTarget ChooseDemotionTarget(size_t levels, bool needed, const std::function<bool(size_t)>& holds,
                                    const std::function<bool(size_t)>& force,
                                    const std::function<bool(size_t)>& admit);

}  // namespace kvtier

#include "policy/demotion_target.h"

namespace kvtier {

DemotionTarget ChooseDemotionTarget(size_t levels, bool needed, const std::function<bool(size_t)>& holds,
                                    const std::function<bool(size_t)>& force,
                                    const std::function<bool(size_t)>& admit) {
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

// Must fail under clang -Wthread-safety -Wthread-safety-beta -Werror:
// takes two locks against their declared order (ACQUIRED_BEFORE), which
// only the beta analysis checks.
#include "common/mutex.h"

namespace kvtier {

class Pair {
 public:
  void Swap() {
    MutexLock second(inner_);
    MutexLock first(outer_);  // outer_ must be taken first
    ++count_;
  }

 private:
  Mutex outer_ ACQUIRED_BEFORE(inner_);
  Mutex inner_;
  int count_ GUARDED_BY(inner_) = 0;
};

void Use() { Pair().Swap(); }

}  // namespace kvtier

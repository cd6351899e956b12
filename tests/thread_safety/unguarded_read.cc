// Must fail under clang -Wthread-safety -Werror: reads a GUARDED_BY member
// without its lock.
#include "common/mutex.h"

namespace kvtier {

class Counter {
 public:
  int Read() const { return count_; }

 private:
  mutable Mutex mu_;
  int count_ GUARDED_BY(mu_) = 0;
};

int Use() { return Counter().Read(); }

}  // namespace kvtier

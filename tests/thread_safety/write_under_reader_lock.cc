// Must fail under clang -Wthread-safety -Werror: writes a member guarded
// by a SharedMutex while holding only its reader side.
#include "common/mutex.h"

namespace kvtier {

class Table {
 public:
  void Set(int v) {
    ReaderMutexLock lock(mu_);
    value_ = v;
  }

 private:
  SharedMutex mu_;
  int value_ GUARDED_BY(mu_) = 0;
};

void Use() { Table().Set(1); }

}  // namespace kvtier

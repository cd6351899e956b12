// Must fail under clang -Wthread-safety -Werror: calls a function that
// REQUIRES a lock without holding it.
#include "common/mutex.h"

namespace kvtier {

class Counter {
 public:
  void Add() { AddLocked(); }

 private:
  void AddLocked() REQUIRES(mu_) { ++count_; }

  Mutex mu_;
  int count_ GUARDED_BY(mu_) = 0;
};

void Use() { Counter().Add(); }

}  // namespace kvtier

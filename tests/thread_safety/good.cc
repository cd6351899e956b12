// Compiles cleanly under clang -Wthread-safety -Werror: every guarded
// member is touched with its lock held (tests/thread_safety/check.cmake).
#include "common/mutex.h"

namespace kvtier {

class Counter {
 public:
  void Add() EXCLUDES(mu_) {
    MutexLock lock(mu_);
    AddLocked();
    lock.Unlock();
    lock.Lock();
    ++count_;
  }
  void WaitForSome() EXCLUDES(mu_) {
    MutexLock lock(mu_);
    while (count_ == 0) cv_.Wait(mu_);
  }
  int Read() const EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return count_;
  }
  int Shared() const {
    ReaderMutexLock lock(smu_);
    return shared_;
  }
  void SetShared(int v) {
    WriterMutexLock lock(smu_);
    shared_ = v;
  }

 private:
  void AddLocked() REQUIRES(mu_) { ++count_; }

  mutable Mutex mu_;
  CondVar cv_;
  int count_ GUARDED_BY(mu_) = 0;
  mutable SharedMutex smu_;
  int shared_ GUARDED_BY(smu_) = 0;
};

int Use() {
  Counter c;
  c.Add();
  c.SetShared(1);
  return c.Read() + c.Shared();
}

}  // namespace kvtier

// Window: at most `depth` operations in flight, for the benches that drive
// an asynchronous tier (bench_nvme.cc, bench_remote.cc). Acquire blocks
// while the window is full; each completion Releases; Drain waits for all.
// Thread-safe.
#pragma once

#include <cstdint>

#include "common/mutex.h"

namespace kvtier::tools {

class Window {
 public:
  explicit Window(uint32_t depth) : depth_(depth) {}
  void Acquire() EXCLUDES(mu_) {
    MutexLock lock(mu_);
    while (in_flight_ >= depth_) cv_.Wait(mu_);
    ++in_flight_;
  }
  void Release() EXCLUDES(mu_) {
    MutexLock lock(mu_);
    --in_flight_;
    cv_.NotifyAll();
  }
  void Drain() EXCLUDES(mu_) {
    MutexLock lock(mu_);
    while (in_flight_ != 0) cv_.Wait(mu_);
  }

 private:
  const uint32_t depth_;
  Mutex mu_;
  CondVar cv_;
  uint32_t in_flight_ GUARDED_BY(mu_) = 0;
};

}  // namespace kvtier::tools

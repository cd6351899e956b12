// Window: at most `depth` operations in flight, for the benches that drive
// an asynchronous tier (bench_nvme.cc, bench_remote.cc). Acquire blocks
// while the window is full; each completion Releases; Drain waits for all.
// Thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace kvtier::tools {

class Window {
 public:
  explicit Window(uint32_t depth) : depth_(depth) {}
  void Acquire() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [this] { return in_flight_ < depth_; });
    ++in_flight_;
  }
  void Release() {
    std::lock_guard lock(mu_);
    --in_flight_;
    cv_.notify_all();
  }
  void Drain() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [this] { return in_flight_ == 0; });
  }

 private:
  const uint32_t depth_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint32_t in_flight_ = 0;
};

}  // namespace kvtier::tools

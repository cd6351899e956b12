#include "common/worker_pool.h"

#include "common/check.h"

namespace kvtier {

WorkerPool::WorkerPool(unsigned threads) {
  for (unsigned i = 0; i < (threads == 0 ? 1 : threads); ++i) threads_.emplace_back([this] { Loop(); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void WorkerPool::Post(std::function<void()> task) {
  std::lock_guard lock(mu_);
  KVTIER_CHECK(!stopping_, "task posted to a WorkerPool being destroyed");
  tasks_.push_back(std::move(task));
  // Notified under the lock: the task may be what lets the owner destroy
  // this pool, which must not happen while Post still touches cv_.
  cv_.notify_one();
}

void WorkerPool::Loop() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stopping and drained
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace kvtier

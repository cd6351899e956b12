#include "common/worker_pool.h"

#include "common/check.h"

namespace kvtier {

WorkerPool::WorkerPool(unsigned threads) {
  for (unsigned i = 0; i < (threads == 0 ? 1 : threads); ++i) threads_.emplace_back([this] { Loop(); });
}

WorkerPool::~WorkerPool() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  cv_.NotifyAll();
  for (auto& t : threads_) t.join();
}

void WorkerPool::Post(std::function<void()> task) {
  MutexLock lock(mu_);
  KVTIER_CHECK(!stopping_, "task posted to a WorkerPool being destroyed");
  tasks_.push_back(std::move(task));
  // Notified under the lock: the task may be what lets the owner destroy
  // this pool, which must not happen while Post still touches cv_.
  cv_.NotifyOne();
}

void WorkerPool::Loop() {
  for (;;) {
    std::function<void()> task;
    {
      MutexLock lock(mu_);
      while (!stopping_ && tasks_.empty()) cv_.Wait(mu_);
      if (tasks_.empty()) return;  // stopping and drained
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace kvtier

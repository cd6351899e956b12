// WorkerPool: a fixed set of threads running queued tasks in FIFO order,
// for CPU work that must not run on an I/O thread (e.g. checksumming what
// an io_uring just read, so the ring keeps reaping and submitting).
//
// Thread-safe. The destructor runs every task already queued, then joins;
// posting while it runs is a caller bug.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvtier {

class WorkerPool {
 public:
  explicit WorkerPool(unsigned threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  void Post(std::function<void()> task);

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;  // guarded by mu_
  bool stopping_ = false;                    // guarded by mu_
  std::vector<std::thread> threads_;
};

}  // namespace kvtier

// WorkerPool: a fixed set of threads running queued tasks in FIFO order,
// for CPU work that must not run on an I/O thread (e.g. checksumming what
// an io_uring just read, so the ring keeps reaping and submitting).
//
// Thread-safe. The destructor runs every task already queued, then joins;
// posting while it runs is a caller bug.
#pragma once

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "common/mutex.h"

namespace kvtier {

class WorkerPool {
 public:
  explicit WorkerPool(unsigned threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  void Post(std::function<void()> task) EXCLUDES(mu_);

 private:
  void Loop() EXCLUDES(mu_);

  Mutex mu_;
  CondVar cv_;
  std::deque<std::function<void()>> tasks_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace kvtier

// Mover: threads that move blocks between tiers (and plan prefetches) off
// the server's request threads. Jobs wait in a bounded queue, FIFO; a job
// may wait (for a busy tier, say) because it holds only a mover thread.
//
// Bounds and backpressure: a job is admitted with the bytes it buffers
// (TryReserve, then Submit) or with none (TrySubmit). Past max_jobs queued,
// or past max_bytes buffered (a job buffering bytes; unless the queue is
// empty, so any one block fits), admission fails and the caller answers Busy or drops what it
// cannot move, counted. A job's room returns when it has run.
//
// Thread-safe. The destructor runs every job already queued, then joins;
// submitting while it runs is a caller bug.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/counters.h"
#include "common/mutex.h"

namespace kvtier {

class Mover {
 public:
  // `name` prefixes the counters (e.g. "engine.demoter").
  Mover(std::string name, unsigned threads, uint64_t max_bytes, size_t max_jobs);
  ~Mover();
  Mover(const Mover&) = delete;
  Mover& operator=(const Mover&) = delete;

  // Takes room for one job buffering `bytes`; false (counted as refused)
  // when the queue is full. Hand the room to Submit, or back to Unreserve.
  bool TryReserve(uint64_t bytes);
  void Unreserve(uint64_t bytes);
  // Queues `job` in the room TryReserve(bytes) took.
  void Submit(uint64_t bytes, std::function<void()> job);
  // TryReserve(0) + Submit: false when max_jobs are queued.
  bool TrySubmit(std::function<void()> job);

  // <name>.jobs_queued / bytes_queued (now), jobs_run, refused.
  void VisitCounters(CounterVisitor& v) const;

 private:
  struct Job {
    uint64_t bytes = 0;
    std::function<void()> run;
  };
  void Loop();

  const std::string name_;
  const uint64_t max_bytes_;
  const size_t max_jobs_;
  mutable Mutex mu_;
  CondVar cv_;
  std::deque<Job> queue_ GUARDED_BY(mu_);
  size_t jobs_ GUARDED_BY(mu_) = 0;     // admitted and not yet run
  uint64_t bytes_ GUARDED_BY(mu_) = 0;  // their buffered bytes
  int64_t jobs_run_ GUARDED_BY(mu_) = 0;
  int64_t refused_ GUARDED_BY(mu_) = 0;
  bool stopping_ GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace kvtier

// RetryScheduler: runs jobs once the injected Clock reaches their time,
// for work to be tried again a moment later (a tier that answered Busy).
// Waiting goes through Clock::WaitUntilUs, so on a test's FakeClock a job
// runs when the test moves the clock past its time, never before.
//
// Jobs run one at a time on the scheduler's own thread, in the order of
// their times (equal times: in the order they came). A job must not wait
// (a lock across I/O, a condition variable): it holds up every job due
// after it. Work that may wait is handed to a mover from the job.
//
// Bounded: at most `max_jobs` wait at once. RunAt past that, or once Stop
// began, refuses the job (false, counted): the caller gives up what it
// would have retried, as it does when it cannot queue work anywhere else.
//
// Stop (the destructor calls it): refuses every later RunAt and runs every
// job still waiting at once, in time order, without waiting for its time,
// then joins the thread. A job's owner counts it as work in flight and
// waits for it (the engine's WaitForIdle); running it early ends it, and a
// job that tries to schedule another from then on is refused, so its
// owner fails what it retried and the wait ends on any clock, a fake one
// that nobody moves included.
//
// Thread-safe. Stop is for the owner's thread, not a job's.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <utility>

#include "common/clock.h"
#include "common/counters.h"
#include "common/mutex.h"

namespace kvtier {

class RetryScheduler {
 public:
  // `name` prefixes the counters ("engine.retries"); `clock` is borrowed
  // and must outlive the scheduler. Starts the thread.
  RetryScheduler(std::string name, const Clock& clock, size_t max_jobs);
  ~RetryScheduler();  // Stop()
  RetryScheduler(const RetryScheduler&) = delete;
  RetryScheduler& operator=(const RetryScheduler&) = delete;

  // Runs `job` once the clock reaches `when_us` (at once when it has). True
  // when it is queued; false (refused, counted) when max_jobs wait already
  // or Stop began: then `job` never runs.
  bool RunAt(uint64_t when_us, std::function<void()> job) EXCLUDES(mu_);
  // RunAt(clock.NowUs() + delay_us, job).
  bool RunAfter(uint64_t delay_us, std::function<void()> job) EXCLUDES(mu_);

  // Refuses later jobs, runs those waiting now (see above) and joins.
  // Later calls do nothing.
  void Stop() EXCLUDES(mu_);

  // <name>.waiting (now: queued and not yet run), .run, .refused.
  void VisitCounters(CounterVisitor& v) const EXCLUDES(mu_);

 private:
  void Loop() EXCLUDES(mu_);

  const std::string name_;
  const Clock& clock_;
  const size_t max_jobs_;
  mutable Mutex mu_;  // a leaf
  CondVar cv_;        // a job came, or Stop
  // By (time, arrival): the first is the next to run.
  std::map<std::pair<uint64_t, uint64_t>, std::function<void()>> jobs_ GUARDED_BY(mu_);
  uint64_t arrivals_ GUARDED_BY(mu_) = 0;
  bool stopping_ GUARDED_BY(mu_) = false;
  int64_t run_ GUARDED_BY(mu_) = 0;
  int64_t refused_ GUARDED_BY(mu_) = 0;
  std::thread thread_;  // last: started once the rest is built
};

}  // namespace kvtier

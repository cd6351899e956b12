#include "common/retry_scheduler.h"

#include "common/check.h"

namespace kvtier {

RetryScheduler::RetryScheduler(std::string name, const Clock& clock, size_t max_jobs)
    : name_(std::move(name)), clock_(clock), max_jobs_(max_jobs) {
  KVTIER_CHECK(max_jobs > 0, "a retry scheduler needs room for a job");
  thread_ = std::thread([this] { Loop(); });
}

RetryScheduler::~RetryScheduler() { Stop(); }

bool RetryScheduler::RunAt(uint64_t when_us, std::function<void()> job) {
  MutexLock lock(mu_);
  if (stopping_ || jobs_.size() >= max_jobs_) {
    ++refused_;
    return false;
  }
  jobs_.emplace(std::make_pair(when_us, arrivals_++), std::move(job));
  // Under the lock: the job may be what lets the owner stop and destroy
  // this scheduler, which must not happen while RunAt still touches cv_.
  cv_.NotifyOne();
  return true;
}

bool RetryScheduler::RunAfter(uint64_t delay_us, std::function<void()> job) {
  return RunAt(clock_.NowUs() + delay_us, std::move(job));
}

void RetryScheduler::Stop() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
    cv_.NotifyOne();
  }
  if (thread_.joinable()) thread_.join();
}

void RetryScheduler::Loop() {
  MutexLock lock(mu_);
  for (;;) {
    if (jobs_.empty()) {
      if (stopping_) return;
      cv_.Wait(mu_);
      continue;
    }
    const uint64_t when = jobs_.begin()->first.first;
    if (!stopping_ && clock_.NowUs() < when) {
      clock_.WaitUntilUs(mu_, cv_, when);  // or an earlier job came, or Stop
      continue;
    }
    std::function<void()> job = std::move(jobs_.begin()->second);
    jobs_.erase(jobs_.begin());
    lock.Unlock();
    job();
    job = nullptr;  // what it captured goes before it counts as run
    lock.Lock();
    ++run_;
  }
}

void RetryScheduler::VisitCounters(CounterVisitor& v) const {
  MutexLock lock(mu_);
  v.VisitGauge(name_ + ".waiting", static_cast<int64_t>(jobs_.size()));
  v.Visit(name_ + ".run", run_);
  v.Visit(name_ + ".refused", refused_);
}

}  // namespace kvtier

#include "daemon/engine/mover.h"

#include "common/check.h"

namespace kvtier {

Mover::Mover(std::string name, unsigned threads, uint64_t max_bytes, size_t max_jobs)
    : name_(std::move(name)), max_bytes_(max_bytes), max_jobs_(max_jobs) {
  KVTIER_CHECK(threads > 0 && max_jobs > 0, "a mover needs a thread and room for a job");
  threads_.reserve(threads);
  for (unsigned i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

Mover::~Mover() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  cv_.NotifyAll();
  for (auto& t : threads_) t.join();
}

bool Mover::TryReserve(uint64_t bytes) {
  MutexLock lock(mu_);
  if (jobs_ >= max_jobs_ || (bytes > 0 && jobs_ > 0 && bytes_ + bytes > max_bytes_)) {
    ++refused_;
    return false;
  }
  ++jobs_;
  bytes_ += bytes;
  return true;
}

void Mover::Unreserve(uint64_t bytes) {
  MutexLock lock(mu_);
  --jobs_;
  bytes_ -= bytes;
}

void Mover::Submit(uint64_t bytes, std::function<void()> job) {
  {
    MutexLock lock(mu_);
    KVTIER_CHECK(!stopping_, "job submitted to a mover being destroyed");
    queue_.push_back(Job{bytes, std::move(job)});
  }
  cv_.NotifyOne();
}

bool Mover::TrySubmit(std::function<void()> job) {
  if (!TryReserve(0)) return false;
  Submit(0, std::move(job));
  return true;
}

void Mover::Loop() {
  for (;;) {
    Job job;
    {
      MutexLock lock(mu_);
      while (!stopping_ && queue_.empty()) cv_.Wait(mu_);
      if (queue_.empty()) return;  // stopping, and every queued job ran
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    job.run();
    job.run = nullptr;  // whatever it captured goes before its room returns
    MutexLock lock(mu_);
    --jobs_;
    bytes_ -= job.bytes;
    ++jobs_run_;
  }
}

void Mover::VisitCounters(CounterVisitor& v) const {
  MutexLock lock(mu_);
  v.VisitGauge(name_ + ".jobs_queued", static_cast<int64_t>(jobs_));
  v.VisitGauge(name_ + ".bytes_queued", static_cast<int64_t>(bytes_));
  v.Visit(name_ + ".jobs_run", jobs_run_);
  v.Visit(name_ + ".refused", refused_);
}

}  // namespace kvtier

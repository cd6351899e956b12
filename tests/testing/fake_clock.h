// A Clock that moves only when told to. Thread-safe.
//
// Threads that wait for a time on it (Clock::WaitUntilUs: a
// RetryScheduler's thread, SleepUntilUs) wake when AdvanceUs or SetUs
// reaches their time, never before. AwaitWaiter tells a test that such a
// thread is waiting, and for when, so the test moves the clock to a retry
// in the order it means, without sleeping.
#pragma once

#include <atomic>
#include <cstdint>
#include <list>
#include <vector>

#include "common/clock.h"
#include "common/mutex.h"

namespace kvtier::testing {

class FakeClock final : public Clock {
 public:
  explicit FakeClock(uint64_t start_us = 1'000'000) : now_us_(start_us) {}
  FakeClock(const FakeClock&) = delete;
  FakeClock& operator=(const FakeClock&) = delete;

  uint64_t NowUs() const override { return now_us_.load(std::memory_order_relaxed); }
  void AdvanceUs(uint64_t us) {
    now_us_.fetch_add(us, std::memory_order_relaxed);
    WakeWaiters();
  }
  void SetUs(uint64_t us) {
    now_us_.store(us, std::memory_order_relaxed);
    WakeWaiters();
  }

  // Registered (under `mu`, before the time is looked at) where a move
  // of the clock finds it and notifies `cv` under `mu`: a move from then
  // on reaches this wait. `mu` is given back only by the wait itself, so
  // nothing the caller checked under it changes unseen before the wait.
  void WaitUntilUs(Mutex& mu, CondVar& cv, uint64_t when_us) const override REQUIRES(mu) {
    std::list<Waiter>::iterator me;
    {
      MutexLock lock(waiters_mu_);
      me = waiters_.insert(waiters_.end(), Waiter{&mu, &cv, when_us});
      waiters_changed_.NotifyAll();
    }
    if (NowUs() < when_us) cv.Wait(mu);
    mu.Unlock();  // a move notifying this wait holds it: let the move end
    {
      MutexLock lock(waiters_mu_);
      while (me->wakers > 0) waiters_changed_.Wait(waiters_mu_);
      waiters_.erase(me);
      waiters_changed_.NotifyAll();
    }
    mu.Lock();
  }

  // Blocks until some thread waits on this clock for a time after NowUs();
  // returns the earliest such time. Waits for times already reached do not
  // count; one notified for another reason and not yet awake still counts
  // with its time (a scheduler waiting for a job at 20 that was just given
  // one at 10 may be reported waiting for 20: give a waiting scheduler no
  // earlier job from the test thread before asking).
  uint64_t AwaitWaiter() const {
    MutexLock lock(waiters_mu_);
    for (;;) {
      const uint64_t now = NowUs();
      bool found = false;
      uint64_t earliest = 0;
      for (const Waiter& w : waiters_) {
        if (w.when_us > now && (!found || w.when_us < earliest)) {
          earliest = w.when_us;
          found = true;
        }
      }
      if (found) return earliest;
      waiters_changed_.Wait(waiters_mu_);
    }
  }

 private:
  struct Waiter {
    Mutex* mu;  // mu, cv and when_us are set once, when it is registered
    CondVar* cv;
    uint64_t when_us;
    int wakers = 0;  // moves notifying it now: it stays registered until 0
  };
  // Notifies every waiter under its own mutex, which is never taken while
  // holding waiters_mu_ (a waiter registers holding it).
  void WakeWaiters() {
    std::vector<std::list<Waiter>::iterator> woken;
    {
      MutexLock lock(waiters_mu_);
      for (auto it = waiters_.begin(); it != waiters_.end(); ++it) {
        ++it->wakers;
        woken.push_back(it);
      }
    }
    for (auto it : woken) {
      MutexLock waiter(*it->mu);
      it->cv->NotifyAll();
    }
    MutexLock lock(waiters_mu_);
    for (auto it : woken) --it->wakers;
    waiters_changed_.NotifyAll();
  }

  std::atomic<uint64_t> now_us_;
  mutable Mutex waiters_mu_;  // after a waiter's mutex
  mutable CondVar waiters_changed_;
  mutable std::list<Waiter> waiters_ GUARDED_BY(waiters_mu_);
};

}  // namespace kvtier::testing

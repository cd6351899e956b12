// RetryScheduler (common/retry_scheduler.h) on a FakeClock: a job runs once
// the clock reaches its time and not before, in time order, within its
// bound, and Stop runs what still waits. FakeClock::AwaitWaiter is the
// event that the scheduler waits for a time (so every job due before it
// has run); a job's own promise is the event that it ran. Nothing sleeps.
#include "common/retry_scheduler.h"

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "common/counters.h"
#include "common/mutex.h"
#include "tests/testing/fake_clock.h"

namespace kvtier {
namespace {

using ::kvtier::testing::FakeClock;

// The jobs that ran, in the order they ran.
class RunLog {
 public:
  std::function<void()> Job(std::string name) {
    return [this, name = std::move(name)] {
      MutexLock lock(mu_);
      ran_.push_back(name);
      cv_.NotifyAll();
    };
  }
  // Blocks until `n` jobs ran; returns their names.
  std::vector<std::string> WaitFor(size_t n) {
    MutexLock lock(mu_);
    while (ran_.size() < n) cv_.Wait(mu_);
    return ran_;
  }
  std::vector<std::string> ran() {
    MutexLock lock(mu_);
    return ran_;
  }

 private:
  Mutex mu_;
  CondVar cv_;
  std::vector<std::string> ran_ GUARDED_BY(mu_);
};

std::map<std::string, int64_t> Counters(const RetryScheduler& s) {
  CounterCollector c;
  s.VisitCounters(c);
  std::map<std::string, int64_t> out(c.counters().begin(), c.counters().end());
  return out;
}

TEST(RetrySchedulerTest, AJobRunsOnceTheClockReachesItsTimeAndNotBefore) {
  FakeClock clock;
  const uint64_t t0 = clock.NowUs();
  RetryScheduler scheduler("test.retries", clock, 8);
  RunLog log;
  ASSERT_TRUE(scheduler.RunAt(t0 + 100, log.Job("a")));
  EXPECT_EQ(clock.AwaitWaiter(), t0 + 100) << "the scheduler waits for the job's time";
  clock.AdvanceUs(99);
  EXPECT_EQ(clock.AwaitWaiter(), t0 + 100) << "woken 1 us early, it waits again";
  EXPECT_TRUE(log.ran().empty());
  EXPECT_EQ(Counters(scheduler)["test.retries.waiting"], 1);
  clock.AdvanceUs(1);
  EXPECT_EQ(log.WaitFor(1), std::vector<std::string>{"a"});
  // RunAfter counts from the clock's now.
  ASSERT_TRUE(scheduler.RunAfter(50, log.Job("b")));
  EXPECT_EQ(clock.AwaitWaiter(), t0 + 150);
  clock.SetUs(t0 + 150);
  EXPECT_EQ(log.WaitFor(2), (std::vector<std::string>{"a", "b"}));
  scheduler.Stop();
  auto c = Counters(scheduler);
  EXPECT_EQ(c["test.retries.waiting"], 0);
  EXPECT_EQ(c["test.retries.run"], 2);
  EXPECT_EQ(c["test.retries.refused"], 0);
}

TEST(RetrySchedulerTest, JobsRunInTheOrderOfTheirTimesAndOnlyThoseDue) {
  FakeClock clock;
  const uint64_t t0 = clock.NowUs();
  RetryScheduler scheduler("test.retries", clock, 8);
  RunLog log;
  ASSERT_TRUE(scheduler.RunAt(t0 + 30, log.Job("30")));
  ASSERT_TRUE(scheduler.RunAt(t0 + 10, log.Job("10 first")));
  ASSERT_TRUE(scheduler.RunAt(t0 + 40, log.Job("40")));
  ASSERT_TRUE(scheduler.RunAt(t0 + 20, log.Job("20")));
  ASSERT_TRUE(scheduler.RunAt(t0 + 10, log.Job("10 second")));
  clock.SetUs(t0 + 30);
  EXPECT_EQ(log.WaitFor(4), (std::vector<std::string>{"10 first", "10 second", "20", "30"}));
  EXPECT_EQ(clock.AwaitWaiter(), t0 + 40) << "the job not yet due waits";
  EXPECT_EQ(log.ran().size(), 4u);
  clock.SetUs(t0 + 40);
  EXPECT_EQ(log.WaitFor(5).back(), "40");
}

// The retry pattern: a job that schedules its own next try runs that try
// at its own time, one pause after the clock reached the first.
TEST(RetrySchedulerTest, AJobMayScheduleTheNextTry) {
  FakeClock clock;
  const uint64_t t0 = clock.NowUs();
  RetryScheduler scheduler("test.retries", clock, 8);
  RunLog log;
  ASSERT_TRUE(scheduler.RunAfter(1000, [&] {
    log.Job("first")();
    EXPECT_TRUE(scheduler.RunAfter(1000, log.Job("second")));
  }));
  clock.SetUs(t0 + 1000);
  EXPECT_EQ(log.WaitFor(1), std::vector<std::string>{"first"});
  EXPECT_EQ(clock.AwaitWaiter(), t0 + 2000);
  EXPECT_EQ(log.ran().size(), 1u);
  clock.SetUs(t0 + 2000);
  EXPECT_EQ(log.WaitFor(2).back(), "second");
}

// A full scheduler is an answer: the job is refused (counted) and never runs.
TEST(RetrySchedulerTest, PastItsBoundAJobIsRefused) {
  FakeClock clock;
  const uint64_t t0 = clock.NowUs();
  RetryScheduler scheduler("test.retries", clock, 2);
  RunLog log;
  ASSERT_TRUE(scheduler.RunAt(t0 + 10, log.Job("a")));
  ASSERT_TRUE(scheduler.RunAt(t0 + 10, log.Job("b")));
  EXPECT_FALSE(scheduler.RunAt(t0 + 5, log.Job("refused")));
  auto c = Counters(scheduler);
  EXPECT_EQ(c["test.retries.waiting"], 2);
  EXPECT_EQ(c["test.retries.refused"], 1);
  clock.SetUs(t0 + 10);
  EXPECT_EQ(log.WaitFor(2), (std::vector<std::string>{"a", "b"}));
  ASSERT_TRUE(scheduler.RunAt(t0 + 20, log.Job("c"))) << "room came back once they ran";
  clock.SetUs(t0 + 20);
  EXPECT_EQ(log.WaitFor(3), (std::vector<std::string>{"a", "b", "c"}));
}

// Stop (and the destructor) run what still waits, at once, in time order,
// on a clock that never gets there; what those jobs would schedule, and
// any later job, is refused.
TEST(RetrySchedulerTest, StopRunsTheWaitingJobsAtOnceAndRefusesMore) {
  FakeClock clock;
  const uint64_t t0 = clock.NowUs();
  RunLog log;
  bool next_try_queued = true;
  {
    RetryScheduler scheduler("test.retries", clock, 8);
    ASSERT_TRUE(scheduler.RunAt(t0 + 1'000'000, [&] {
      log.Job("sooner")();
      next_try_queued = scheduler.RunAfter(1000, log.Job("next try"));
    }));
    ASSERT_TRUE(scheduler.RunAt(t0 + 2'000'000, log.Job("later")));
    EXPECT_EQ(clock.AwaitWaiter(), t0 + 1'000'000);
    scheduler.Stop();
    EXPECT_EQ(log.ran(), (std::vector<std::string>{"sooner", "later"}));
    EXPECT_FALSE(next_try_queued) << "a job run by Stop cannot schedule another";
    EXPECT_FALSE(scheduler.RunAt(t0, log.Job("after stop")));
    auto c = Counters(scheduler);
    EXPECT_EQ(c["test.retries.run"], 2);
    EXPECT_EQ(c["test.retries.refused"], 2);
    scheduler.Stop();  // again: nothing
  }
  {
    RetryScheduler scheduler("test.retries", clock, 8);
    ASSERT_TRUE(scheduler.RunAt(t0 + 3'000'000, log.Job("at destruction")));
  }
  EXPECT_EQ(log.ran().back(), "at destruction");
  EXPECT_EQ(clock.NowUs(), t0) << "nobody moved the clock";
}

// On the system clock (Clock's own WaitUntilUs: a timed wait on the steady
// clock) a job runs once its delay has passed.
TEST(RetrySchedulerTest, OnTheSystemClockAJobRunsAfterItsDelay) {
  SystemClock clock;
  RetryScheduler scheduler("test.retries", clock, 8);
  std::promise<uint64_t> ran_at;
  const uint64_t asked_at = clock.NowUs();
  ASSERT_TRUE(scheduler.RunAfter(2000, [&] { ran_at.set_value(clock.NowUs()); }));
  EXPECT_GE(ran_at.get_future().get(), asked_at + 2000);
}

// SleepUntilUs (ClusterClient's pause) waits on the clock it is given.
TEST(RetrySchedulerTest, SleepUntilWaitsForTheFakeClock) {
  FakeClock clock;
  const uint64_t t0 = clock.NowUs();
  std::promise<uint64_t> woke_at;
  std::thread sleeper([&] {
    SleepUntilUs(clock, t0 + 10'000);
    woke_at.set_value(clock.NowUs());
  });
  EXPECT_EQ(clock.AwaitWaiter(), t0 + 10'000);
  clock.AdvanceUs(9'999);
  EXPECT_EQ(clock.AwaitWaiter(), t0 + 10'000) << "still asleep";
  clock.AdvanceUs(1);
  EXPECT_EQ(woke_at.get_future().get(), t0 + 10'000);
  sleeper.join();
}

}  // namespace
}  // namespace kvtier

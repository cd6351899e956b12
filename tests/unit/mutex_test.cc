// The lock wrappers of common/mutex.h: exclusion, try-locks, the scoped
// locks' relocking, the reader/writer sides, condition waits and
// AssertHeld.
#include "common/mutex.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>
#include <vector>

namespace kvtier {
namespace {

using namespace std::chrono_literals;

// Whether another thread could take `mu` right now.
bool FreeElsewhere(Mutex& mu) {
  return std::async(std::launch::async,
                    [&mu] {
                      if (!mu.TryLock()) return false;
                      mu.Unlock();
                      return true;
                    })
      .get();
}

TEST(MutexTest, LockExcludesOtherThreads) {
  Mutex mu;
  EXPECT_TRUE(FreeElsewhere(mu));
  mu.Lock();
  EXPECT_FALSE(FreeElsewhere(mu));
  mu.Unlock();
  EXPECT_TRUE(FreeElsewhere(mu));
}

TEST(MutexTest, CountersStayExactUnderContention) {
  Mutex mu;
  int64_t count = 0;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        MutexLock lock(mu);
        ++count;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(count, 40000);
}

TEST(MutexTest, TryLockTakesAFreeMutexOnly) {
  Mutex mu;
  ASSERT_TRUE(mu.TryLock());
  EXPECT_FALSE(FreeElsewhere(mu));
  mu.Unlock();
}

TEST(MutexTest, ScopedLockUnlocksAndRelocks) {
  Mutex mu;
  {
    MutexLock lock(mu);
    EXPECT_FALSE(FreeElsewhere(mu));
    lock.Unlock();
    EXPECT_TRUE(FreeElsewhere(mu));
    lock.Lock();
    EXPECT_FALSE(FreeElsewhere(mu));
  }
  EXPECT_TRUE(FreeElsewhere(mu));
  {
    MutexLock lock(mu);
    lock.Unlock();  // the destructor must not unlock again
  }
  EXPECT_TRUE(FreeElsewhere(mu));
}

TEST(MutexTest, AssertHeldPassesForTheHolder) {
  Mutex mu;
  MutexLock lock(mu);
  mu.AssertHeld();
}

TEST(MutexDeathTest, AssertHeldAbortsWhenNotHeld) {
  Mutex mu;
  EXPECT_DEATH(mu.AssertHeld(), "mutex not held by this thread");
  // Held by another thread is not held by this one.
  mu.Lock();
  std::thread([&mu] { EXPECT_DEATH(mu.AssertHeld(), "mutex not held by this thread"); }).join();
  mu.Unlock();
}

TEST(SharedMutexTest, ReadersShareWritersExclude) {
  SharedMutex mu;
  auto elsewhere = [&mu](bool reader) {
    return std::async(std::launch::async,
                      [&mu, reader] {
                        if (reader) {
                          if (!mu.ReaderTryLock()) return false;
                          mu.ReaderUnlock();
                          return true;
                        }
                        if (!mu.TryLock()) return false;
                        mu.Unlock();
                        return true;
                      })
        .get();
  };
  {
    ReaderMutexLock lock(mu);
    EXPECT_TRUE(elsewhere(/*reader=*/true));
    EXPECT_FALSE(elsewhere(/*reader=*/false));
  }
  {
    WriterMutexLock lock(mu);
    mu.AssertHeld();
    EXPECT_FALSE(elsewhere(/*reader=*/true));
    EXPECT_FALSE(elsewhere(/*reader=*/false));
  }
  EXPECT_TRUE(elsewhere(/*reader=*/false));
}

TEST(CondVarTest, WaitReturnsOnceNotifiedAndHoldsTheMutex) {
  Mutex mu;
  CondVar cv;
  bool ready = false;
  std::thread setter([&] {
    std::this_thread::sleep_for(10ms);
    MutexLock lock(mu);
    ready = true;
    cv.NotifyAll();
  });
  {
    MutexLock lock(mu);
    while (!ready) cv.Wait(mu);
    mu.AssertHeld();  // the owner is restored after the wait
    EXPECT_FALSE(FreeElsewhere(mu));
  }
  setter.join();
  EXPECT_TRUE(FreeElsewhere(mu));
}

TEST(CondVarTest, WaitGivesTheMutexBackWhileItSleeps) {
  Mutex mu;
  CondVar cv;
  bool done = false;
  std::thread waiter([&] {
    MutexLock lock(mu);
    while (!done) cv.Wait(mu);
  });
  // The waiter sleeps holding nothing: this thread gets the mutex.
  for (;;) {
    MutexLock lock(mu);
    if (!done) {
      done = true;
      cv.NotifyOne();
      break;
    }
  }
  waiter.join();
}

TEST(CondVarTest, TimedWaitsReportTimeouts) {
  Mutex mu;
  CondVar cv;
  MutexLock lock(mu);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(cv.WaitFor(mu, 20ms));
  EXPECT_GE(std::chrono::steady_clock::now() - start, 20ms);
  EXPECT_FALSE(cv.WaitUntil(mu, std::chrono::steady_clock::now() + 1ms));
  mu.AssertHeld();
}

TEST(CondVarTest, TimedWaitReportsANotification) {
  Mutex mu;
  CondVar cv;
  bool waiting = false;
  bool notified = false;
  std::thread waiter([&] {
    MutexLock lock(mu);
    waiting = true;
    notified = cv.WaitFor(mu, 60s);  // false only if 60 s pass unnotified
  });
  // Once this thread holds mu and sees `waiting`, the waiter is inside
  // the wait (it gave mu back there).
  for (;;) {
    MutexLock lock(mu);
    if (waiting) {
      cv.NotifyAll();
      break;
    }
  }
  waiter.join();
  EXPECT_TRUE(notified);
}

}  // namespace
}  // namespace kvtier

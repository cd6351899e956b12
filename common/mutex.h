// Lock types that clang's thread-safety analysis understands: thin
// wrappers over std::mutex, std::shared_mutex and std::condition_variable
// (libstdc++'s own carry no attributes, so GUARDED_BY members locked
// through them would not be checked). Same cost as the std types, plus one
// relaxed store per lock and unlock for AssertHeld.
//
//   Mutex mu_;
//   int count_ GUARDED_BY(mu_) = 0;
//   void Add() EXCLUDES(mu_) { MutexLock lock(mu_); ++count_; }
//   void AddLocked() REQUIRES(mu_) { ++count_; }
//
// A condition is waited for with a loop over CondVar::Wait, not a predicate
// lambda (the analysis does not know a lambda runs under the lock):
//   while (!ready_) cv_.Wait(mu_);
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <shared_mutex>
#include <thread>

#include "common/check.h"
#include "common/thread_annotations.h"

namespace kvtier {

namespace mutex_internal {

// Which thread holds a lock's exclusive side, for AssertHeld. Relaxed:
// only the holder's own thread ever compares equal, and it wrote the id.
class Owner {
 public:
  void Took() { id_.store(std::this_thread::get_id(), std::memory_order_relaxed); }
  void Gave() { id_.store(std::thread::id(), std::memory_order_relaxed); }
  bool IsCaller() const { return id_.load(std::memory_order_relaxed) == std::this_thread::get_id(); }

 private:
  std::atomic<std::thread::id> id_{};
};

}  // namespace mutex_internal

// An exclusive, non-recursive lock. Thread-safe.
class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  // Blocks until the calling thread holds the lock. Taking it twice on one
  // thread is a deadlock (a bug).
  void Lock() ACQUIRE() {
    mu_.lock();
    owner_.Took();
  }
  // Gives the lock back; the calling thread must hold it.
  void Unlock() RELEASE() {
    owner_.Gave();
    mu_.unlock();
  }
  // Takes the lock if it is free and returns true; false, without
  // blocking, otherwise.
  bool TryLock() TRY_ACQUIRE(true) {
    if (!mu_.try_lock()) return false;
    owner_.Took();
    return true;
  }
  // Aborts unless the calling thread holds the lock; afterwards the
  // analysis treats it as held (for code it cannot follow, e.g. a callback
  // documented to run under the lock).
  void AssertHeld() const ASSERT_CAPABILITY(this) { KVTIER_CHECK(owner_.IsCaller(), "mutex not held by this thread"); }

  // For std algorithms that want a BasicLockable (std::scoped_lock over
  // several mutexes, std::condition_variable_any); the analysis does not
  // follow them.
  void lock() ACQUIRE() { Lock(); }
  void unlock() RELEASE() { Unlock(); }

 private:
  friend class CondVar;

  std::mutex mu_;
  mutex_internal::Owner owner_;  // for AssertHeld
};

// A reader/writer lock: many readers or one writer. Thread-safe.
class CAPABILITY("shared_mutex") SharedMutex {
 public:
  SharedMutex() = default;
  SharedMutex(const SharedMutex&) = delete;
  SharedMutex& operator=(const SharedMutex&) = delete;

  // Exclusive (writer) side.
  void Lock() ACQUIRE() {
    mu_.lock();
    owner_.Took();
  }
  void Unlock() RELEASE() {
    owner_.Gave();
    mu_.unlock();
  }
  bool TryLock() TRY_ACQUIRE(true) {
    if (!mu_.try_lock()) return false;
    owner_.Took();
    return true;
  }
  // Shared (reader) side.
  void ReaderLock() ACQUIRE_SHARED() { mu_.lock_shared(); }
  void ReaderUnlock() RELEASE_SHARED() { mu_.unlock_shared(); }
  bool ReaderTryLock() TRY_ACQUIRE_SHARED(true) { return mu_.try_lock_shared(); }
  // Aborts unless the calling thread holds the writer side.
  void AssertHeld() const ASSERT_CAPABILITY(this) {
    KVTIER_CHECK(owner_.IsCaller(), "shared mutex not held exclusively by this thread");
  }

 private:
  std::shared_mutex mu_;
  mutex_internal::Owner owner_;  // for AssertHeld (the writer side)
};

// Holds a Mutex from construction to destruction (as std::unique_lock).
// Unlock() and Lock() give it back and take it again within the scope; the
// destructor gives it back only if held. Not thread-safe itself: one
// thread's stack object.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ACQUIRE(mu) : mu_(mu) { mu_.Lock(); }
  ~MutexLock() RELEASE() {
    if (held_) mu_.Unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Unlock() RELEASE() {
    held_ = false;
    mu_.Unlock();
  }
  void Lock() ACQUIRE() {
    mu_.Lock();
    held_ = true;
  }

 private:
  Mutex& mu_;
  bool held_ = true;
};

// Holds a SharedMutex's writer side for its scope.
class SCOPED_CAPABILITY WriterMutexLock {
 public:
  explicit WriterMutexLock(SharedMutex& mu) ACQUIRE(mu) : mu_(mu) { mu_.Lock(); }
  ~WriterMutexLock() RELEASE() { mu_.Unlock(); }
  WriterMutexLock(const WriterMutexLock&) = delete;
  WriterMutexLock& operator=(const WriterMutexLock&) = delete;

 private:
  SharedMutex& mu_;
};

// Holds a SharedMutex's reader side for its scope.
class SCOPED_CAPABILITY ReaderMutexLock {
 public:
  explicit ReaderMutexLock(SharedMutex& mu) ACQUIRE_SHARED(mu) : mu_(mu) { mu_.ReaderLock(); }
  ~ReaderMutexLock() RELEASE() { mu_.ReaderUnlock(); }
  ReaderMutexLock(const ReaderMutexLock&) = delete;
  ReaderMutexLock& operator=(const ReaderMutexLock&) = delete;

 private:
  SharedMutex& mu_;
};

// A condition variable over Mutex. Every wait gives `mu` back while it
// sleeps and holds it again when it returns; wakeups may be spurious, so
// callers wait in a loop over their condition. Thread-safe.
class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  // Sleeps until notified (or spuriously woken).
  void Wait(Mutex& mu) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(Release(mu));
    cv_.wait(lock);
    Reacquire(mu, lock);
  }
  // Sleeps until notified or `deadline`; returns false when it woke
  // because the deadline passed, true otherwise.
  template <class ClockT, class Duration>
  bool WaitUntil(Mutex& mu, const std::chrono::time_point<ClockT, Duration>& deadline) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(Release(mu));
    const bool notified = cv_.wait_until(lock, deadline) == std::cv_status::no_timeout;
    Reacquire(mu, lock);
    return notified;
  }
  // Sleeps until notified or `timeout` passed; as WaitUntil.
  template <class Rep, class Period>
  bool WaitFor(Mutex& mu, const std::chrono::duration<Rep, Period>& timeout) REQUIRES(mu) {
    return WaitUntil(mu, std::chrono::steady_clock::now() + timeout);
  }

  void NotifyOne() { cv_.notify_one(); }
  void NotifyAll() { cv_.notify_all(); }

 private:
  // Hands the held std::mutex to a unique_lock for the wait (clearing the
  // owner, since the wait gives it back) and takes it back after.
  static std::unique_lock<std::mutex> Release(Mutex& mu) {
    mu.owner_.Gave();
    return std::unique_lock<std::mutex>(mu.mu_, std::adopt_lock);
  }
  static void Reacquire(Mutex& mu, std::unique_lock<std::mutex>& lock) {
    lock.release();
    mu.owner_.Took();
  }

  std::condition_variable cv_;
};

}  // namespace kvtier

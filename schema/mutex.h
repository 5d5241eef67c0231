// A mutex, its scoped lock and a condition variable that Clang's
// thread-safety analysis understands, so that locking rules are checked by
// the compiler rather than written in comments:
//
//   class Counter {
//    public:
//     void Add() TETHER_EXCLUDES(mu_) {
//       MutexLock lock(&mu_);
//       AddLocked();
//     }
//    private:
//     void AddLocked() TETHER_REQUIRES(mu_) { ++n_; }
//     Mutex mu_;
//     int n_ TETHER_GUARDED_BY(mu_) = 0;
//   };
//
// A clang build with -Wthread-safety (the fuzz and tsan presets, with
// -Werror=thread-safety) rejects an access to n_ without mu_ held. With
// other compilers the annotations expand to nothing. The macros follow
// LevelDB's port/thread_annotations.h and Clang's documentation.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#if defined(__clang__)
#define TETHER_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define TETHER_THREAD_ANNOTATION(x)
#endif

// On a type: it is a lock.
#define TETHER_CAPABILITY(x) TETHER_THREAD_ANNOTATION(capability(x))
// On a type: an object that holds a lock for its lifetime.
#define TETHER_SCOPED_CAPABILITY TETHER_THREAD_ANNOTATION(scoped_lockable)
// On a member: read and written only with the lock held.
#define TETHER_GUARDED_BY(x) TETHER_THREAD_ANNOTATION(guarded_by(x))
// On a pointer member: what it points to is guarded by the lock.
#define TETHER_PT_GUARDED_BY(x) TETHER_THREAD_ANNOTATION(pt_guarded_by(x))
// On a function: callers hold the lock (the `*Locked` methods).
#define TETHER_REQUIRES(...) \
  TETHER_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
// On a function: callers must not hold the lock (the function takes it).
#define TETHER_EXCLUDES(...) \
  TETHER_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define TETHER_ACQUIRE(...) \
  TETHER_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define TETHER_RELEASE(...) \
  TETHER_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define TETHER_ASSERT_CAPABILITY(x) \
  TETHER_THREAD_ANNOTATION(assert_capability(x))
#define TETHER_RETURN_CAPABILITY(x) TETHER_THREAD_ANNOTATION(lock_returned(x))
// For the rare function the analysis cannot follow; say why next to it.
#define TETHER_NO_THREAD_SAFETY_ANALYSIS \
  TETHER_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace tether {

class TETHER_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() TETHER_ACQUIRE() { mu_.lock(); }
  void Unlock() TETHER_RELEASE() { mu_.unlock(); }
  // Tells the analysis the lock is held where it cannot see it taken (a
  // callback run under the lock by code that takes it).
  void AssertHeld() const TETHER_ASSERT_CAPABILITY(this) {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds a Mutex from construction to destruction, or until Unlock().
class TETHER_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) TETHER_ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() TETHER_RELEASE() {
    if (held_) mu_->Unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  // Lets go before the end of the scope (to send what was built under the
  // lock without holding it).
  void Unlock() TETHER_RELEASE() {
    held_ = false;
    mu_->Unlock();
  }

 private:
  Mutex* const mu_;
  bool held_ = true;
};

// A condition variable, waited on with a Mutex held.
class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  // Releases `mu` while waiting; holds it again on return.
  void Wait(Mutex& mu) TETHER_REQUIRES(mu) {
    std::unique_lock lock(mu.mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  // As Wait(), for at most `timeout`; false when it ran out.
  template <class Rep, class Period>
  bool WaitFor(Mutex& mu, std::chrono::duration<Rep, Period> timeout)
      TETHER_REQUIRES(mu) {
    std::unique_lock lock(mu.mu_, std::adopt_lock);
    const bool woken =
        cv_.wait_for(lock, timeout) == std::cv_status::no_timeout;
    lock.release();
    return woken;
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace tether

// How a thread waits for an asynchronous request's status, which a
// connection's thread delivers. Unlike std::promise, whose set_value makes
// a futex system call every time (through pthread_once), completing one
// makes a system call only when its waiter has gone to sleep: most pushes
// are done long before anyone waits for them.
#ifndef TETHER_WORKER_COMPLETION_H_
#define TETHER_WORKER_COMPLETION_H_

#include <atomic>
#include <memory>
#include <utility>

#include "schema/status.h"

namespace tether {

class IoPool;

// One status, set once by any thread, waited for by one thread.
class Completion {
 public:
  // Stores `s` and wakes the waiter if it sleeps.
  void Set(const Status& s);
  // Returns the status once set: spins for up to `spin_us` first (a small
  // request to a nearby shard is answered in about the time a sleeping
  // thread takes to wake up), then sleeps. While it spins it runs the work
  // of `io`'s parked I/O threads (schema/io_pool.h), the connection that
  // brings the answer included; null: it only spins.
  Status Wait(int spin_us, IoPool* io = nullptr);

 private:
  static constexpr int kPending = 0;
  static constexpr int kSleeping = 1;  // the waiter is in the kernel
  static constexpr int kDone = 2;

  std::atomic<int> state_{kPending};
  Status status_;  // written before state_ becomes kDone
};

// A request's completion as a handle, in the manner of
// std::future<Status>.
class PendingStatus {
 public:
  PendingStatus() = default;

  // Issues `start(done)`, where done(const Status&) completes it.
  template <typename Start>
  static PendingStatus Of(Start&& start) {
    PendingStatus p;
    p.done_ = std::make_shared<Completion>();
    start([done = p.done_](const Status& s) { done->Set(s); });
    return p;
  }

  // Whether it has a status to wait for (get() not called yet).
  bool valid() const { return done_ != nullptr; }
  // Waits for the status, spinning for up to `spin_us` first and running
  // `io`'s parked I/O threads' work meanwhile (see Completion::Wait);
  // valid() is false after.
  Status get(int spin_us = 0, IoPool* io = nullptr) {
    return std::exchange(done_, nullptr)->Wait(spin_us, io);
  }

 private:
  std::shared_ptr<Completion> done_;
};

}  // namespace tether

#endif  // TETHER_WORKER_COMPLETION_H_

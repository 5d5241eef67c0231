// I/O threads, each running an io_context of its own.
//
// One io_context run by N threads hands work between them: whenever epoll
// reports a socket ready, the thread that saw it wakes another to wait in
// epoll while it runs the handler, so every request costs a context switch
// more than it needs (tools/bench/latency, a 1-float pull: 119-214 us with
// 2 threads sharing a context on each side, 36-40 us so). Here a connection is
// bound to one context for its life, and its handlers run on the thread
// that saw its socket; connections spread over the threads round robin.
//
//   IoPool pool(threads);                 // contexts made, none run yet
//   tcp::socket s(pool.Next());           // a connection's context
//   asio::steady_timer t(pool.main());    // timers, listeners, signals
//   pool.Start();                         // one thread per context
//   ...
//   pool.Release();  // the contexts may run out of work; threads then end
//   pool.Join();
//
// A client's blocking call spins a while for its answer (ClientOptions::
// spin_us); woken from epoll, its I/O thread would cost a context switch
// on each side of every small request. A pool made with `assisted` lends
// its contexts to such waiters (WaitAssist): an I/O thread that finishes a
// handler while one of the pool's waiters spins (or stopped spinning
// within kParkUs: its next call is likely near) parks itself, and the
// waiters run its context -- the reactor included -- on their own threads
// while they spin, as a raw TCP client polls its socket. A parked thread
// resumes once no waiter has run its context for kParkUs, or at once when a
// waiter goes to sleep (SleepingWaiter) or the pool is released: timers,
// heartbeats and replies nobody waits for are never held longer, and no thread
// parks while a waiter sleeps.
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

namespace tether {

class IoPool {
 public:
  // `threads` contexts (at least 1), each kept from running out of work
  // until Release(). `assisted`: waiters may run the contexts (see above);
  // for pools whose handlers never block (a client's).
  explicit IoPool(int threads, bool assisted = false);
  // Joins the threads; Release() first, or this waits for ever.
  ~IoPool();
  IoPool(const IoPool&) = delete;
  IoPool& operator=(const IoPool&) = delete;

  // Context 0: for what is not one connection's (listeners, timers,
  // signals, the dashboard). Its thread also serves connections.
  boost::asio::io_context& main();
  // The context for a new connection: each in turn.
  boost::asio::io_context& Next();
  size_t size() const { return slots_.size(); }

  // Starts one thread per context; once only.
  void Start();
  // Lets every context return once its work is done; idempotent, from any
  // thread.
  void Release();
  // Waits for the threads started; from a thread not in the pool.
  void Join();

  // A parked thread resumes once no waiter has run its context this long.
  static constexpr int64_t kParkUs = 500;

  // A context, what keeps it from running out of work, and whether its
  // thread is parked (io_pool.cc).
  struct Slot;
  // The pool's spinning waiters and parked threads (io_pool.cc).
  struct Waiters;

 private:
  friend class WaitAssist;

  // Runs `slot`'s context until it is out of work, parking while waiters
  // spin when the pool is assisted.
  void Run(Slot& slot);

  const bool assisted_;
  std::unique_ptr<Waiters> waiters_;
  std::vector<std::unique_ptr<Slot>> slots_;  // one per thread
  std::vector<std::thread> threads_;
  std::atomic<size_t> next_{0};
  std::atomic<bool> released_{false};
};

// A thread that waits for an answer one of `pool`'s connections brings,
// for as long as it spins: while one lives, the pool's I/O thread that
// finishes a handler parks, and Poll() runs the parked contexts on this
// thread. The pool must outlive it.
//
//   WaitAssist assist(pool);
//   while (!done && spinning) {
//     if (!assist.Poll()) pause();
//   }
//   if (!done) { SleepingWaiter sleeping; sleep(); }
class WaitAssist {
 public:
  explicit WaitAssist(IoPool& pool);
  ~WaitAssist();
  WaitAssist(const WaitAssist&) = delete;
  WaitAssist& operator=(const WaitAssist&) = delete;

  // Runs a handler of each parked context that has one ready (their
  // reactors polled, not waited on) on this thread; true when one ran.
  // Returns false when nothing is parked, or at once when called from a
  // handler it runs.
  bool Poll();

 private:
  IoPool& pool_;
};

// A waiter that sleeps (and runs nothing itself) for as long as one lives:
// every parked thread (of any pool: it may not know which one brings its
// answer) resumes, and none parks meanwhile. Cheap when none is parked.
class SleepingWaiter {
 public:
  SleepingWaiter();
  ~SleepingWaiter();
  SleepingWaiter(const SleepingWaiter&) = delete;
  SleepingWaiter& operator=(const SleepingWaiter&) = delete;
};

}  // namespace tether

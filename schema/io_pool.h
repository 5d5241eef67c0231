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
#pragma once

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <cstddef>
#include <memory>
#include <thread>
#include <vector>

namespace tether {

class IoPool {
 public:
  // `threads` contexts (at least 1), each kept from running out of work
  // until Release().
  explicit IoPool(int threads);
  // Joins the threads; Release() first, or this waits for ever.
  ~IoPool();
  IoPool(const IoPool&) = delete;
  IoPool& operator=(const IoPool&) = delete;

  // Context 0: for what is not one connection's (listeners, timers,
  // signals, the dashboard). Its thread also serves connections.
  boost::asio::io_context& main() { return *contexts_[0]; }
  // The context for a new connection: each in turn.
  boost::asio::io_context& Next();
  size_t size() const { return contexts_.size(); }

  // Starts one thread per context; once only.
  void Start();
  // Lets every context return once its work is done; idempotent, from any
  // thread.
  void Release();
  // Waits for the threads started; from a thread not in the pool.
  void Join();

 private:
  using Guard =
      boost::asio::executor_work_guard<boost::asio::io_context::executor_type>;
  std::vector<std::unique_ptr<boost::asio::io_context>> contexts_;
  std::vector<Guard> guards_;
  std::vector<std::thread> threads_;
  std::atomic<size_t> next_{0};
  std::atomic<bool> released_{false};
};

}  // namespace tether

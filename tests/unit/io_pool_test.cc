#include "schema/io_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <latch>
#include <set>
#include <thread>
#include <vector>

#include "schema/mutex.h"

namespace tether {
namespace {

namespace asio = boost::asio;

// What a connection gets from Next() keeps to one thread, and connections
// spread over every context in turn.
TEST(IoPool, EachContextRunsOnOneThreadOfItsOwn) {
  constexpr int kThreads = 3;
  IoPool pool(kThreads);
  ASSERT_EQ(pool.size(), static_cast<size_t>(kThreads));
  std::vector<asio::io_context*> handed;
  handed.reserve(size_t{2} * kThreads);
  for (int i = 0; i < 2 * kThreads; ++i) handed.push_back(&pool.Next());
  for (int i = 0; i < kThreads; ++i) {
    EXPECT_EQ(handed[i], handed[i + kThreads]) << i;
  }
  EXPECT_EQ(std::set(handed.begin(), handed.end()).size(),
            static_cast<size_t>(kThreads));

  pool.Start();
  constexpr std::ptrdiff_t kPerContext = 50;
  Mutex mu;
  std::vector<std::set<std::thread::id>> seen(kThreads);
  std::latch done(kPerContext * kThreads);
  for (std::ptrdiff_t round = 0; round < kPerContext; ++round) {
    for (int c = 0; c < kThreads; ++c) {
      asio::post(*handed[c], [&, c] {
        {
          MutexLock lock(&mu);
          seen[c].insert(std::this_thread::get_id());
        }
        done.count_down();
      });
    }
  }
  done.wait();
  std::set<std::thread::id> all;
  for (int c = 0; c < kThreads; ++c) {
    MutexLock lock(&mu);
    EXPECT_EQ(seen[c].size(), 1u) << "context " << c;
    all.insert(seen[c].begin(), seen[c].end());
  }
  EXPECT_EQ(all.size(), static_cast<size_t>(kThreads));
  EXPECT_EQ(all.count(std::this_thread::get_id()), 0u);
  pool.Release();
  pool.Join();
}

// Threads end once released and out of work, whatever was posted last.
TEST(IoPool, ReleasedPoolFinishesItsWorkAndJoins) {
  IoPool pool(2);
  std::atomic<int> ran{0};
  pool.Start();
  for (int i = 0; i < 100; ++i) {
    asio::post(pool.Next(), [&] { ran.fetch_add(1); });
  }
  pool.Release();
  pool.Release();  // idempotent
  pool.Join();
  EXPECT_EQ(ran.load(), 100);
}

// Posts a handler to `io` that records the thread it ran on.
class Probe {
 public:
  void Post(asio::io_context& io) {
    ran_ = false;
    asio::post(io, [this] {
      thread_ = std::this_thread::get_id();
      ran_.store(true, std::memory_order_release);
    });
  }
  bool ran() const { return ran_.load(std::memory_order_acquire); }
  // The thread it ran on; call once ran().
  std::thread::id thread() const { return thread_; }

 private:
  std::atomic<bool> ran_{false};
  std::thread::id thread_;
};

// Calls `meanwhile` until `probe` has run; false after `seconds`.
template <typename Meanwhile>
bool RanWithin(const Probe& probe, double seconds, Meanwhile meanwhile) {
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!probe.ran()) {
    if (std::chrono::steady_clock::now() > until) return false;
    meanwhile();
  }
  return true;
}

// Polls with `assist` until `probe` has run (on this thread or another).
bool PollUntilRan(WaitAssist& assist, const Probe& probe, double seconds) {
  return RanWithin(probe, seconds, [&] { assist.Poll(); });
}

// Waits (without polling) until `probe` has run.
bool WaitUntilRan(const Probe& probe, double seconds) {
  return RanWithin(probe, seconds, [] {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  });
}

// Parks `pool`'s only thread: with `assist` alive, a handler the thread
// runs makes it park, and the next one then runs on this thread.
void ParkTheThread(IoPool& pool, WaitAssist& assist) {
  Probe first;
  first.Post(pool.main());
  ASSERT_TRUE(WaitUntilRan(first, 10));
  // Handlers posted before the thread parked run there; keep posting
  // until one runs here.
  for (int tries = 0; tries < 1000; ++tries) {
    Probe probe;
    probe.Post(pool.main());
    ASSERT_TRUE(PollUntilRan(assist, probe, 10));
    if (probe.thread() == std::this_thread::get_id()) return;
  }
  FAIL() << "the I/O thread never parked while a waiter spun";
}

// A waiter spinning for an answer runs the parked thread's handlers (and
// its reactor: a timer's expiry) itself, and the thread stays parked while
// it spins.
TEST(IoPool, ParkedThreadsWorkRunsOnTheSpinningWaiter) {
  IoPool pool(1, /*assisted=*/true);
  pool.Start();
  {
    WaitAssist assist(pool);
    ParkTheThread(pool, assist);
    for (int i = 0; i < 100; ++i) {
      Probe probe;
      probe.Post(pool.main());
      ASSERT_TRUE(PollUntilRan(assist, probe, 10));
      EXPECT_EQ(probe.thread(), std::this_thread::get_id()) << i;
    }
    asio::steady_timer timer(pool.main(), std::chrono::milliseconds(1));
    std::atomic<std::thread::id> fired;
    std::atomic<bool> done{false};
    timer.async_wait([&](const boost::system::error_code&) {
      fired = std::this_thread::get_id();
      done = true;
    });
    const auto until =
        std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!done && std::chrono::steady_clock::now() < until) assist.Poll();
    ASSERT_TRUE(done);
    EXPECT_EQ(fired.load(), std::this_thread::get_id());
  }
  pool.Release();
  pool.Join();
}

// Once no waiter spins or polls, a parked thread resumes by itself within
// a few kParkUs: work nobody waits for (heartbeats, timers) is not held.
TEST(IoPool, ParkedThreadResumesWhenWaitersStop) {
  IoPool pool(1, /*assisted=*/true);
  pool.Start();
  {
    WaitAssist assist(pool);
    ParkTheThread(pool, assist);
  }
  std::this_thread::sleep_for(std::chrono::microseconds(5 * IoPool::kParkUs));
  Probe probe;
  probe.Post(pool.main());
  ASSERT_TRUE(WaitUntilRan(probe, 10));
  EXPECT_NE(probe.thread(), std::this_thread::get_id());
  pool.Release();
  pool.Join();
}

// A waiter that goes to sleep wakes a parked thread at once, even while
// another waiter still spins without polling; and a released pool's
// parked thread ends.
TEST(IoPool, SleepingWaiterAndReleaseWakeAParkedThread) {
  IoPool pool(1, /*assisted=*/true);
  pool.Start();
  WaitAssist spinning(pool);  // keeps the thread parked for as long as it lives
  ParkTheThread(pool, spinning);
  {
    Probe held;
    held.Post(pool.main());
    std::this_thread::sleep_for(std::chrono::microseconds(5 * IoPool::kParkUs));
    EXPECT_FALSE(held.ran()) << "the thread left its park while a waiter "
                                "spun";
    SleepingWaiter sleeping;
    ASSERT_TRUE(WaitUntilRan(held, 10));
    EXPECT_NE(held.thread(), std::this_thread::get_id());
  }
  ParkTheThread(pool, spinning);
  pool.Release();
  pool.Join();  // would wait for ever on a parked thread
}

// A waiter runs only its own pool's threads' work: another pool's thread
// neither parks for it nor has its handlers run by it.
TEST(IoPool, WaiterRunsOnlyItsOwnPool) {
  IoPool mine(1, /*assisted=*/true);
  IoPool other(1, /*assisted=*/true);
  mine.Start();
  other.Start();
  {
    WaitAssist assist(mine);
    ParkTheThread(mine, assist);
    for (int i = 0; i < 200; ++i) {
      Probe probe;
      probe.Post(other.main());
      ASSERT_TRUE(PollUntilRan(assist, probe, 10));
      EXPECT_NE(probe.thread(), std::this_thread::get_id()) << i;
    }
  }
  mine.Release();
  other.Release();
  mine.Join();
  other.Join();
}

// Pools made without `assisted` never park, whoever spins.
TEST(IoPool, UnassistedPoolNeverRunsOnWaiters) {
  IoPool pool(1);
  pool.Start();
  WaitAssist assist(pool);
  for (int i = 0; i < 200; ++i) {
    Probe probe;
    probe.Post(pool.main());
    ASSERT_TRUE(PollUntilRan(assist, probe, 10));
    EXPECT_NE(probe.thread(), std::this_thread::get_id()) << i;
  }
  pool.Release();
  pool.Join();
}

}  // namespace
}  // namespace tether

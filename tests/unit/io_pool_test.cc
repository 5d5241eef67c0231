#include "schema/io_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio/post.hpp>
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

}  // namespace
}  // namespace tether

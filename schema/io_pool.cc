#include "schema/io_pool.h"

#include <algorithm>

namespace tether {

namespace asio = boost::asio;

IoPool::IoPool(int threads) {
  const int n = std::max(1, threads);
  contexts_.reserve(n);
  guards_.reserve(n);
  for (int i = 0; i < n; ++i) {
    // Concurrency hint 1: one thread runs each context, so the scheduler
    // need not wake another for the reactor; posting from other threads
    // stays safe.
    contexts_.push_back(std::make_unique<asio::io_context>(1));
    guards_.push_back(asio::make_work_guard(*contexts_.back()));
  }
}

IoPool::~IoPool() { Join(); }

asio::io_context& IoPool::Next() {
  return *contexts_[next_.fetch_add(1, std::memory_order_relaxed) %
                    contexts_.size()];
}

void IoPool::Start() {
  if (!threads_.empty()) return;
  for (auto& io : contexts_) {
    threads_.emplace_back([ctx = io.get()] { ctx->run(); });
  }
}

void IoPool::Release() {
  if (released_.exchange(true)) return;
  for (Guard& guard : guards_) guard.reset();
}

void IoPool::Join() {
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

}  // namespace tether

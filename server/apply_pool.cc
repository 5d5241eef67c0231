#include "server/apply_pool.h"

#include <algorithm>
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <latch>
#include <thread>

namespace tether {

struct ApplyPool::Impl {
  explicit Impl(int helpers) : pool(helpers) {}
  boost::asio::thread_pool pool;
};

ApplyPool::ApplyPool(int threads)
    : threads_(threads > 0
                   ? threads
                   : std::max(1u, std::thread::hardware_concurrency())) {
  if (threads_ > 1) impl_ = std::make_unique<Impl>(threads_ - 1);
}

ApplyPool::~ApplyPool() {
  if (impl_) impl_->pool.join();
}

void ApplyPool::Run(int parts, const std::function<void(int part)>& fn) {
  if (parts <= 0) return;
  if (!impl_ || parts == 1) {
    for (int part = 0; part < parts; ++part) fn(part);
    return;
  }
  ++spread_runs_;
  std::latch done(parts - 1);
  for (int part = 1; part < parts; ++part) {
    boost::asio::post(impl_->pool, [&fn, &done, part] {
      fn(part);
      done.count_down();
    });
  }
  fn(0);
  done.wait();
}

}  // namespace tether

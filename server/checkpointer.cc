#include "server/checkpointer.h"

#include <chrono>

#include "schema/log.h"

namespace tether {

Checkpointer::Checkpointer(CheckpointStore* store, Done done)
    : store_(store), done_(std::move(done)), thread_([this] { Loop(); }) {}

Checkpointer::~Checkpointer() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

bool Checkpointer::Submit(ShardSnapshot snapshot) {
  {
    std::lock_guard lock(mu_);
    if (busy_ || pending_ || stopping_) return false;
    pending_ = std::move(snapshot);
  }
  cv_.notify_all();
  return true;
}

void Checkpointer::Loop() {
  while (true) {
    ShardSnapshot snapshot;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || pending_.has_value(); });
      if (!pending_) return;  // stopping with nothing left to write
      snapshot = std::move(*pending_);
      pending_.reset();
      busy_ = true;
    }
    TETHER_LOG(kInfo) << "writing checkpoint round " << snapshot.round;
    const auto start = std::chrono::steady_clock::now();
    Result<uint64_t> written = store_->WriteShard(snapshot);
    done_(
        snapshot.round, written,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count());
    std::lock_guard lock(mu_);
    busy_ = false;
  }
}

}  // namespace tether

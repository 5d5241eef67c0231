#include "server/checkpointer.h"

#include <chrono>

#include "schema/log.h"

namespace tether {

Checkpointer::Checkpointer(CheckpointStore* store, Done done)
    : store_(store), done_(std::move(done)), thread_([this] { Loop(); }) {}

Checkpointer::~Checkpointer() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
  thread_.join();
}

bool Checkpointer::Submit(ShardSnapshot snapshot, IfBusy if_busy) {
  {
    MutexLock lock(&mu_);
    if (pending_ || stopping_) return false;
    if (busy_ && if_busy == IfBusy::kDrop) return false;
    pending_ = std::move(snapshot);
  }
  cv_.SignalAll();
  return true;
}

void Checkpointer::Loop() {
  while (true) {
    ShardSnapshot snapshot;
    {
      MutexLock lock(&mu_);
      while (!stopping_ && !pending_) cv_.Wait(mu_);
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
    MutexLock lock(&mu_);
    busy_ = false;
  }
}

}  // namespace tether

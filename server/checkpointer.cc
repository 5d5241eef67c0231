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
    if (stopping_) return false;
    const int64_t round = snapshot.round;
    if (writing_ == round || (pending_ && pending_->round == round) ||
        report_ == round) {
      return true;  // on its way
    }
    if (written_ && written_->first == round) {
      report_ = round;
    } else {
      if (pending_) return false;
      if (busy_ && if_busy == IfBusy::kDrop) return false;
      pending_ = std::move(snapshot);
    }
  }
  cv_.SignalAll();
  return true;
}

void Checkpointer::Loop() {
  while (true) {
    ShardSnapshot snapshot;
    std::optional<std::pair<int64_t, uint64_t>> report;
    {
      MutexLock lock(&mu_);
      while (!stopping_ && !pending_ && !report_) cv_.Wait(mu_);
      if (report_) {
        report = std::make_pair(*report_, written_->second);
        report_.reset();
      } else if (!pending_) {
        return;  // stopping with nothing left to write
      } else {
        snapshot = std::move(*pending_);
        pending_.reset();
        busy_ = true;
        writing_ = snapshot.round;
      }
    }
    if (report) {
      TETHER_LOG(kInfo) << "checkpoint round " << report->first
                        << " asked for again: written already";
      done_(report->first, report->second, 0.0);
      continue;
    }
    TETHER_LOG(kInfo) << "writing checkpoint round " << snapshot.round;
    const auto start = std::chrono::steady_clock::now();
    Result<uint64_t> written = store_->WriteShard(snapshot);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    if (written.ok()) {
      TETHER_LOG(kInfo) << "checkpoint round " << snapshot.round
                        << " written: " << *written << " bytes in " << seconds
                        << " s";
    }
    {
      // Before `done_`, so that the round asked for again once it is
      // reported is found written (or failed); busy until `done_` returns.
      MutexLock lock(&mu_);
      writing_ = -1;
      if (written.ok()) written_ = std::make_pair(snapshot.round, *written);
    }
    done_(snapshot.round, written, seconds);
    MutexLock lock(&mu_);
    busy_ = false;
  }
}

}  // namespace tether

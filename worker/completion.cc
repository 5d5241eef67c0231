#include "worker/completion.h"

#include <chrono>
#include <optional>

#include "schema/futex.h"
#include "schema/io_pool.h"

namespace tether {
namespace {

void Pause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

void Completion::Set(const Status& s) {
  status_ = s;
  if (state_.exchange(kDone, std::memory_order_acq_rel) == kSleeping) {
    FutexWake(state_);
  }
}

Status Completion::Wait(int spin_us, IoPool* io) {
  if (state_.load(std::memory_order_acquire) == kDone) return status_;
  if (spin_us > 0) {
    // While it spins, this thread runs the work of `io`'s threads itself
    // when they park (schema/io_pool.h): the answer is then read here,
    // with no thread to wake.
    std::optional<WaitAssist> assist;
    if (io != nullptr) assist.emplace(*io);
    const auto until =
        std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us);
    while (state_.load(std::memory_order_acquire) != kDone &&
           std::chrono::steady_clock::now() < until) {
      if (!assist || !assist->Poll()) Pause();
    }
  }
  if (state_.load(std::memory_order_acquire) != kDone) {
    // The I/O threads run their contexts while this sleeps.
    SleepingWaiter sleeping;
    int pending = kPending;
    state_.compare_exchange_strong(pending, kSleeping,
                                   std::memory_order_acq_rel);
    // Sleeps while the word still says so; Set changes it first.
    while (state_.load(std::memory_order_acquire) != kDone) {
      FutexWait(state_, kSleeping);
    }
  }
  return status_;
}

}  // namespace tether

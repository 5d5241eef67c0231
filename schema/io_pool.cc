#include "schema/io_pool.h"

#include <algorithm>
#include <boost/asio/executor_work_guard.hpp>
#include <chrono>
#include <thread>

#include "schema/futex.h"
#include "schema/mutex.h"

namespace tether {

namespace asio = boost::asio;

struct IoPool::Waiters {
  // Waiters spinning now, and when the last one stopped (steady clock, ns).
  std::atomic<int> spinners{0};
  std::atomic<int64_t> last_spin_ns{0};
};

struct IoPool::Slot {
  static constexpr int kRunning = 0;
  static constexpr int kParked = 1;

  explicit Slot(IoPool::Waiters* pool_waiters) : waiters(pool_waiters) {}

  // Concurrency hint 1: one thread runs the context, so the scheduler need
  // not wake another for the reactor; posting from other threads stays
  // safe, and so does a waiter's poll() (it wakes the thread when it
  // leaves the reactor to it).
  asio::io_context io{1};
  // Keeps `io` from running out of work until the pool is released.
  asio::executor_work_guard<asio::io_context::executor_type> guard =
      asio::make_work_guard(io);
  IoPool::Waiters* const waiters;  // its pool's
  // kParked while the thread sleeps and waiters may run the context; the
  // futex word it sleeps on.
  std::atomic<int> state{kRunning};
  // A waiter is running the context now.
  std::atomic<bool> busy{false};
  // When a waiter last ran it (steady clock, ns).
  std::atomic<int64_t> last_poll_ns{0};
};

namespace {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Every assisted pool's slots, for the sleeping waiters that wake them.
struct Registry {
  Mutex mu;
  std::vector<IoPool::Slot*> slots TETHER_GUARDED_BY(mu);
  // Waiters sleeping now, and slots parked now (of every pool).
  std::atomic<int> sleepers{0};
  std::atomic<int> parked{0};
};

Registry& Assisted() {
  static auto* registry = new Registry;  // never destroyed: threads outlive
  return *registry;                      // static destruction
}

// Set while this thread runs a context for a waiter: a handler that waits
// runs nothing itself.
thread_local bool t_polling = false;

// kParked -> kRunning, once: by the thread itself or a waker.
bool Unpark(IoPool::Slot& slot) {
  int parked = IoPool::Slot::kParked;
  if (!slot.state.compare_exchange_strong(parked, IoPool::Slot::kRunning,
                                          std::memory_order_acq_rel)) {
    return false;
  }
  Assisted().parked.fetch_sub(1);
  return true;
}

void Wake(IoPool::Slot& slot) {
  if (Unpark(slot)) FutexWake(slot.state);
}

// Whether the thread that ran a handler should park: one of its pool's
// waiters spins now, or stopped within kParkUs (its next call is likely
// near), and no waiter sleeps (it would wait for the park to end).
bool ShouldPark(const IoPool::Slot& slot) {
  if (Assisted().sleepers.load() > 0) return false;
  const IoPool::Waiters& w = *slot.waiters;
  return w.spinners.load(std::memory_order_relaxed) > 0 ||
         NowNs() - w.last_spin_ns.load(std::memory_order_relaxed) <
             IoPool::kParkUs * 1000;
}

// Sleeps while the pool's waiters spin or ran the context within kParkUs.
void Park(IoPool::Slot& slot, const std::atomic<bool>& released) {
  Registry& r = Assisted();
  slot.last_poll_ns.store(NowNs(), std::memory_order_relaxed);
  slot.state.store(IoPool::Slot::kParked, std::memory_order_release);
  r.parked.fetch_add(1);  // seq_cst with sleepers: see SleepingWaiter
  while (slot.state.load(std::memory_order_acquire) == IoPool::Slot::kParked) {
    // Released or a waiter asleep after the checks before: they woke
    // nothing.
    if (released.load(std::memory_order_acquire) || r.sleepers.load() > 0) {
      Unpark(slot);
      return;
    }
    FutexWait(slot.state, IoPool::Slot::kParked, IoPool::kParkUs);
    const int64_t idle_ns =
        NowNs() - slot.last_poll_ns.load(std::memory_order_relaxed);
    if (slot.waiters->spinners.load(std::memory_order_relaxed) == 0 &&
        idle_ns > IoPool::kParkUs * 1000) {
      Unpark(slot);
    }
  }
}

}  // namespace

IoPool::IoPool(int threads, bool assisted)
    : assisted_(assisted), waiters_(std::make_unique<Waiters>()) {
  const int n = std::max(1, threads);
  slots_.reserve(n);
  for (int i = 0; i < n; ++i) {
    slots_.push_back(std::make_unique<Slot>(waiters_.get()));
  }
  if (assisted_) {
    Registry& r = Assisted();
    MutexLock lock(&r.mu);
    for (auto& slot : slots_) r.slots.push_back(slot.get());
  }
}

IoPool::~IoPool() {
  Join();
  if (!assisted_) return;
  Registry& r = Assisted();
  {
    MutexLock lock(&r.mu);
    std::erase_if(r.slots, [this](Slot* s) {
      return std::any_of(slots_.begin(), slots_.end(),
                         [s](const auto& mine) { return mine.get() == s; });
    });
  }
}

asio::io_context& IoPool::main() { return slots_[0]->io; }

asio::io_context& IoPool::Next() {
  return slots_[next_.fetch_add(1, std::memory_order_relaxed) % slots_.size()]
      ->io;
}

void IoPool::Start() {
  if (!threads_.empty()) return;
  for (auto& slot : slots_) {
    threads_.emplace_back([this, s = slot.get()] { Run(*s); });
  }
}

void IoPool::Run(Slot& slot) {
  if (!assisted_) {
    slot.io.run();
    return;
  }
  while (slot.io.run_one() > 0) {
    if (ShouldPark(slot)) Park(slot, released_);
  }
}

void IoPool::Release() {
  if (released_.exchange(true)) return;
  for (auto& slot : slots_) {
    slot->guard.reset();
    Wake(*slot);
  }
}

void IoPool::Join() {
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

WaitAssist::WaitAssist(IoPool& pool) : pool_(pool) {
  pool_.waiters_->spinners.fetch_add(1, std::memory_order_relaxed);
}

WaitAssist::~WaitAssist() {
  IoPool::Waiters& w = *pool_.waiters_;
  w.last_spin_ns.store(NowNs(), std::memory_order_relaxed);
  w.spinners.fetch_sub(1, std::memory_order_relaxed);
}

bool WaitAssist::Poll() {
  if (t_polling) return false;
  t_polling = true;
  struct Polled {
    ~Polled() { t_polling = false; }
  } polled;
  size_t ran = 0;
  for (auto& slot : pool_.slots_) {
    if (slot->state.load(std::memory_order_acquire) != IoPool::Slot::kParked ||
        slot->busy.exchange(true, std::memory_order_acq_rel)) {
      continue;  // running, or another waiter runs it
    }
    // Released however poll() returns.
    struct Done {
      IoPool::Slot& slot;
      ~Done() { slot.busy.store(false, std::memory_order_release); }
    } done{*slot};
    slot->last_poll_ns.store(NowNs(), std::memory_order_relaxed);
    // One handler (or one pass of the reactor and the first handler it
    // readied), so the waiter sees its answer as soon as it is in.
    ran += slot->io.poll_one();
    if (slot->state.load(std::memory_order_acquire) != IoPool::Slot::kParked) {
      // The thread resumed meanwhile and may wait for the reactor this
      // left queued: poll() runs what is ready and wakes it.
      ran += slot->io.poll();
    }
  }
  return ran > 0;
}

SleepingWaiter::SleepingWaiter() {
  Registry& r = Assisted();
  // seq_cst: either this sees the thread parked and wakes it, or the
  // thread sees this sleeper and does not stay parked.
  r.sleepers.fetch_add(1);
  if (r.parked.load() == 0) return;
  MutexLock lock(&r.mu);
  for (IoPool::Slot* slot : r.slots) Wake(*slot);
}

SleepingWaiter::~SleepingWaiter() { Assisted().sleepers.fetch_sub(1); }

}  // namespace tether

// Per-worker clocks as one shard sees them, and the pulls that wait for the
// slowest worker (Stale Synchronous Parallel).
//
// A worker's clock is the number of iterations it has completed. A pull
// from a worker at clock c with staleness bound s may be answered once
// every live worker has reached c - s (so it sees every update from clocks
// <= c - s - 1); s < 0 never waits. Waiting pulls are stored as callbacks,
// not blocked threads.
//
// Not thread-safe: the owning Shard serializes access.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

namespace tether {

class ClockTable {
 public:
  using Release = std::function<void()>;

  // Ranks 0..num_workers-1, all live at clock 0.
  explicit ClockTable(int num_workers);

  int num_workers() const { return static_cast<int>(clocks_.size()); }
  int64_t clock(int rank) const { return clocks_[rank]; }
  // Minimum clock over live workers; max_clock() when none is live.
  int64_t min_clock() const;
  // Maximum clock over all workers.
  int64_t max_clock() const;

  // Sets `rank`'s clock to `clock` (callers ensure it only grows) and
  // returns the waiters this releases, in the order they can be answered.
  // The caller runs them.
  std::vector<Release> Advance(int rank, int64_t clock);

  // Marks `rank` live or not. A worker that is not live does not hold back
  // the minimum; returns the waiters this releases.
  std::vector<Release> SetLive(int rank, bool live);
  bool live(int rank) const { return live_[rank]; }

  // True when a pull at `clock` under bound `staleness` can be answered.
  bool Ready(int64_t clock, int staleness) const;
  // Queues `release` until min_clock() >= clock - staleness. Callers check
  // Ready() first.
  void Wait(int64_t clock, int staleness, Release release);
  size_t waiting() const { return waiting_.size(); }

 private:
  std::vector<Release> Collect();

  std::vector<int64_t> clocks_;
  std::vector<bool> live_;
  // Keyed by the minimum clock each waiter needs.
  std::multimap<int64_t, Release> waiting_;
};

}  // namespace tether

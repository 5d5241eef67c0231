// Per-worker clocks as one shard sees them, and the pulls that wait for the
// slowest worker (Stale Synchronous Parallel).
//
// A worker's clock is the number of iterations it has completed. A pull
// from a worker at clock c with staleness bound s may be answered once
// every live worker has reached c - s (so it sees every update from clocks
// <= c - s - 1); s < 0 never waits. Waiting pulls are stored as callbacks,
// not blocked threads.
//
// With `backup` backup workers, a clock closes once all live workers but
// `backup` have passed it (closed_clock()), and pulls wait for that instead
// of the very slowest: the slowest `backup` workers do not hold back the
// rest (they fall behind; the shard drops their late pushes).
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
  explicit ClockTable(int num_workers, int backup = 0);

  // Adds ranks up to num_workers - 1 (a worker joining after the start),
  // not live, each at min_clock() (so one that joins an empty run does not
  // take the clocks back). No-op when there are that many already.
  void Grow(int num_workers);

  int num_workers() const { return static_cast<int>(clocks_.size()); }
  int64_t clock(int rank) const { return clocks_[rank]; }
  // Minimum clock over live workers; max_clock() when none is live.
  int64_t min_clock() const;
  // Maximum clock over all workers.
  int64_t max_clock() const;
  // The clock every live worker but `backup` has reached (min_clock()
  // without backup workers); max_clock() when none is live.
  int64_t closed_clock() const;
  // The clock `rank` takes when it (re)joins: its own, or the minimum over
  // the other live workers when that is later, so a returning worker does
  // not drag everyone back.
  int64_t JoinClock(int rank) const;

  // Sets `rank`'s clock to `clock` (callers ensure it only grows) and
  // returns the waiters this releases, in the order they can be answered.
  // The caller runs them.
  std::vector<Release> Advance(int rank, int64_t clock);

  // Sets every worker live at `clock`, forward or back: resuming a round,
  // before any pull waits (none may be waiting).
  void Restart(int64_t clock);

  // Marks `rank` live or not. A worker that is not live does not hold back
  // the minimum; returns the waiters this releases.
  std::vector<Release> SetLive(int rank, bool live);
  bool live(int rank) const { return live_[rank]; }

  // True when a pull at `clock` under bound `staleness` can be answered:
  // closed_clock() >= clock - staleness.
  bool Ready(int64_t clock, int staleness) const;
  // Queues `release` until closed_clock() >= clock - staleness. Callers check
  // Ready() first.
  void Wait(int64_t clock, int staleness, Release release);
  size_t waiting() const { return waiting_.size(); }

 private:
  std::vector<Release> Collect();

  const int backup_;
  std::vector<int64_t> clocks_;
  std::vector<bool> live_;
  mutable std::vector<int64_t> scratch_;  // closed_clock()'s workspace
  // Keyed by the minimum clock each waiter needs.
  std::multimap<int64_t, Release> waiting_;
};

}  // namespace tether

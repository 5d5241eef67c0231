// Which workers are straggling, from samples of shard 0's clocks (one per
// dashboard interval). web/API.md ("worker") states the same definition.
//
// A running worker is straggling when
//   1. it is behind now: some running worker's clock is past its own
//      (a worker 0 clocks behind never straggles), and
//   2. over the last `window_s` seconds it held the others back or fell
//      behind:
//      - held back: in at least half of the window's samples, some running
//        worker with a bound s >= 0 was more than s clocks ahead of it, so
//        that worker's next pull waited for it;
//      - fell behind: its clock advanced by less than half as much as the
//        fastest running worker's, which advanced at least `min_advance`
//        clocks (asynchronous workers, whom nobody waits for).
// Nothing straggles until every member of the run (the caller says who:
// the Monitor counts the ranks of --workers and any later one, less those
// that left) has joined once and `window_s` has passed since, nor a worker
// that has not been running for the whole window (it just joined, rejoined
// or came back from an eviction).
//
// Not thread-safe: the Monitor calls it under its mutex.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

namespace tether {

struct StragglerOptions {
  double window_s = 3.0;    // T: how long the evidence must span
  int64_t min_advance = 8;  // K: "fell behind" needs the fastest this far
};

class StragglerWatch {
 public:
  // One worker in one sample. `bound` is the staleness bound its pulls
  // wait by (-1: none); `running` means connected, live and not finished.
  struct Worker {
    int64_t clock = 0;
    int bound = -1;
    bool running = false;
  };
  // Why a worker straggles, for the event that says so.
  struct Verdict {
    bool straggling = false;
    int64_t behind = 0;          // clocks behind the fastest running worker
    double held_back_share = 0;  // of the window's samples
    int64_t advance = 0;         // its clocks over the window
    int64_t fastest_advance = 0;
  };

  // Room for `num_workers` at first; a sample that lists more grows it.
  explicit StragglerWatch(int num_workers, StragglerOptions options = {});

  // Adds the sample taken at `t` seconds (non-decreasing from call to call)
  // and returns a verdict per worker listed. `all_joined`: every current
  // member of the run has connected at least once. A worker not running
  // (not connected, finished, left) forgets its window.
  std::vector<Verdict> Sample(double t, const std::vector<Worker>& workers,
                              bool all_joined);

 private:
  struct Seen {
    double t;
    int64_t clock;
    bool held_back;
  };
  struct History {
    std::optional<double> running_since;
    std::deque<Seen> window;  // oldest first, within window_s of the newest
  };

  const StragglerOptions options_;
  std::optional<double> all_joined_since_;
  std::vector<History> workers_;
};

}  // namespace tether

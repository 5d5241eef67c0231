// What the Monitor (monitor.h) knows about the run, as plain data: the
// shards' latest figures, the workers' states, the history, the events and
// the checkpoint rounds. The Monitor changes it; the views read it: the
// JSON documents (monitor_json.h) and the Prometheus text
// (monitor_metrics.h).
//
// Not thread-safe: the Monitor holds it under its mutex, and the views are
// called with that mutex held.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "schema/stats.h"
#include "server/run_settings.h"
#include "server/straggler.h"

namespace tether {

// web/API.md ("worker") defines each; kLeft: it left the run for good and
// its rank is free.
enum class WorkerState {
  kJoining,
  kRunning,
  kStraggling,
  kFinished,
  kDead,
  kLeft
};
const char* WorkerStateName(WorkerState state);

struct MonitorOptions {
  size_t max_points = 2000;     // history kept; thinned when full
  size_t max_events = 500;      // oldest dropped first
  double shard_silent_s = 3.0;  // a shard quiet this long is not reporting
  StragglerOptions stragglers;  // what "straggling" means (straggler.h)
};

// `value`, or 0 when it is NaN or infinite (a rate, a fraction).
inline double FiniteOrZero(double value) {
  return std::isfinite(value) ? value : 0;
}

// The most ranks the Monitor keeps: kMaxRanks (run_settings.h), or
// --workers when that is more. Ranks beyond it are ignored.
inline size_t MaxRanks(const RunSettings& settings) {
  return static_cast<size_t>(std::max(kMaxRanks, settings.num_workers));
}

struct MonitorState {
  using TimePoint = std::chrono::steady_clock::time_point;

  struct Shard {
    bool seen = false;
    TimePoint at;  // when the latest figures arrived
    ShardStats stats;
    // Rates over at least a second, from the sample taken `rate_at`.
    TimePoint rate_at;
    uint64_t rate_pushes = 0, rate_in = 0, rate_out = 0;
    double pushes_per_s = 0, in_per_s = 0, out_per_s = 0;
    double write_seconds_sum = 0;  // checkpoint writes
    uint64_t writes = 0;
    bool silent_logged = false;
  };
  // A history point; points and events share one sequence.
  struct Point {
    uint64_t seq;
    double t;
    int64_t clock;
    std::optional<double> loss, test_accuracy;
    double samples_per_s;
  };
  struct Event {
    uint64_t seq;
    double t;
    std::string level;  // info, warning or error
    std::string text;
  };
  struct Round {
    std::string status = "writing";  // then complete, failed or pruned
    int64_t finished_unix_ms = 0;
    uint64_t bytes = 0;
    double seconds = 0;  // the slowest shard's write
    int shards_written = 0;
    std::string error;
  };

  MonitorState(RunSettings run_settings, MonitorOptions monitor_options,
               TimePoint started, int64_t started_unix_ms);

  // Seconds since `start`: the `t` of points and events.
  double Seconds(TimePoint now) const;
  // Whether `shard`'s latest figures are younger than shard_silent_s.
  bool Reporting(const Shard& shard, TimePoint now) const;
  // Makes every per-rank vector below hold ranks 0..n-1 at least, new
  // ranks joining, with nothing known; never shrinks. n is capped at
  // MaxRanks(settings).
  void GrowRanks(size_t n);

  // Constant after construction.
  const MonitorOptions options;
  const TimePoint start;
  const int64_t start_unix_ms;

  // Changed by the Monitor, under its mutex. The per-rank vectors start
  // with --workers ranks and grow as shard 0 lists more (GrowRanks): ranks
  // may go beyond --workers when workers join later.
  RunSettings settings;              // resume_round changes (OnResumed)
  std::vector<Shard> shards;         // by shard id
  std::vector<bool> ever_connected;  // by rank: connected (or left) once
  std::vector<WorkerState> states;   // by rank
  StragglerWatch stragglers;
  std::vector<double> straggled_at;         // when each last was straggling
  std::vector<int64_t> lags;                // by rank
  std::vector<uint64_t> nonfinite;          // by rank, summed over every shard
  std::vector<uint64_t> nonfinite_evented;  // the total the last event said
  std::deque<Point> points;                 // oldest first
  std::deque<Event> events;                 // oldest first
  uint64_t next_seq = 1;
  uint64_t sent_point_seq = 0, sent_event_seq = 0;  // in the last update
  uint64_t reports_at_last_point = 0;
  float last_test_accuracy = -1, last_test_loss = -1;
  bool stopped = false;
  bool any_finished = false;        // some worker reported done, ever
  std::map<int64_t, Round> rounds;  // by round number
  bool checkpoints_enabled;
  uint64_t rounds_complete = 0, rounds_failed = 0;
  uint64_t evictions = 0;
  size_t dashboard_clients = 0;
  uint64_t dashboard_dropped = 0;
  // By shard id and by rank; "" not known.
  std::vector<std::string> shard_commands, worker_commands;
  std::string manifest;         // the run manifest's JSON; "" until known
  bool config_changed = false;  // since the last update
};

}  // namespace tether

// The run as shard 0 sees it, for the dashboard and /metrics: every shard's
// latest figures, each worker's state, the loss and accuracy history,
// checkpoint rounds and events.
//
// Figures go in (shard 0's own each tick, the other shards' Stats frames as
// they arrive, checkpoint reports); JSON documents (web/API.md) and
// Prometheus text come out. Thread-safe: every public method takes the
// monitor's mutex.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "schema/stats.h"
#include "server/coordinator.h"
#include "server/reproduce.h"
#include "server/run_settings.h"
#include "server/straggler.h"

namespace tether {

enum class WorkerState { kJoining, kRunning, kStraggling, kFinished, kDead };
const char* WorkerStateName(WorkerState state);

// Each worker's state from its latest figures alone: finished when its
// last report said so, dead when it was connected once
// (`ever_connected[rank]`) and is not now or was evicted, joining when it
// never was, running otherwise. Never straggling: that takes a window of
// samples (StragglerWatch), which the Monitor keeps.
std::vector<WorkerState> ClassifyWorkers(
    const std::vector<ShardStats::Worker>& workers,
    const std::vector<bool>& ever_connected);

struct MonitorOptions {
  size_t max_points = 2000;     // history kept; thinned when full
  size_t max_events = 500;      // oldest dropped first
  double shard_silent_s = 3.0;  // a shard quiet this long is not reporting
  StragglerOptions stragglers;  // what "straggling" means (straggler.h)
};

class Monitor {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  static TimePoint Now() { return std::chrono::steady_clock::now(); }

  explicit Monitor(RunSettings settings, MonitorOptions options = {});

  // A shard's figures: shard 0's own, the others' as their Stats arrive.
  void OnShardStats(const ShardStats& stats, TimePoint now = Now());
  // Checkpoints: one shard's report on a round; a round every shard wrote.
  void OnShardRound(const ShardRound& written);
  void OnRoundComplete(int64_t round, uint64_t bytes);
  // The run was stopped (POST /api/stop): its state says "stopped" from
  // now on, and `event` is logged among the events.
  void OnRunStopped(const std::string& event);
  // Every shard loaded checkpoint round `round` (it may be older than the
  // one asked for, when --resume latest fell back): the run resumes there.
  void OnResumed(int64_t round);
  // The dashboard's own figures, shown in /metrics and the status.
  void SetDashboardClients(size_t clients, uint64_t dropped);
  // Whether shard 0 can take checkpoint rounds (it has a --data-dir):
  // "enabled" in the checkpoints and config documents. Until told, the
  // settings decide (rounds every K clocks, or a resume, need a data dir).
  void SetCheckpointsEnabled(bool enabled);
  // How shard `shard_id` (shard 0: ShardCommand with the run settings) or
  // worker `rank` was started, as its Hello said: the config's "commands"
  // (web/API.md). The latest one per process is kept, the next update
  // carries the config, and an id out of range is ignored. A command over
  // kMaxCommandBytes is kept as a note saying so.
  static constexpr size_t kMaxCommandBytes = 64 * 1024;
  void OnShardCommand(int shard_id, std::string command);
  void OnWorkerCommand(int rank, std::string command);

  // Derives the workers' states, events and a history point (when some
  // worker reported since the last tick) from the latest figures, and
  // returns the WebSocket "update": status, workers, shards, checkpoints,
  // and the history points and events added since the previous Tick.
  std::string Tick(TimePoint now = Now());
  // The WebSocket "snapshot": everything, the whole history included.
  std::string Snapshot(TimePoint now = Now());
  // The document GET /api/`name` answers (status, workers, shards,
  // checkpoints, config, history, events); nullopt for an unknown name.
  std::optional<std::string> Document(std::string_view name,
                                      TimePoint now = Now());
  // Prometheus text exposition format 0.0.4.
  std::string Metrics(TimePoint now = Now());

 private:
  struct ShardView {
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
    std::string level;
    std::string text;
  };
  struct RoundView {
    std::string status = "writing";  // then complete, failed or pruned
    int64_t finished_unix_ms = 0;
    uint64_t bytes = 0;
    double seconds = 0;  // the slowest shard's write
    int shards_written = 0;
    std::string error;
  };

  double Seconds(TimePoint now) const;
  // Whether an event's text also goes to the log: not when the shard logs
  // that event itself (a worker joining, a round completing or failing,
  // the run stopping), so each event is one line there.
  enum class Log { kAlso, kLoggedElsewhere };
  void AddEventLocked(double t, std::string level, std::string text,
                      Log log = Log::kAlso);
  void UpdateWorkersLocked(double t);
  void MaybeAddPointLocked(double t);
  bool Reporting(const ShardView& shard, TimePoint now) const;
  // The JSON values of web/API.md.
  std::string StatusLocked(TimePoint now) const;
  std::string WorkersLocked() const;
  std::string ShardsLocked(TimePoint now) const;
  std::string CheckpointsLocked() const;
  std::string ConfigLocked() const;
  // Every process and its command: shards by id, then workers by rank.
  std::vector<ProcessCommand> CommandsLocked() const;
  std::string PointsLocked(uint64_t after_seq) const;
  // Events with after_seq < seq <= up_to.
  std::string EventsLocked(uint64_t after_seq,
                           uint64_t up_to = UINT64_MAX) const;

  RunSettings settings_;  // resume_round guarded by mu_
  const MonitorOptions options_;
  const TimePoint start_ = Now();
  const int64_t start_unix_ms_;

  mutable std::mutex mu_;
  // Guarded by mu_.
  std::vector<ShardView> shards_;
  std::vector<bool> ever_connected_;
  std::vector<WorkerState> states_;
  StragglerWatch stragglers_;
  std::vector<double> straggled_at_;  // when each last was straggling
  std::vector<int64_t> lags_;
  std::vector<uint64_t> nonfinite_;          // by rank, summed over every shard
  std::vector<uint64_t> nonfinite_evented_;  // the total the last event said
  std::deque<Point> points_;
  bool stopped_ = false;  // guarded by mu_
  std::deque<Event> events_;
  uint64_t next_seq_ = 1;
  uint64_t sent_point_seq_ = 0, sent_event_seq_ = 0;  // in the last update
  uint64_t reports_at_last_point_ = 0;
  float last_test_accuracy_ = -1, last_test_loss_ = -1;
  std::map<int64_t, RoundView> rounds_;
  bool checkpoints_enabled_;
  uint64_t rounds_complete_ = 0, rounds_failed_ = 0;
  uint64_t evictions_ = 0;
  size_t dashboard_clients_ = 0;
  uint64_t dashboard_dropped_ = 0;
  // By shard id and by rank; "" not known.
  std::vector<std::string> shard_commands_, worker_commands_;
  bool config_changed_ = false;  // since the last Tick
};

}  // namespace tether

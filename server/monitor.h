// The run as shard 0 sees it, for the dashboard and /metrics: every shard's
// latest figures, each worker's state, the loss and accuracy history,
// checkpoint rounds and events.
//
// Figures go in (shard 0's own each tick, the other shards' Stats frames as
// they arrive, checkpoint reports); JSON documents (web/API.md) and
// Prometheus text come out. Thread-safe: every public method takes the
// monitor's mutex.
//
// The state itself is plain data (monitor_state.h); the JSON views are
// monitor_json.h, the Prometheus text monitor_metrics.h.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "schema/mutex.h"
#include "schema/stats.h"
#include "server/coordinator.h"
#include "server/monitor_state.h"
#include "server/run_settings.h"

namespace tether {

// Each worker's state from its latest figures alone: left when it left the
// run for good (its rank is free), finished when its last report said so,
// dead when it was connected once (`ever_connected[rank]`) and is not now
// or was evicted, joining when it never was, running otherwise. Never
// straggling: that takes a window of samples (StragglerWatch), which the
// Monitor keeps.
std::vector<WorkerState> ClassifyWorkers(
    const std::vector<ShardStats::Worker>& workers,
    const std::vector<bool>& ever_connected);

class Monitor {
 public:
  using TimePoint = MonitorState::TimePoint;
  static TimePoint Now() { return std::chrono::steady_clock::now(); }

  explicit Monitor(RunSettings settings, MonitorOptions options = {});

  // A shard's figures: shard 0's own, the others' as their Stats arrive.
  void OnShardStats(const ShardStats& stats, TimePoint now = Now())
      TETHER_EXCLUDES(mu_);
  // Checkpoints: one shard's report on a round; a round every shard wrote.
  void OnShardRound(const ShardRound& written) TETHER_EXCLUDES(mu_);
  void OnRoundComplete(int64_t round, uint64_t bytes) TETHER_EXCLUDES(mu_);
  // The run was stopped (POST /api/stop): its state says "stopped" from
  // now on, and `event` is logged among the events.
  void OnRunStopped(const std::string& event) TETHER_EXCLUDES(mu_);
  // Every shard loaded checkpoint round `round` (it may be older than the
  // one asked for, when --resume latest fell back): the run resumes there.
  void OnResumed(int64_t round) TETHER_EXCLUDES(mu_);
  // The dashboard's own figures, shown in /metrics and the status.
  void SetDashboardClients(size_t clients, uint64_t dropped)
      TETHER_EXCLUDES(mu_);
  // Whether shard 0 can take checkpoint rounds (it has a --data-dir):
  // "enabled" in the checkpoints and config documents. Until told, the
  // settings decide (rounds every K clocks, or a resume, need a data dir).
  void SetCheckpointsEnabled(bool enabled) TETHER_EXCLUDES(mu_);
  // How shard `shard_id` (shard 0: ShardCommand with the run settings) or
  // worker `rank` was started, as its Hello said: the config's "commands"
  // (web/API.md). The latest one per process is kept, the next update
  // carries the config, and an id out of range is ignored (a rank may be
  // any below MaxRanks, beyond --workers too). A command over
  // kMaxCommandBytes is kept as a note saying so.
  static constexpr size_t kMaxCommandBytes = 64 * 1024;
  void OnShardCommand(int shard_id, std::string command) TETHER_EXCLUDES(mu_);
  void OnWorkerCommand(int rank, std::string command) TETHER_EXCLUDES(mu_);
  // The run manifest as it is now (server/manifest.h), for the config,
  // with every process's command it holds (as the two calls above), in
  // one change.
  void OnManifest(std::string manifest) TETHER_EXCLUDES(mu_);

  // Derives the workers' states, events and a history point (when some
  // worker reported since the last tick) from the latest figures, and
  // returns the WebSocket "update": status, workers, shards, checkpoints,
  // and the history points and events added since the previous Tick.
  // *seq (when given) numbers the update: 1 for the first Tick, and so on.
  std::string Tick(TimePoint now = Now(), uint64_t* seq = nullptr)
      TETHER_EXCLUDES(mu_);
  // The WebSocket "snapshot": everything, the whole history included; it
  // covers the updates numbered up to *seq (when given).
  std::string Snapshot(TimePoint now = Now(), uint64_t* seq = nullptr)
      TETHER_EXCLUDES(mu_);
  // The document GET /api/`name` answers (status, workers, shards,
  // checkpoints, config, history, events); nullopt for an unknown name.
  std::optional<std::string> Document(std::string_view name,
                                      TimePoint now = Now())
      TETHER_EXCLUDES(mu_);
  // Prometheus text exposition format 0.0.4.
  std::string Metrics(TimePoint now = Now()) TETHER_EXCLUDES(mu_);

 private:
  void SetShardCommandLocked(int shard_id, std::string command)
      TETHER_REQUIRES(mu_);
  void SetWorkerCommandLocked(int rank, std::string command)
      TETHER_REQUIRES(mu_);
  // Whether an event's text also goes to the log: not when the shard logs
  // that event itself (a worker joining, a round completing or failing,
  // the run stopping), so each event is one line there.
  enum class Log { kAlso, kLoggedElsewhere };
  void AddEventLocked(double t, std::string level, std::string text,
                      Log log = Log::kAlso) TETHER_REQUIRES(mu_);
  void UpdateWorkersLocked(double t) TETHER_REQUIRES(mu_);
  // The warnings for pushes refused as non-finite, summed over shards.
  void UpdateNonFiniteLocked(double t) TETHER_REQUIRES(mu_);
  // The events of worker `w` going from state `was` to `now` (they
  // differ); `new_spell`: it began straggling, for the reason `why`.
  void AddTransitionEventsLocked(double t, const ShardStats::Worker& w,
                                 WorkerState was, WorkerState now,
                                 bool new_spell,
                                 const StragglerWatch::Verdict& why)
      TETHER_REQUIRES(mu_);
  void MaybeAddPointLocked(double t) TETHER_REQUIRES(mu_);

  Mutex mu_;
  MonitorState state_ TETHER_GUARDED_BY(mu_);
  uint64_t ticks_ TETHER_GUARDED_BY(mu_) = 0;  // Tick calls so far
};

}  // namespace tether

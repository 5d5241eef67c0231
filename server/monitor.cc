#include "server/monitor.h"

#include <algorithm>
#include <boost/json/parse.hpp>
#include <cmath>
#include <sstream>

#include "schema/log.h"
#include "server/json_text.h"
#include "server/monitor_json.h"
#include "server/monitor_metrics.h"

namespace tether {
namespace json = boost::json;

namespace {

std::string WorkerName(const ShardStats::Worker& w) {
  std::string name = "worker " + std::to_string(w.rank);
  if (!w.host.empty()) name += " (" + w.host + ")";
  return name;
}

// Why a worker straggles (straggler.h), as the event says it.
std::string StragglingText(const StragglerWatch::Verdict& v, double window_s) {
  std::ostringstream out;
  out << v.behind << (v.behind == 1 ? " clock" : " clocks")
      << " behind the fastest running worker; ";
  if (v.held_back_share >= 0.5) {
    out << "it held others back at their staleness bound in "
        << std::lround(100 * v.held_back_share) << "% of the last " << window_s
        << " s";
  } else {
    out << "its clock advanced " << v.advance << " in the last " << window_s
        << " s, the fastest worker's " << v.fastest_advance;
  }
  return out.str();
}

int64_t UnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

const char* WorkerStateName(WorkerState state) {
  switch (state) {
    case WorkerState::kJoining:
      return "joining";
    case WorkerState::kRunning:
      return "running";
    case WorkerState::kStraggling:
      return "straggling";
    case WorkerState::kFinished:
      return "finished";
    case WorkerState::kDead:
      return "dead";
    case WorkerState::kLeft:
      return "left";
  }
  return "unknown";
}

std::vector<WorkerState> ClassifyWorkers(
    const std::vector<ShardStats::Worker>& workers,
    const std::vector<bool>& ever_connected) {
  std::vector<WorkerState> states(workers.size(), WorkerState::kRunning);
  for (size_t i = 0; i < workers.size(); ++i) {
    const ShardStats::Worker& w = workers[i];
    const bool was = i < ever_connected.size() && ever_connected[i];
    if (w.left) {  // for good; done or not
      states[i] = WorkerState::kLeft;
    } else if (w.done) {
      states[i] = WorkerState::kFinished;
    } else if (!w.connected || !w.live) {  // gone, or evicted for silence
      states[i] = was ? WorkerState::kDead : WorkerState::kJoining;
    }
  }
  return states;
}

MonitorState::MonitorState(RunSettings run_settings,
                           MonitorOptions monitor_options, TimePoint started,
                           int64_t started_unix_ms)
    : options(monitor_options),
      start(started),
      start_unix_ms(started_unix_ms),
      settings(std::move(run_settings)),
      shards(settings.num_shards),
      ever_connected(settings.num_workers, false),
      states(settings.num_workers, WorkerState::kJoining),
      stragglers(settings.num_workers, options.stragglers),
      straggled_at(settings.num_workers, -1e9),
      lags(settings.num_workers, 0),
      nonfinite(settings.num_workers, 0),
      nonfinite_evented(settings.num_workers, 0),
      checkpoints_enabled(settings.checkpoint_every > 0 ||
                          settings.resume_round >= 0) {}

double MonitorState::Seconds(TimePoint now) const {
  return std::chrono::duration<double>(now - start).count();
}

bool MonitorState::Reporting(const Shard& shard, TimePoint now) const {
  return shard.seen && std::chrono::duration<double>(now - shard.at).count() <
                           options.shard_silent_s;
}

void MonitorState::GrowRanks(size_t n) {
  n = std::min(n, MaxRanks(settings));
  if (n <= states.size()) return;
  ever_connected.resize(n, false);
  states.resize(n, WorkerState::kJoining);
  straggled_at.resize(n, -1e9);
  lags.resize(n, 0);
  nonfinite.resize(n, 0);
  nonfinite_evented.resize(n, 0);
  // The config's "commands" lists the new ranks: the next update carries
  // it. Commands themselves grow when a worker says its command
  // (OnWorkerCommand); the StragglerWatch grows with its samples.
  config_changed = true;
}

Monitor::Monitor(RunSettings settings, MonitorOptions options)
    : state_(std::move(settings), options, Now(), UnixMs()) {}

void Monitor::OnShardStats(const ShardStats& stats, TimePoint now) {
  MutexLock lock(&mu_);
  if (stats.shard_id < 0 ||
      stats.shard_id >= static_cast<int>(state_.shards.size())) {
    return;
  }
  MonitorState::Shard& shard = state_.shards[stats.shard_id];
  if (!shard.seen) {
    shard.rate_at = now;
    shard.rate_pushes = stats.pushes;
    shard.rate_in = stats.bytes_in;
    shard.rate_out = stats.bytes_out;
  } else if (shard.silent_logged) {
    AddEventLocked(
        state_.Seconds(now), "info",
        "shard " + std::to_string(stats.shard_id) + " is reporting again");
    shard.silent_logged = false;
  }
  shard.seen = true;
  shard.at = now;
  shard.stats = stats;
  const double dt = std::chrono::duration<double>(now - shard.rate_at).count();
  if (dt >= 1.0) {
    // Counters only grow, except when a shard restarts from zero.
    auto rate = [dt](uint64_t now_value, uint64_t then) {
      return now_value >= then ? static_cast<double>(now_value - then) / dt
                               : 0.0;
    };
    shard.pushes_per_s = rate(stats.pushes, shard.rate_pushes);
    shard.in_per_s = rate(stats.bytes_in, shard.rate_in);
    shard.out_per_s = rate(stats.bytes_out, shard.rate_out);
    shard.rate_at = now;
    shard.rate_pushes = stats.pushes;
    shard.rate_in = stats.bytes_in;
    shard.rate_out = stats.bytes_out;
  }
}

void Monitor::OnShardRound(const ShardRound& written) {
  MutexLock lock(&mu_);
  const double t = state_.Seconds(Now());
  MonitorState::Round& round = state_.rounds[written.round];
  // Rounds are few (one every --checkpoint-every clocks); keep the last 50.
  while (state_.rounds.size() > 50 &&
         state_.rounds.begin()->first != written.round) {
    state_.rounds.erase(state_.rounds.begin());
  }
  if (written.shard_id >= 0 &&
      written.shard_id < static_cast<int>(state_.shards.size())) {
    MonitorState::Shard& shard = state_.shards[written.shard_id];
    shard.write_seconds_sum += written.seconds;
    ++shard.writes;
  }
  if (!written.error.empty()) {
    if (round.status == "failed") return;  // the first error is the cause
    ++state_.rounds_failed;
    round.status = "failed";
    round.error =
        "shard " + std::to_string(written.shard_id) + ": " + written.error;
    round.finished_unix_ms = UnixMs();
    // The coordinator logs the failure.
    AddEventLocked(t, "error",
                   "checkpoint round " + std::to_string(written.round) +
                       " failed on " + round.error,
                   Log::kLoggedElsewhere);
    return;
  }
  ++round.shards_written;
  round.bytes += written.bytes;
  round.seconds = std::max(round.seconds, written.seconds);
}

void Monitor::OnRoundComplete(int64_t round, uint64_t bytes) {
  MutexLock lock(&mu_);
  MonitorState::Round& view = state_.rounds[round];
  view.status = "complete";
  view.bytes = bytes;
  view.finished_unix_ms = UnixMs();
  ++state_.rounds_complete;
  // The server logs the round when it records it.
  AddEventLocked(state_.Seconds(Now()), "info",
                 "checkpoint round " + std::to_string(round) + " complete (" +
                     std::to_string(bytes) + " bytes)",
                 Log::kLoggedElsewhere);
  // Every shard now deletes all but the newest keep_checkpoints complete
  // rounds (CheckpointStore::Prune).
  int kept = 0;
  for (auto it = state_.rounds.rbegin(); it != state_.rounds.rend(); ++it) {
    if (it->second.status != "complete") continue;
    if (++kept > state_.settings.keep_checkpoints) it->second.status = "pruned";
  }
}

void Monitor::SetCheckpointsEnabled(bool enabled) {
  MutexLock lock(&mu_);
  state_.checkpoints_enabled = enabled;
}

void Monitor::OnRunStopped(const std::string& event) {
  MutexLock lock(&mu_);
  state_.stopped = true;
  // The coordinator logs the stop when it tells the workers.
  AddEventLocked(state_.Seconds(Now()), "warning", event,
                 Log::kLoggedElsewhere);
}

void Monitor::OnResumed(int64_t round) {
  MutexLock lock(&mu_);
  state_.settings.resume_round = round;
  state_.config_changed = true;
  AddEventLocked(state_.Seconds(Now()), "info",
                 "resumed from checkpoint round " + std::to_string(round) +
                     ": every shard loaded it");
}

void Monitor::SetDashboardClients(size_t clients, uint64_t dropped) {
  MutexLock lock(&mu_);
  state_.dashboard_clients = clients;
  state_.dashboard_dropped = dropped;
}

void Monitor::AddEventLocked(double t, std::string level, std::string text,
                             Log log) {
  const LogLevel as = level == "error"     ? LogLevel::kError
                      : level == "warning" ? LogLevel::kWarning
                                           : LogLevel::kInfo;
  if (log == Log::kAlso && LogEnabled(as)) LogLine(as, text);
  state_.events.push_back(
      {state_.next_seq++, t, std::move(level), std::move(text)});
  while (state_.events.size() > state_.options.max_events)
    state_.events.pop_front();
}

void Monitor::UpdateWorkersLocked(double t) {
  const MonitorState::Shard& shard0 = state_.shards[0];
  if (!shard0.seen) return;
  const auto& workers = shard0.stats.workers;  // by rank
  // Ranks beyond --workers appear as later workers join.
  state_.GrowRanks(workers.size());
  const size_t n = std::min(workers.size(), state_.states.size());
  for (size_t i = 0; i < n; ++i) {
    // A worker that left was there first, though maybe between samples.
    if (workers[i].connected || workers[i].left) {
      state_.ever_connected[i] = true;
    }
    state_.any_finished |= workers[i].done;
  }
  std::vector<WorkerState> states =
      ClassifyWorkers(workers, state_.ever_connected);
  UpdateNonFiniteLocked(t);
  // Straggling waits for every current member to have joined once: the
  // ranks of --workers and any later rank that connected, less those left.
  bool all_joined = n >= static_cast<size_t>(state_.settings.num_workers);
  for (size_t i = 0; i < n && all_joined; ++i) {
    all_joined = workers[i].left || state_.ever_connected[i] ||
                 i >= static_cast<size_t>(state_.settings.num_workers);
  }
  std::vector<StragglerWatch::Worker> sample(n);
  int64_t fastest = 0;  // of the running workers
  for (size_t i = 0; i < n; ++i) {
    const bool running = states[i] == WorkerState::kRunning;
    sample[i] = {workers[i].clock, workers[i].staleness, running};
    if (running) fastest = std::max(fastest, workers[i].clock);
  }
  const std::vector<StragglerWatch::Verdict> verdicts =
      state_.stragglers.Sample(t, sample, all_joined);
  for (size_t i = 0; i < n; ++i) {
    const ShardStats::Worker& w = workers[i];
    state_.lags[i] =
        w.connected && !w.left ? std::max<int64_t>(0, fastest - w.clock) : 0;
    const WorkerState was = state_.states[i];
    WorkerState now = states[i];
    // Under BSP a straggler is level with the others for a moment every
    // clock, and running then; one warning per spell, not per return.
    bool new_spell = false;
    if (now == WorkerState::kRunning && verdicts[i].straggling) {
      now = WorkerState::kStraggling;
      new_spell =
          t - state_.straggled_at[i] > state_.options.stragglers.window_s;
      state_.straggled_at[i] = t;
    }
    state_.states[i] = now;
    if (was != now) {
      AddTransitionEventsLocked(t, w, was, now, new_spell, verdicts[i]);
    }
  }
}

void Monitor::UpdateNonFiniteLocked(double t) {
  const auto& workers = state_.shards[0].stats.workers;
  std::vector<uint64_t> nonfinite(state_.nonfinite.size(), 0);
  for (const MonitorState::Shard& shard : state_.shards) {
    for (const auto& w : shard.stats.workers) {
      if (w.rank >= 0 && w.rank < static_cast<int>(nonfinite.size())) {
        nonfinite[w.rank] += w.nonfinite_pushes;
      }
    }
  }
  for (size_t i = 0; i < nonfinite.size() && i < workers.size(); ++i) {
    // The first refusal, then each doubling: a worker that pushes NaN every
    // step must not push every other event out of the list.
    if (nonfinite[i] > state_.nonfinite[i] &&
        nonfinite[i] >= 2 * state_.nonfinite_evented[i]) {
      AddEventLocked(
          t, "warning",
          WorkerName(workers[i]) + ": " +
              std::to_string(nonfinite[i] - state_.nonfinite_evented[i]) +
              " push(es) refused as non-finite (NaN or Inf, or "
              "an update that would overflow); " +
              std::to_string(nonfinite[i]) + " in all");
      state_.nonfinite_evented[i] = nonfinite[i];
    }
  }
  state_.nonfinite = std::move(nonfinite);
}

void Monitor::AddTransitionEventsLocked(double t, const ShardStats::Worker& w,
                                        WorkerState was, WorkerState now,
                                        bool new_spell,
                                        const StragglerWatch::Verdict& why) {
  const std::string name = WorkerName(w);
  // First seen (or seen again) already straggling, finished, gone or left
  // between two samples: it still joined (rejoined) first. A worker on a
  // rank another one left joined afresh. The coordinator logs every join
  // as it happens.
  if (now != WorkerState::kJoining) {
    if (was == WorkerState::kJoining ||
        (was == WorkerState::kLeft && now != WorkerState::kLeft)) {
      AddEventLocked(t, "info", name + " joined", Log::kLoggedElsewhere);
    } else if (was == WorkerState::kDead && now != WorkerState::kDead &&
               now != WorkerState::kLeft) {
      AddEventLocked(t, "info", name + " rejoined", Log::kLoggedElsewhere);
    }
  }
  switch (now) {
    case WorkerState::kDead:
      ++state_.evictions;
      AddEventLocked(t, "error",
                     name + " is dead: " +
                         (w.connected ? "evicted, silent for longer than "
                                        "--worker-timeout-ms"
                                      : "its connection closed before it "
                                        "reported finishing") +
                         " (clock " + std::to_string(w.clock) + ")");
      break;
    case WorkerState::kStraggling:
      if (new_spell) {
        AddEventLocked(
            t, "warning",
            name + " is straggling: " +
                StragglingText(why, state_.options.stragglers.window_s));
      }
      break;
    case WorkerState::kFinished:
      AddEventLocked(t, "info", name + " finished");
      break;
    case WorkerState::kLeft:
      // Done and gone between two samples: it finished first.
      if (w.done && was != WorkerState::kFinished) {
        AddEventLocked(t, "info", name + " finished");
      }
      AddEventLocked(t, "info", name + " left the run");
      break;
    case WorkerState::kRunning:
    case WorkerState::kJoining:
      break;
  }
}

void Monitor::MaybeAddPointLocked(double t) {
  const MonitorState::Shard& shard0 = state_.shards[0];
  if (!shard0.seen || shard0.stats.reports == state_.reports_at_last_point)
    return;
  state_.reports_at_last_point = shard0.stats.reports;
  double loss_sum = 0, rate = 0;
  int losses = 0;
  std::optional<double> accuracy;
  for (const auto& w : shard0.stats.workers) {
    if (!w.connected) continue;
    if (w.loss >= 0 && std::isfinite(w.loss)) {
      loss_sum += w.loss;
      ++losses;
    }
    rate += w.samples_per_s;
    if (w.test_accuracy >= 0 && (w.test_accuracy != state_.last_test_accuracy ||
                                 w.test_loss != state_.last_test_loss)) {
      state_.last_test_accuracy = w.test_accuracy;
      state_.last_test_loss = w.test_loss;
      accuracy = w.test_accuracy;
    }
  }
  MonitorState::Point p{state_.next_seq++, t,        shard0.stats.min_clock,
                        std::nullopt,      accuracy, FiniteOrZero(rate)};
  if (losses > 0) p.loss = loss_sum / losses;
  state_.points.push_back(p);
  if (state_.points.size() > state_.options.max_points) {
    // Keep every other point, so the curve keeps its whole span.
    std::deque<MonitorState::Point> thinned;
    for (size_t i = 0; i < state_.points.size(); ++i) {
      if (i % 2 == 0 || i + 1 == state_.points.size()) {
        thinned.push_back(state_.points[i]);
      }
    }
    state_.points = std::move(thinned);
  }
}

std::string Monitor::Tick(TimePoint now, uint64_t* seq) {
  MutexLock lock(&mu_);
  ++ticks_;
  if (seq != nullptr) *seq = ticks_;
  const double t = state_.Seconds(now);
  for (size_t i = 1; i < state_.shards.size(); ++i) {
    MonitorState::Shard& shard = state_.shards[i];
    if (shard.seen && !shard.silent_logged && !state_.Reporting(shard, now)) {
      shard.silent_logged = true;
      AddEventLocked(t, "warning",
                     "shard " + std::to_string(i) + " stopped reporting");
    }
  }
  UpdateWorkersLocked(t);
  MaybeAddPointLocked(t);
  std::string out = JsonText(UpdateJson(state_, now));
  state_.config_changed = false;
  state_.sent_point_seq = state_.sent_event_seq = state_.next_seq - 1;
  return out;
}

std::string Monitor::Snapshot(TimePoint now, uint64_t* seq) {
  MutexLock lock(&mu_);
  if (seq != nullptr) *seq = ticks_;
  return JsonText(SnapshotJson(state_, now));
}

std::optional<std::string> Monitor::Document(std::string_view name,
                                             TimePoint now) {
  MutexLock lock(&mu_);
  std::optional<json::value> document = DocumentJson(state_, name, now);
  if (!document) return std::nullopt;
  return JsonText(*document);
}

std::string Monitor::Metrics(TimePoint now) {
  MutexLock lock(&mu_);
  return MetricsText(state_, now);
}

void Monitor::OnShardCommand(int shard_id, std::string command) {
  MutexLock lock(&mu_);
  SetShardCommandLocked(shard_id, std::move(command));
}

void Monitor::SetShardCommandLocked(int shard_id, std::string command) {
  if (shard_id < 0 || shard_id >= state_.settings.num_shards) return;
  if (command.size() > kMaxCommandBytes) {
    command = "# a command line of " + std::to_string(command.size()) +
              " bytes, longer than the dashboard keeps";
  }
  state_.shard_commands.resize(state_.settings.num_shards);
  state_.config_changed |= state_.shard_commands[shard_id] != command;
  state_.shard_commands[shard_id] = std::move(command);
}

void Monitor::OnManifest(std::string manifest) {
  boost::system::error_code ec;
  const json::value v = json::parse(manifest, ec);
  MutexLock lock(&mu_);
  // Every process's command comes with its part of the manifest: one
  // change of the config for both.
  if (!ec && v.is_object()) {
    for (const auto& [key, set] :
         {std::pair{"shards", &Monitor::SetShardCommandLocked},
          std::pair{"workers", &Monitor::SetWorkerCommandLocked}}) {
      const json::value* list = v.as_object().if_contains(key);
      if (list == nullptr || !list->is_array()) continue;
      int index = 0;
      for (const json::value& p : list->as_array()) {
        const json::value* command =
            p.is_object() ? p.as_object().if_contains("command") : nullptr;
        if (command != nullptr && command->is_string()) {
          (this->*set)(index, std::string(command->get_string()));
        }
        ++index;
      }
    }
  }
  state_.config_changed |= state_.manifest != manifest;
  state_.manifest = std::move(manifest);
}

void Monitor::OnWorkerCommand(int rank, std::string command) {
  MutexLock lock(&mu_);
  SetWorkerCommandLocked(rank, std::move(command));
}

void Monitor::SetWorkerCommandLocked(int rank, std::string command) {
  if (rank < 0 || static_cast<size_t>(rank) >= MaxRanks(state_.settings)) {
    return;
  }
  if (command.size() > kMaxCommandBytes) {
    command = "# a command line of " + std::to_string(command.size()) +
              " bytes, longer than the dashboard keeps";
  }
  // A worker beyond --workers may say its command before shard 0 lists it.
  if (state_.worker_commands.size() <= static_cast<size_t>(rank)) {
    state_.worker_commands.resize(rank + 1);
  }
  state_.config_changed |= state_.worker_commands[rank] != command;
  state_.worker_commands[rank] = std::move(command);
}

}  // namespace tether

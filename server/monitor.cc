#include "server/monitor.h"

#include <algorithm>
#include <boost/json.hpp>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iomanip>
#include <sstream>

#include "schema/flags.h"
#include "schema/log.h"
#include "server/json_text.h"

namespace tether {
namespace json = boost::json;

namespace {

// A float as the decimal it was meant to be (0.001, not 0.0010000000475).
double Decimal(float value) {
  return std::strtod(NumberText(value).c_str(), nullptr);
}

// A float figure where negative means "not known" (loss, accuracy).
json::value Known(float value) {
  if (value < 0 || !std::isfinite(value)) return nullptr;
  return Decimal(value);
}

json::value Optional(const std::optional<double>& value) {
  if (!value || !std::isfinite(*value)) return nullptr;
  return *value;
}

double Finite(double value) { return std::isfinite(value) ? value : 0; }

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

// Prometheus text format: one family (HELP, TYPE, then its samples).
class Exposition {
 public:
  void Family(const std::string& name, const std::string& type,
              const std::string& help) {
    out_ << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' '
         << type << '\n';
  }
  // `labels` is `key="value",...` without braces, already escaped.
  void Sample(const std::string& name, const std::string& labels,
              double value) {
    out_ << name;
    if (!labels.empty()) out_ << '{' << labels << '}';
    out_ << ' ';
    if (std::isnan(value)) {
      out_ << "NaN";
    } else if (std::isinf(value)) {
      out_ << (value > 0 ? "+Inf" : "-Inf");
    } else if (value == std::floor(value) && std::fabs(value) < 1e15) {
      out_ << static_cast<int64_t>(value);
    } else {
      out_ << std::setprecision(17) << value;
    }
    out_ << '\n';
  }
  static std::string Label(const std::string& key, const std::string& value) {
    std::string out = key + "=\"";
    for (char c : value) {
      if (c == '\\' || c == '"') {
        out += '\\';
        out += c;
      } else if (c == '\n') {
        out += "\\n";
      } else {
        out += c;
      }
    }
    return out + '"';
  }
  std::string str() const { return out_.str(); }

 private:
  std::ostringstream out_;
};

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
    if (w.done) {
      states[i] = WorkerState::kFinished;
    } else if (!w.connected || !w.live) {  // gone, or evicted for silence
      states[i] = was ? WorkerState::kDead : WorkerState::kJoining;
    }
  }
  return states;
}

Monitor::Monitor(RunSettings settings, MonitorOptions options)
    : settings_(std::move(settings)),
      options_(options),
      start_unix_ms_(UnixMs()),
      shards_(settings_.num_shards),
      ever_connected_(settings_.num_workers, false),
      states_(settings_.num_workers, WorkerState::kJoining),
      stragglers_(settings_.num_workers, options.stragglers),
      straggled_at_(settings_.num_workers, -1e9),
      lags_(settings_.num_workers, 0),
      nonfinite_(settings_.num_workers, 0),
      nonfinite_evented_(settings_.num_workers, 0),
      checkpoints_enabled_(settings_.checkpoint_every > 0 ||
                           settings_.resume_round >= 0) {}

double Monitor::Seconds(TimePoint now) const {
  return std::chrono::duration<double>(now - start_).count();
}

void Monitor::OnShardStats(const ShardStats& stats, TimePoint now) {
  std::lock_guard lock(mu_);
  if (stats.shard_id < 0 ||
      stats.shard_id >= static_cast<int>(shards_.size())) {
    return;
  }
  ShardView& shard = shards_[stats.shard_id];
  if (!shard.seen) {
    shard.rate_at = now;
    shard.rate_pushes = stats.pushes;
    shard.rate_in = stats.bytes_in;
    shard.rate_out = stats.bytes_out;
  } else if (shard.silent_logged) {
    AddEventLocked(
        Seconds(now), "info",
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
  std::lock_guard lock(mu_);
  const double t = Seconds(Now());
  RoundView& round = rounds_[written.round];
  // Rounds are few (one every --checkpoint-every clocks); keep the last 50.
  while (rounds_.size() > 50 && rounds_.begin()->first != written.round) {
    rounds_.erase(rounds_.begin());
  }
  if (written.shard_id >= 0 &&
      written.shard_id < static_cast<int>(shards_.size())) {
    ShardView& shard = shards_[written.shard_id];
    shard.write_seconds_sum += written.seconds;
    ++shard.writes;
  }
  if (!written.error.empty()) {
    if (round.status == "failed") return;  // the first error is the cause
    ++rounds_failed_;
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
  std::lock_guard lock(mu_);
  RoundView& view = rounds_[round];
  view.status = "complete";
  view.bytes = bytes;
  view.finished_unix_ms = UnixMs();
  ++rounds_complete_;
  // The server logs the round when it records it.
  AddEventLocked(Seconds(Now()), "info",
                 "checkpoint round " + std::to_string(round) + " complete (" +
                     std::to_string(bytes) + " bytes)",
                 Log::kLoggedElsewhere);
  // Every shard now deletes all but the newest keep_checkpoints complete
  // rounds (CheckpointStore::Prune).
  int kept = 0;
  for (auto it = rounds_.rbegin(); it != rounds_.rend(); ++it) {
    if (it->second.status != "complete") continue;
    if (++kept > settings_.keep_checkpoints) it->second.status = "pruned";
  }
}

void Monitor::SetCheckpointsEnabled(bool enabled) {
  std::lock_guard lock(mu_);
  checkpoints_enabled_ = enabled;
}

void Monitor::OnRunStopped(const std::string& event) {
  std::lock_guard lock(mu_);
  stopped_ = true;
  // The coordinator logs the stop when it tells the workers.
  AddEventLocked(Seconds(Now()), "warning", event, Log::kLoggedElsewhere);
}

void Monitor::OnResumed(int64_t round) {
  std::lock_guard lock(mu_);
  settings_.resume_round = round;
  config_changed_ = true;
  AddEventLocked(Seconds(Now()), "info",
                 "resumed from checkpoint round " + std::to_string(round) +
                     ": every shard loaded it");
}

void Monitor::SetDashboardClients(size_t clients, uint64_t dropped) {
  std::lock_guard lock(mu_);
  dashboard_clients_ = clients;
  dashboard_dropped_ = dropped;
}

void Monitor::AddEventLocked(double t, std::string level, std::string text,
                             Log log) {
  const LogLevel as = level == "error"     ? LogLevel::kError
                      : level == "warning" ? LogLevel::kWarning
                                           : LogLevel::kInfo;
  if (log == Log::kAlso && LogEnabled(as)) LogLine(as, text);
  events_.push_back({next_seq_++, t, std::move(level), std::move(text)});
  while (events_.size() > options_.max_events) events_.pop_front();
}

void Monitor::UpdateWorkersLocked(double t) {
  const ShardView& shard0 = shards_[0];
  if (!shard0.seen) return;
  const auto& workers = shard0.stats.workers;
  for (const auto& w : workers) {
    if (w.connected && w.rank >= 0 &&
        w.rank < static_cast<int>(ever_connected_.size())) {
      ever_connected_[w.rank] = true;
    }
  }
  std::vector<WorkerState> states = ClassifyWorkers(workers, ever_connected_);
  std::vector<uint64_t> nonfinite(nonfinite_.size(), 0);
  for (const ShardView& shard : shards_) {
    for (const auto& w : shard.stats.workers) {
      if (w.rank >= 0 && w.rank < static_cast<int>(nonfinite.size())) {
        nonfinite[w.rank] += w.nonfinite_pushes;
      }
    }
  }
  for (size_t i = 0; i < nonfinite.size() && i < workers.size(); ++i) {
    // The first refusal, then each doubling: a worker that pushes NaN every
    // step must not push every other event out of the list.
    if (nonfinite[i] > nonfinite_[i] &&
        nonfinite[i] >= 2 * nonfinite_evented_[i]) {
      AddEventLocked(t, "warning",
                     WorkerName(workers[i]) + ": " +
                         std::to_string(nonfinite[i] - nonfinite_evented_[i]) +
                         " push(es) refused as non-finite (NaN or Inf, or "
                         "an update that would overflow); " +
                         std::to_string(nonfinite[i]) + " in all");
      nonfinite_evented_[i] = nonfinite[i];
    }
  }
  nonfinite_ = std::move(nonfinite);
  const bool all_joined =
      std::all_of(ever_connected_.begin(), ever_connected_.end(),
                  [](bool joined) { return joined; });
  std::vector<StragglerWatch::Worker> sample(workers.size());
  int64_t fastest = 0;  // of the running workers
  for (size_t i = 0; i < workers.size(); ++i) {
    const bool running = states[i] == WorkerState::kRunning;
    sample[i] = {workers[i].clock, workers[i].staleness, running};
    if (running) fastest = std::max(fastest, workers[i].clock);
  }
  const std::vector<StragglerWatch::Verdict> verdicts =
      stragglers_.Sample(t, sample, all_joined);
  for (size_t i = 0; i < workers.size() && i < states_.size(); ++i) {
    const ShardStats::Worker& w = workers[i];
    lags_[i] = w.connected ? std::max<int64_t>(0, fastest - w.clock) : 0;
    const WorkerState was = states_[i];
    WorkerState now = states[i];
    // Under BSP a straggler is level with the others for a moment every
    // clock, and running then; one warning per spell, not per return.
    bool new_spell = false;
    if (now == WorkerState::kRunning && verdicts[i].straggling) {
      now = WorkerState::kStraggling;
      new_spell = t - straggled_at_[i] > options_.stragglers.window_s;
      straggled_at_[i] = t;
    }
    states_[i] = now;
    if (was == now) continue;
    const std::string name = WorkerName(w);
    // First seen (or seen again) already straggling, finished or gone
    // between two samples: it still joined (rejoined) first. The
    // coordinator logs every join as it happens.
    if (now != WorkerState::kRunning && now != WorkerState::kJoining) {
      if (was == WorkerState::kJoining) {
        AddEventLocked(t, "info", name + " joined", Log::kLoggedElsewhere);
      } else if (was == WorkerState::kDead && now != WorkerState::kDead) {
        AddEventLocked(t, "info", name + " rejoined", Log::kLoggedElsewhere);
      }
    }
    switch (now) {
      case WorkerState::kDead:
        ++evictions_;
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
                  StragglingText(verdicts[i], options_.stragglers.window_s));
        }
        break;
      case WorkerState::kFinished:
        AddEventLocked(t, "info", name + " finished");
        break;
      case WorkerState::kRunning:
        if (was == WorkerState::kDead) {
          AddEventLocked(t, "info", name + " rejoined", Log::kLoggedElsewhere);
        } else if (was == WorkerState::kJoining) {
          AddEventLocked(t, "info", name + " joined", Log::kLoggedElsewhere);
        }
        break;
      case WorkerState::kJoining:
        break;
    }
  }
}

void Monitor::MaybeAddPointLocked(double t) {
  const ShardView& shard0 = shards_[0];
  if (!shard0.seen || shard0.stats.reports == reports_at_last_point_) return;
  reports_at_last_point_ = shard0.stats.reports;
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
    if (w.test_accuracy >= 0 && (w.test_accuracy != last_test_accuracy_ ||
                                 w.test_loss != last_test_loss_)) {
      last_test_accuracy_ = w.test_accuracy;
      last_test_loss_ = w.test_loss;
      accuracy = w.test_accuracy;
    }
  }
  Point p{next_seq_++,  t,        shard0.stats.min_clock,
          std::nullopt, accuracy, Finite(rate)};
  if (losses > 0) p.loss = loss_sum / losses;
  points_.push_back(p);
  if (points_.size() > options_.max_points) {
    // Keep every other point, so the curve keeps its whole span.
    std::deque<Point> thinned;
    for (size_t i = 0; i < points_.size(); ++i) {
      if (i % 2 == 0 || i + 1 == points_.size()) {
        thinned.push_back(points_[i]);
      }
    }
    points_ = std::move(thinned);
  }
}

bool Monitor::Reporting(const ShardView& shard, TimePoint now) const {
  return shard.seen && std::chrono::duration<double>(now - shard.at).count() <
                           options_.shard_silent_s;
}

std::string Monitor::Tick(TimePoint now) {
  std::lock_guard lock(mu_);
  const double t = Seconds(now);
  for (size_t i = 1; i < shards_.size(); ++i) {
    ShardView& shard = shards_[i];
    if (shard.seen && !shard.silent_logged && !Reporting(shard, now)) {
      shard.silent_logged = true;
      AddEventLocked(t, "warning",
                     "shard " + std::to_string(i) + " stopped reporting");
    }
  }
  UpdateWorkersLocked(t);
  MaybeAddPointLocked(t);
  std::string out = R"({"type":"update","status":)" + StatusLocked(now) +
                    R"(,"workers":)" + WorkersLocked() + R"(,"shards":)" +
                    ShardsLocked(now) + R"(,"checkpoints":)" +
                    CheckpointsLocked() + R"(,"history":)" +
                    PointsLocked(sent_point_seq_) + R"(,"events":)" +
                    EventsLocked(sent_event_seq_);
  // The config changes only when a process says how it was started.
  if (config_changed_) out += R"(,"config":)" + ConfigLocked();
  config_changed_ = false;
  out += "}";
  sent_point_seq_ = sent_event_seq_ = next_seq_ - 1;
  return out;
}

std::string Monitor::Snapshot(TimePoint now) {
  std::lock_guard lock(mu_);
  return R"({"type":"snapshot","status":)" + StatusLocked(now) +
         R"(,"workers":)" + WorkersLocked() + R"(,"shards":)" +
         ShardsLocked(now) + R"(,"checkpoints":)" + CheckpointsLocked() +
         R"(,"config":)" + ConfigLocked() + R"(,"history":)" + PointsLocked(0) +
         R"(,"events":)" + EventsLocked(0, sent_event_seq_) + "}";
}

std::optional<std::string> Monitor::Document(std::string_view name,
                                             TimePoint now) {
  std::lock_guard lock(mu_);
  if (name == "status") return StatusLocked(now);
  if (name == "workers") return WorkersLocked();
  if (name == "shards") return ShardsLocked(now);
  if (name == "checkpoints") return CheckpointsLocked();
  if (name == "config") return ConfigLocked();
  if (name == "history") return R"({"points":)" + PointsLocked(0) + "}";
  if (name == "events") return R"({"events":)" + EventsLocked(0) + "}";
  return std::nullopt;
}

std::string Monitor::StatusLocked(TimePoint now) const {
  const ShardView& shard0 = shards_[0];
  int live = 0, joined = 0, finished = 0;
  int64_t max_clock = 0;
  uint64_t samples = 0;
  double rate = 0, loss_sum = 0;
  int losses = 0;
  json::value accuracy = nullptr;
  for (const auto& w : shard0.stats.workers) {
    samples += w.samples;
    if (w.test_accuracy >= 0) accuracy = Known(w.test_accuracy);
    if (w.done) ++finished;
    if (w.rank < static_cast<int>(ever_connected_.size()) &&
        ever_connected_[w.rank]) {
      ++joined;
    }
    // The furthest any worker got (one that finished or left counts), so
    // the header never shows a maximum below the minimum.
    max_clock = std::max(max_clock, w.clock);
    if (!w.connected) continue;
    ++live;
    rate += w.samples_per_s;
    if (w.loss >= 0 && std::isfinite(w.loss)) {
      loss_sum += w.loss;
      ++losses;
    }
  }
  const char* state = "running";
  if (joined < settings_.num_workers) state = "waiting";
  if (settings_.num_workers > 0 && finished == settings_.num_workers) {
    state = "finished";
  }
  if (stopped_) state = "stopped";
  int reporting = 0;
  uint64_t pushes = 0, pulls = 0, rejected = 0;
  std::vector<uint64_t> histogram;
  for (const ShardView& shard : shards_) {
    if (Reporting(shard, now) || &shard == &shard0) reporting += shard.seen;
    pushes += shard.stats.pushes;
    pulls += shard.stats.pulls;
    rejected += shard.stats.rejected_pushes;
    const auto& h = shard.stats.staleness_histogram;
    if (histogram.size() < h.size()) histogram.resize(h.size());
    for (size_t i = 0; i < h.size(); ++i) histogram[i] += h[i];
  }
  json::array hist(histogram.begin(), histogram.end());
  json::object o;
  o["state"] = state;
  o["uptime_s"] = Seconds(now);
  o["started_unix_ms"] = start_unix_ms_;
  o["shards"] = settings_.num_shards;
  o["shards_reporting"] = reporting;
  o["workers"] = settings_.num_workers;
  o["workers_live"] = live;
  o["staleness"] = settings_.max_staleness;
  o["min_clock"] = shard0.stats.min_clock;
  o["max_clock"] = max_clock;
  o["samples"] = samples;
  o["samples_per_s"] = Finite(rate);
  o["loss"] = losses > 0 ? json::value(loss_sum / losses) : nullptr;
  o["test_accuracy"] = accuracy;
  o["pushes"] = pushes;
  o["pulls"] = pulls;
  o["rejected_pushes"] = rejected;
  o["staleness_histogram"] = std::move(hist);
  o["dashboard_clients"] = dashboard_clients_;
  return JsonText(o);
}

std::string Monitor::WorkersLocked() const {
  json::array out;
  const auto& workers = shards_[0].stats.workers;
  for (size_t i = 0; i < workers.size(); ++i) {
    const ShardStats::Worker& w = workers[i];
    json::object o;
    o["rank"] = w.rank;
    o["host"] = w.host;
    o["device"] = w.device;
    o["state"] = i < states_.size() ? WorkerStateName(states_[i]) : "unknown";
    o["clock"] = w.clock;
    o["lag"] = i < lags_.size() ? lags_[i] : 0;
    o["staleness_bound"] = w.staleness;
    o["epoch"] = w.epoch;
    o["samples"] = w.samples;
    o["samples_per_s"] = Finite(w.samples_per_s);
    o["wait_fraction"] = Finite(w.wait_fraction);
    o["loss"] = Known(w.loss);
    o["test_accuracy"] = Known(w.test_accuracy);
    o["nonfinite_pushes"] = i < nonfinite_.size() ? nonfinite_[i] : 0;
    out.push_back(std::move(o));
  }
  return JsonText(out);
}

std::string Monitor::ShardsLocked(TimePoint now) const {
  json::array out;
  for (size_t i = 0; i < shards_.size(); ++i) {
    const ShardView& shard = shards_[i];
    const ShardStats& s = shard.stats;
    json::object o;
    o["shard_id"] = static_cast<int>(i);
    o["reporting"] = Reporting(shard, now);
    o["age_s"] =
        shard.seen
            ? json::value(std::chrono::duration<double>(now - shard.at).count())
            : nullptr;
    o["tensors"] = s.tensors;
    o["dense_blocks"] = s.dense_blocks;
    o["sparse_rows"] = s.sparse_rows;
    o["bytes"] = s.bytes;
    o["pushes"] = s.pushes;
    o["pulls"] = s.pulls;
    o["rejected_pushes"] = s.rejected_pushes;
    o["waiting_pulls"] = s.waiting_pulls;
    o["bytes_in"] = s.bytes_in;
    o["bytes_out"] = s.bytes_out;
    o["pushes_per_s"] = shard.pushes_per_s;
    o["bytes_in_per_s"] = shard.in_per_s;
    o["bytes_out_per_s"] = shard.out_per_s;
    o["min_clock"] = s.min_clock;
    out.push_back(std::move(o));
  }
  return JsonText(out);
}

std::string Monitor::CheckpointsLocked() const {
  json::array rounds;
  for (auto it = rounds_.rbegin(); it != rounds_.rend(); ++it) {
    const RoundView& r = it->second;
    json::object o;
    o["round"] = it->first;
    o["status"] = r.status;
    o["finished_unix_ms"] =
        r.finished_unix_ms > 0 ? json::value(r.finished_unix_ms) : nullptr;
    o["bytes"] = r.bytes;
    o["seconds"] = r.seconds;
    o["shards_written"] = r.shards_written;
    o["error"] = r.error;
    rounds.push_back(std::move(o));
  }
  json::object o;
  o["every"] = settings_.checkpoint_every;
  o["keep"] = settings_.keep_checkpoints;
  o["enabled"] = checkpoints_enabled_;
  o["resumed_from"] = settings_.resume_round >= 0
                          ? json::value(settings_.resume_round)
                          : nullptr;
  o["rounds"] = std::move(rounds);
  return JsonText(o);
}

std::string Monitor::ConfigLocked() const {
  const RunSettings& s = settings_;
  json::object seeds;
  seeds["run"] = s.seed;
  seeds["initial_values"] =
      "pure function of (seed, tensor, index); init provided: rank 0's "
      "values (tether.torch: its module built under the run seed)";
  seeds["data_order"] = "pure function of (seed, rank, epoch)";
  json::object o;
  o["run_id"] = s.run_id;
  o["seed"] = s.seed;
  o["shards"] = s.num_shards;
  o["keep_checkpoints"] = s.keep_checkpoints;
  o["workers"] = s.num_workers;
  o["max_staleness"] = s.max_staleness;
  o["reject_staleness"] = s.reject_staleness;
  o["block_size"] = s.block_size;
  o["checkpoint_every"] = s.checkpoint_every;
  o["checkpoints_enabled"] = checkpoints_enabled_;
  o["resume_round"] = s.resume_round;
  o["optimizer"] = OptimizerName(s.optimizer.kind);
  o["lr"] = Decimal(s.optimizer.lr);
  o["momentum"] = Decimal(s.optimizer.momentum);
  o["beta1"] = Decimal(s.optimizer.beta1);
  o["beta2"] = Decimal(s.optimizer.beta2);
  o["epsilon"] = Decimal(s.optimizer.epsilon);
  o["worker_timeout_ms"] = s.worker_timeout_ms;
  o["heartbeat_ms"] = s.heartbeat_ms;
  o["backup_workers"] = s.backup_workers;
  o["staleness_lr"] = s.staleness_lr;
  o["seeds"] = std::move(seeds);
  const std::vector<ProcessCommand> commands = CommandsLocked();
  json::array listed;
  for (const ProcessCommand& p : commands) {
    json::object entry;
    entry["process"] = p.process;
    entry["command"] =
        p.command.empty() ? json::value(nullptr) : json::value(p.command);
    listed.push_back(std::move(entry));
  }
  o["commands"] = std::move(listed);
  o["command"] = RunScript(commands);
  return JsonText(o);
}

void Monitor::OnShardCommand(int shard_id, std::string command) {
  std::lock_guard lock(mu_);
  if (shard_id < 0 || shard_id >= settings_.num_shards) return;
  if (command.size() > kMaxCommandBytes) {
    command = "# a command line of " + std::to_string(command.size()) +
              " bytes, longer than the dashboard keeps";
  }
  shard_commands_.resize(settings_.num_shards);
  config_changed_ |= shard_commands_[shard_id] != command;
  shard_commands_[shard_id] = std::move(command);
}

void Monitor::OnWorkerCommand(int rank, std::string command) {
  std::lock_guard lock(mu_);
  if (rank < 0 || rank >= settings_.num_workers) return;
  if (command.size() > kMaxCommandBytes) {
    command = "# a command line of " + std::to_string(command.size()) +
              " bytes, longer than the dashboard keeps";
  }
  worker_commands_.resize(settings_.num_workers);
  config_changed_ |= worker_commands_[rank] != command;
  worker_commands_[rank] = std::move(command);
}

std::vector<ProcessCommand> Monitor::CommandsLocked() const {
  std::vector<ProcessCommand> out;
  auto known = [](const std::vector<std::string>& v, int i) {
    return i < static_cast<int>(v.size()) ? v[i] : std::string();
  };
  for (int i = 0; i < settings_.num_shards; ++i) {
    std::string command = known(shard_commands_, i);
    if (i == 0 && command.empty()) command = ReproduceCommand(settings_);
    out.push_back({"shard " + std::to_string(i), std::move(command)});
  }
  for (int r = 0; r < settings_.num_workers; ++r) {
    out.push_back({"worker " + std::to_string(r), known(worker_commands_, r)});
  }
  return out;
}

std::string Monitor::PointsLocked(uint64_t after_seq) const {
  json::array out;
  for (const Point& p : points_) {
    if (p.seq <= after_seq) continue;
    json::object o;
    o["t"] = p.t;
    o["clock"] = p.clock;
    o["loss"] = Optional(p.loss);
    o["test_accuracy"] = Optional(p.test_accuracy);
    o["samples_per_s"] = p.samples_per_s;
    out.push_back(std::move(o));
  }
  return JsonText(out);
}

std::string Monitor::EventsLocked(uint64_t after_seq, uint64_t up_to) const {
  json::array out;
  for (const Event& e : events_) {
    if (e.seq <= after_seq || e.seq > up_to) continue;
    json::object o;
    o["t"] = e.t;
    o["level"] = e.level;
    o["text"] = e.text;
    out.push_back(std::move(o));
  }
  return JsonText(out);
}

std::string Monitor::Metrics(TimePoint now) {
  std::lock_guard lock(mu_);
  Exposition m;
  auto rank = [](int r) {
    return Exposition::Label("rank", std::to_string(r));
  };
  auto shard = [](size_t s) {
    return Exposition::Label("shard", std::to_string(s));
  };
  const auto& workers = shards_[0].stats.workers;

  m.Family("tether_uptime_seconds", "gauge",
           "Seconds since shard 0 started serving the dashboard.");
  m.Sample("tether_uptime_seconds", "", Seconds(now));
  m.Family("tether_min_clock", "gauge",
           "The slowest live worker's clock on shard 0.");
  m.Sample("tether_min_clock", "", shards_[0].stats.min_clock);
  m.Family("tether_workers", "gauge", "Workers in each state.");
  for (WorkerState st :
       {WorkerState::kJoining, WorkerState::kRunning, WorkerState::kStraggling,
        WorkerState::kFinished, WorkerState::kDead}) {
    m.Sample(
        "tether_workers", Exposition::Label("state", WorkerStateName(st)),
        static_cast<double>(std::count(states_.begin(), states_.end(), st)));
  }
  m.Family("tether_worker_clock", "gauge", "Each worker's clock on shard 0.");
  for (const auto& w : workers)
    m.Sample("tether_worker_clock", rank(w.rank), w.clock);
  m.Family("tether_worker_lag", "gauge",
           "Clocks each worker is behind the fastest running worker "
           "(web/API.md).");
  for (size_t i = 0; i < workers.size() && i < lags_.size(); ++i) {
    m.Sample("tether_worker_lag", rank(workers[i].rank), lags_[i]);
  }
  m.Family("tether_worker_samples_per_second", "gauge",
           "Each worker's training throughput, as it last reported.");
  for (const auto& w : workers) {
    m.Sample("tether_worker_samples_per_second", rank(w.rank),
             Finite(w.samples_per_s));
  }
  m.Family("tether_worker_samples_total", "counter",
           "Training samples each worker has processed.");
  for (const auto& w : workers) {
    m.Sample("tether_worker_samples_total", rank(w.rank), w.samples);
  }
  m.Family("tether_worker_loss", "gauge",
           "Each worker's mean training loss over its last report.");
  for (const auto& w : workers) {
    if (w.loss >= 0) m.Sample("tether_worker_loss", rank(w.rank), w.loss);
  }
  m.Family("tether_test_accuracy", "gauge",
           "The latest test-set accuracy (rank 0 evaluates).");
  for (const auto& w : workers) {
    if (w.test_accuracy >= 0) {
      m.Sample("tether_test_accuracy", rank(w.rank), w.test_accuracy);
    }
  }
  m.Family("tether_worker_nonfinite_pushes_total", "counter",
           "Pushes refused as non-finite (NaN or Inf, or an update that "
           "would make a weight non-finite), by worker, over every shard.");
  for (size_t i = 0; i < workers.size() && i < nonfinite_.size(); ++i) {
    m.Sample("tether_worker_nonfinite_pushes_total", rank(workers[i].rank),
             static_cast<double>(nonfinite_[i]));
  }
  m.Family("tether_worker_evictions_total", "counter",
           "Workers declared dead: their connection closed before they "
           "reported finishing, or they were evicted for silence.");
  m.Sample("tether_worker_evictions_total", "",
           static_cast<double>(evictions_));

  // Staleness: one histogram over every shard's pushes.
  std::vector<uint64_t> buckets;
  uint64_t staleness_sum = 0;
  for (const ShardView& s : shards_) {
    const auto& h = s.stats.staleness_histogram;
    if (buckets.size() < h.size()) buckets.resize(h.size());
    for (size_t i = 0; i < h.size(); ++i) buckets[i] += h[i];
    staleness_sum += s.stats.staleness_sum;
  }
  m.Family("tether_push_staleness", "histogram",
           "Each push's staleness: the fastest worker's clock on the shard "
           "minus the clock its pusher pulled at (web/API.md).");
  uint64_t cumulative = 0;
  for (size_t i = 0; i + 1 < buckets.size(); ++i) {
    cumulative += buckets[i];
    m.Sample("tether_push_staleness_bucket",
             Exposition::Label("le", std::to_string(i)),
             static_cast<double>(cumulative));
  }
  if (!buckets.empty()) cumulative += buckets.back();
  m.Sample("tether_push_staleness_bucket", Exposition::Label("le", "+Inf"),
           static_cast<double>(cumulative));
  m.Sample("tether_push_staleness_sum", "", static_cast<double>(staleness_sum));
  m.Sample("tether_push_staleness_count", "", static_cast<double>(cumulative));

  struct Counter {
    const char* name;
    const char* type;
    const char* help;
    double (*value)(const ShardView&);
  };
  static constexpr Counter kPerShard[] = {
      {"tether_shard_pushes_total", "counter", "Pushes applied by each shard.",
       [](const ShardView& s) { return double(s.stats.pushes); }},
      {"tether_shard_pulls_total", "counter", "Pulls answered by each shard.",
       [](const ShardView& s) { return double(s.stats.pulls); }},
      {"tether_shard_rejected_pushes_total", "counter",
       "Pushes refused as too stale by each shard.",
       [](const ShardView& s) { return double(s.stats.rejected_pushes); }},
      {"tether_shard_received_bytes_total", "counter",
       "Bytes of frames each shard received.",
       [](const ShardView& s) { return double(s.stats.bytes_in); }},
      {"tether_shard_sent_bytes_total", "counter",
       "Bytes of frames each shard sent.",
       [](const ShardView& s) { return double(s.stats.bytes_out); }},
      {"tether_shard_parameter_bytes", "gauge",
       "Weights and optimizer state held by each shard.",
       [](const ShardView& s) { return double(s.stats.bytes); }},
      {"tether_shard_evictions_total", "counter",
       "Workers each shard evicted for silence (--worker-timeout-ms).",
       [](const ShardView& s) { return double(s.stats.evictions); }},
      {"tether_shard_late_pushes_total", "counter",
       "Pushes for a clock already closed (backup workers), dropped.",
       [](const ShardView& s) { return double(s.stats.late_pushes); }},
      {"tether_shard_waiting_pulls", "gauge",
       "Pulls each shard holds until the slowest worker catches up.",
       [](const ShardView& s) { return double(s.stats.waiting_pulls); }},
  };
  for (const Counter& c : kPerShard) {
    m.Family(c.name, c.type, c.help);
    for (size_t i = 0; i < shards_.size(); ++i) {
      if (shards_[i].seen) m.Sample(c.name, shard(i), c.value(shards_[i]));
    }
  }
  m.Family("tether_shard_reporting", "gauge",
           "1 when the shard's figures are fresh, 0 when it went quiet.");
  for (size_t i = 0; i < shards_.size(); ++i) {
    m.Sample("tether_shard_reporting", shard(i),
             i == 0 || Reporting(shards_[i], now) ? 1 : 0);
  }
  m.Family("tether_checkpoint_write_seconds", "summary",
           "Time each shard took to write its slice of a checkpoint round.");
  for (size_t i = 0; i < shards_.size(); ++i) {
    m.Sample("tether_checkpoint_write_seconds_sum", shard(i),
             shards_[i].write_seconds_sum);
    m.Sample("tether_checkpoint_write_seconds_count", shard(i),
             static_cast<double>(shards_[i].writes));
  }
  m.Family("tether_checkpoint_rounds_total", "counter",
           "Checkpoint rounds by outcome.");
  m.Sample("tether_checkpoint_rounds_total",
           Exposition::Label("status", "complete"),
           static_cast<double>(rounds_complete_));
  m.Sample("tether_checkpoint_rounds_total",
           Exposition::Label("status", "failed"),
           static_cast<double>(rounds_failed_));
  const ShardStats& s0 = shards_[0].stats;
  if (!s0.data_epochs.empty()) {
    m.Family("tether_data_rows_done", "gauge",
             "Rows of each epoch in chunks completed (--chunk-rows).");
    for (const ShardStats::DataEpoch& e : s0.data_epochs) {
      m.Sample("tether_data_rows_done",
               Exposition::Label("epoch", std::to_string(e.epoch)),
               static_cast<double>(e.rows_done));
    }
    m.Family("tether_data_chunks_reassigned_total", "counter",
             "Chunks given back by dead or evicted workers and handed out "
             "again.");
    m.Sample("tether_data_chunks_reassigned_total", "",
             static_cast<double>(s0.chunks_reassigned));
  }
  m.Family("tether_dashboard_clients", "gauge",
           "WebSocket clients of the dashboard.");
  m.Sample("tether_dashboard_clients", "",
           static_cast<double>(dashboard_clients_));
  m.Family("tether_dashboard_dropped_clients_total", "counter",
           "WebSocket clients dropped for not keeping up.");
  m.Sample("tether_dashboard_dropped_clients_total", "",
           static_cast<double>(dashboard_dropped_));
  return m.str();
}

}  // namespace tether

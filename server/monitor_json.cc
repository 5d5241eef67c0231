#include "server/monitor_json.h"

#include <algorithm>
#include <boost/json/parse.hpp>
#include <cmath>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include "schema/flags.h"
#include "server/reproduce.h"
#include "server/settings_fields.h"

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

// Every process and its command: shards by id, then workers by rank, every
// rank seen (--workers, shard 0's list, a command said) included.
std::vector<ProcessCommand> Commands(const MonitorState& state) {
  std::vector<ProcessCommand> out;
  auto known = [](const std::vector<std::string>& v, int i) {
    return i < static_cast<int>(v.size()) ? v[i] : std::string();
  };
  const RunSettings& s = state.settings;
  for (int i = 0; i < s.num_shards; ++i) {
    std::string command = known(state.shard_commands, i);
    if (i == 0 && command.empty()) command = ReproduceCommand(s);
    out.push_back({"shard " + std::to_string(i), std::move(command)});
  }
  const size_t ranks =
      std::max({static_cast<size_t>(std::max(0, s.num_workers)),
                state.states.size(), state.worker_commands.size()});
  for (int r = 0; r < static_cast<int>(ranks); ++r) {
    out.push_back(
        {"worker " + std::to_string(r), known(state.worker_commands, r)});
  }
  return out;
}

json::array CommandsJson(const std::vector<ProcessCommand>& commands) {
  json::array out;
  for (const ProcessCommand& p : commands) {
    json::object entry;
    entry["process"] = p.process;
    entry["command"] =
        p.command.empty() ? json::value(nullptr) : json::value(p.command);
    out.push_back(std::move(entry));
  }
  return out;
}

// The run's settings as the dashboard shows them: flat, each under its
// DashboardKey (server/settings_fields.h), floats as the decimals typed, the
// optimizer by name.
json::object SettingsJson(const RunSettings& s) {
  json::object o;
  ForEachSetting(s, [&o](const SettingField& field, const auto& value) {
    if (field.Has(kWelcomeOnly)) return;
    using T = std::remove_cvref_t<decltype(value)>;
    if constexpr (std::is_same_v<T, float>) {
      o[DashboardKey(field)] = Decimal(value);
    } else if constexpr (std::is_same_v<T, OptimizerKind>) {
      o[DashboardKey(field)] = OptimizerName(value);
    } else {
      o[DashboardKey(field)] = value;
    }
  });
  return o;
}

json::object SeedsJson(const RunSettings& s) {
  json::object seeds;
  seeds["run"] = s.seed;
  seeds["initial_values"] =
      "pure function of (seed, tensor, index); init provided: rank 0's "
      "values (tether.torch: its module built under the run seed)";
  seeds["data_order"] = "pure function of (seed, rank, epoch)";
  return seeds;
}

// "status", "workers", "shards" and "checkpoints": the head of every
// WebSocket message, after its "type".
json::object MessageHead(const MonitorState& state, const char* type,
                         MonitorState::TimePoint now) {
  json::object o;
  o["type"] = type;
  o["status"] = StatusJson(state, now);
  o["workers"] = WorkersJson(state);
  o["shards"] = ShardsJson(state, now);
  o["checkpoints"] = CheckpointsJson(state);
  return o;
}

}  // namespace

json::object StatusJson(const MonitorState& state,
                        MonitorState::TimePoint now) {
  const MonitorState::Shard& shard0 = state.shards[0];
  const RunSettings& settings = state.settings;
  int live = 0, joined_now = 0;
  // Some worker that joined is neither finished nor gone for good.
  bool training = false;
  bool any_finished = state.any_finished;
  int64_t max_clock = 0;
  uint64_t samples = 0;
  double rate = 0, loss_sum = 0;
  int losses = 0;
  json::value accuracy = nullptr;
  for (const auto& w : shard0.stats.workers) {
    samples += w.samples;
    if (w.test_accuracy >= 0) accuracy = Known(w.test_accuracy);
    any_finished |= w.done;
    const bool was = w.rank >= 0 &&
                     w.rank < static_cast<int>(state.ever_connected.size()) &&
                     state.ever_connected[w.rank];
    training |= (was || w.connected) && !w.done && !w.left;
    // The furthest any worker got (one that finished or left counts), so
    // the header never shows a maximum below the minimum.
    max_clock = std::max(max_clock, w.clock);
    if (!w.connected || w.left) continue;
    ++joined_now;
    live += w.live;
    rate += w.samples_per_s;
    if (w.loss >= 0 && std::isfinite(w.loss)) {
      loss_sum += w.loss;
      ++losses;
    }
  }
  // Ranks that were ever held: --workers of them start the run.
  const auto joined_once = std::count(state.ever_connected.begin(),
                                      state.ever_connected.end(), true);
  const char* run_state = "running";
  if (joined_once < settings.num_workers) run_state = "waiting";
  if (any_finished && !training) run_state = "finished";
  if (state.stopped) run_state = "stopped";
  int reporting = 0;
  uint64_t pushes = 0, pulls = 0, rejected = 0;
  std::vector<uint64_t> histogram;
  for (const MonitorState::Shard& shard : state.shards) {
    if (state.Reporting(shard, now) || &shard == &shard0) {
      reporting += shard.seen;
    }
    pushes += shard.stats.pushes;
    pulls += shard.stats.pulls;
    rejected += shard.stats.rejected_pushes;
    const auto& h = shard.stats.staleness_histogram;
    if (histogram.size() < h.size()) histogram.resize(h.size());
    for (size_t i = 0; i < h.size(); ++i) histogram[i] += h[i];
  }
  json::object o;
  o["state"] = run_state;
  o["uptime_s"] = state.Seconds(now);
  o["started_unix_ms"] = state.start_unix_ms;
  o["shards"] = settings.num_shards;
  o["shards_reporting"] = reporting;
  o["workers"] = settings.num_workers;
  o["workers_max"] = settings.max_workers;
  o["workers_joined"] = joined_now;
  o["workers_live"] = live;
  o["staleness"] = settings.max_staleness;
  o["min_clock"] = shard0.stats.min_clock;
  o["max_clock"] = max_clock;
  o["samples"] = samples;
  o["samples_per_s"] = FiniteOrZero(rate);
  o["loss"] = losses > 0 ? json::value(loss_sum / losses) : nullptr;
  o["test_accuracy"] = accuracy;
  o["pushes"] = pushes;
  o["pulls"] = pulls;
  o["rejected_pushes"] = rejected;
  o["staleness_histogram"] = json::array(histogram.begin(), histogram.end());
  o["dashboard_clients"] = state.dashboard_clients;
  return o;
}

json::array WorkersJson(const MonitorState& state) {
  json::array out;
  const auto& workers = state.shards[0].stats.workers;
  for (size_t i = 0; i < workers.size(); ++i) {
    const ShardStats::Worker& w = workers[i];
    json::object o;
    o["rank"] = w.rank;
    o["host"] = w.host;
    o["device"] = w.device;
    o["state"] =
        i < state.states.size() ? WorkerStateName(state.states[i]) : "unknown";
    o["clock"] = w.clock;
    o["lag"] = i < state.lags.size() ? state.lags[i] : 0;
    o["staleness_bound"] = w.staleness;
    o["epoch"] = w.epoch;
    o["samples"] = w.samples;
    o["samples_per_s"] = FiniteOrZero(w.samples_per_s);
    o["wait_fraction"] = FiniteOrZero(w.wait_fraction);
    o["loss"] = Known(w.loss);
    o["test_accuracy"] = Known(w.test_accuracy);
    o["nonfinite_pushes"] = i < state.nonfinite.size() ? state.nonfinite[i] : 0;
    out.push_back(std::move(o));
  }
  return out;
}

json::array ShardsJson(const MonitorState& state, MonitorState::TimePoint now) {
  json::array out;
  for (size_t i = 0; i < state.shards.size(); ++i) {
    const MonitorState::Shard& shard = state.shards[i];
    const ShardStats& s = shard.stats;
    json::object o;
    o["shard_id"] = static_cast<int>(i);
    o["reporting"] = state.Reporting(shard, now);
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
  return out;
}

json::object CheckpointsJson(const MonitorState& state) {
  json::array rounds;
  for (auto it = state.rounds.rbegin(); it != state.rounds.rend(); ++it) {
    const MonitorState::Round& r = it->second;
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
  const RunSettings& s = state.settings;
  json::object o;
  o["every"] = s.checkpoint_every;
  o["keep"] = s.keep_checkpoints;
  o["enabled"] = state.checkpoints_enabled;
  o["resumed_from"] =
      s.resume_round >= 0 ? json::value(s.resume_round) : nullptr;
  o["rounds"] = std::move(rounds);
  return o;
}

json::object ConfigJson(const MonitorState& state) {
  const RunSettings& s = state.settings;
  json::object o = SettingsJson(s);
  o["checkpoints_enabled"] = state.checkpoints_enabled;
  o["seeds"] = SeedsJson(s);
  const std::vector<ProcessCommand> commands = Commands(state);
  o["commands"] = CommandsJson(commands);
  o["command"] = RunScript(commands);
  boost::system::error_code ec;
  json::value manifest =
      state.manifest.empty() ? json::value() : json::parse(state.manifest, ec);
  o["manifest"] = ec ? json::value() : std::move(manifest);
  return o;
}

json::array PointsJson(const MonitorState& state, uint64_t after_seq) {
  json::array out;
  for (const MonitorState::Point& p : state.points) {
    if (p.seq <= after_seq) continue;
    json::object o;
    o["t"] = p.t;
    o["clock"] = p.clock;
    o["loss"] = Optional(p.loss);
    o["test_accuracy"] = Optional(p.test_accuracy);
    o["samples_per_s"] = p.samples_per_s;
    out.push_back(std::move(o));
  }
  return out;
}

json::array EventsJson(const MonitorState& state, uint64_t after_seq,
                       uint64_t up_to) {
  json::array out;
  for (const MonitorState::Event& e : state.events) {
    if (e.seq <= after_seq || e.seq > up_to) continue;
    json::object o;
    o["t"] = e.t;
    o["level"] = e.level;
    o["text"] = e.text;
    out.push_back(std::move(o));
  }
  return out;
}

std::optional<json::value> DocumentJson(const MonitorState& state,
                                        std::string_view name,
                                        MonitorState::TimePoint now) {
  if (name == "status") return StatusJson(state, now);
  if (name == "workers") return WorkersJson(state);
  if (name == "shards") return ShardsJson(state, now);
  if (name == "checkpoints") return CheckpointsJson(state);
  if (name == "config") return ConfigJson(state);
  if (name == "history") {
    return json::object{{"points", PointsJson(state, 0)}};
  }
  if (name == "events") {
    return json::object{{"events", EventsJson(state, 0)}};
  }
  return std::nullopt;
}

json::object SnapshotJson(const MonitorState& state,
                          MonitorState::TimePoint now) {
  json::object o = MessageHead(state, "snapshot", now);
  o["config"] = ConfigJson(state);
  o["history"] = PointsJson(state, 0);
  o["events"] = EventsJson(state, 0, state.sent_event_seq);
  return o;
}

json::object UpdateJson(const MonitorState& state,
                        MonitorState::TimePoint now) {
  json::object o = MessageHead(state, "update", now);
  o["history"] = PointsJson(state, state.sent_point_seq);
  o["events"] = EventsJson(state, state.sent_event_seq);
  // The config changes only when a process says how it was started.
  if (state.config_changed) o["config"] = ConfigJson(state);
  return o;
}

}  // namespace tether

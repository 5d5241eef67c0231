#include "server/monitor_metrics.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <optional>
#include <sstream>

namespace tether {
namespace {

using Shard = MonitorState::Shard;
using TimePoint = MonitorState::TimePoint;

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

std::string RankLabel(int rank) {
  return Exposition::Label("rank", std::to_string(rank));
}
std::string ShardLabel(size_t shard) {
  return Exposition::Label("shard", std::to_string(shard));
}

// Each function below writes one family, or a few that only make sense
// together; MetricsText writes them in the order of kFamilies.
using FamilyWriter = void (*)(const MonitorState&, TimePoint, Exposition&);

void Uptime(const MonitorState& state, TimePoint now, Exposition& m) {
  m.Family("tether_uptime_seconds", "gauge",
           "Seconds since shard 0 started serving the dashboard.");
  m.Sample("tether_uptime_seconds", "", state.Seconds(now));
}

void MinClock(const MonitorState& state, TimePoint, Exposition& m) {
  m.Family("tether_min_clock", "gauge",
           "The slowest live worker's clock on shard 0.");
  m.Sample("tether_min_clock", "", state.shards[0].stats.min_clock);
}

void WorkersByState(const MonitorState& state, TimePoint, Exposition& m) {
  m.Family("tether_workers", "gauge",
           "Worker ranks in each state (left: the rank is free).");
  for (WorkerState st :
       {WorkerState::kJoining, WorkerState::kRunning, WorkerState::kStraggling,
        WorkerState::kFinished, WorkerState::kDead, WorkerState::kLeft}) {
    m.Sample("tether_workers", Exposition::Label("state", WorkerStateName(st)),
             static_cast<double>(
                 std::count(state.states.begin(), state.states.end(), st)));
  }
}

// Ranks held now: /api/status's workers_joined.
void WorkersJoined(const MonitorState& state, TimePoint, Exposition& m) {
  const auto& workers = state.shards[0].stats.workers;
  m.Family("tether_workers_joined", "gauge",
           "Workers connected now and not left; more than --workers may "
           "join after the start.");
  m.Sample("tether_workers_joined", "",
           static_cast<double>(std::count_if(workers.begin(), workers.end(),
                                             [](const ShardStats::Worker& w) {
                                               return w.connected && !w.left;
                                             })));
}

// A family with a sample per worker on shard 0 (by position `i` in its
// list), labelled with its rank; nullopt: no sample for that worker.
struct PerWorker {
  const char* name;
  const char* type;
  const char* help;
  std::optional<double> (*value)(const MonitorState&, size_t i);
};

const ShardStats::Worker& WorkerAt(const MonitorState& state, size_t i) {
  return state.shards[0].stats.workers[i];
}

constexpr PerWorker kPerWorker[] = {
    {"tether_worker_clock", "gauge", "Each worker's clock on shard 0.",
     [](const MonitorState& s, size_t i) -> std::optional<double> {
       return WorkerAt(s, i).clock;
     }},
    {"tether_worker_lag", "gauge",
     "Clocks each worker is behind the fastest running worker "
     "(web/API.md).",
     [](const MonitorState& s, size_t i) -> std::optional<double> {
       if (i >= s.lags.size()) return std::nullopt;
       return s.lags[i];
     }},
    {"tether_worker_samples_per_second", "gauge",
     "Each worker's training throughput, as it last reported.",
     [](const MonitorState& s, size_t i) -> std::optional<double> {
       return FiniteOrZero(WorkerAt(s, i).samples_per_s);
     }},
    {"tether_worker_samples_total", "counter",
     "Training samples each worker has processed.",
     [](const MonitorState& s, size_t i) -> std::optional<double> {
       return WorkerAt(s, i).samples;
     }},
    {"tether_worker_loss", "gauge",
     "Each worker's mean training loss over its last report.",
     [](const MonitorState& s, size_t i) -> std::optional<double> {
       const float loss = WorkerAt(s, i).loss;
       if (loss < 0) return std::nullopt;  // not known
       return loss;
     }},
    {"tether_test_accuracy", "gauge",
     "The latest test-set accuracy (rank 0 evaluates).",
     [](const MonitorState& s, size_t i) -> std::optional<double> {
       const float accuracy = WorkerAt(s, i).test_accuracy;
       if (accuracy < 0) return std::nullopt;  // not evaluated
       return accuracy;
     }},
    {"tether_worker_nonfinite_pushes_total", "counter",
     "Pushes refused as non-finite (NaN or Inf, or an update that "
     "would make a weight non-finite), by worker, over every shard.",
     [](const MonitorState& s, size_t i) -> std::optional<double> {
       if (i >= s.nonfinite.size()) return std::nullopt;
       return static_cast<double>(s.nonfinite[i]);
     }},
};

void PerWorkerFamilies(const MonitorState& state, TimePoint, Exposition& m) {
  const auto& workers = state.shards[0].stats.workers;
  for (const PerWorker& f : kPerWorker) {
    m.Family(f.name, f.type, f.help);
    for (size_t i = 0; i < workers.size(); ++i) {
      const std::optional<double> value = f.value(state, i);
      if (value) m.Sample(f.name, RankLabel(workers[i].rank), *value);
    }
  }
}

void WorkerEvictions(const MonitorState& state, TimePoint, Exposition& m) {
  m.Family("tether_worker_evictions_total", "counter",
           "Workers declared dead: their connection closed before they "
           "reported finishing, or they were evicted for silence.");
  m.Sample("tether_worker_evictions_total", "",
           static_cast<double>(state.evictions));
}

// One histogram over every shard's pushes.
void PushStaleness(const MonitorState& state, TimePoint, Exposition& m) {
  std::vector<uint64_t> buckets;
  uint64_t staleness_sum = 0;
  for (const Shard& s : state.shards) {
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
}

// A family with a sample per shard that has reported.
struct PerShard {
  const char* name;
  const char* type;
  const char* help;
  double (*value)(const Shard&);
};

constexpr PerShard kPerShard[] = {
    {"tether_shard_pushes_total", "counter", "Pushes applied by each shard.",
     [](const Shard& s) { return double(s.stats.pushes); }},
    {"tether_shard_pulls_total", "counter", "Pulls answered by each shard.",
     [](const Shard& s) { return double(s.stats.pulls); }},
    {"tether_shard_rejected_pushes_total", "counter",
     "Pushes refused as too stale by each shard.",
     [](const Shard& s) { return double(s.stats.rejected_pushes); }},
    {"tether_shard_received_bytes_total", "counter",
     "Bytes of frames each shard received.",
     [](const Shard& s) { return double(s.stats.bytes_in); }},
    {"tether_shard_sent_bytes_total", "counter",
     "Bytes of frames each shard sent.",
     [](const Shard& s) { return double(s.stats.bytes_out); }},
    {"tether_shard_parameter_bytes", "gauge",
     "Weights and optimizer state held by each shard.",
     [](const Shard& s) { return double(s.stats.bytes); }},
    {"tether_shard_evictions_total", "counter",
     "Workers each shard evicted for silence (--worker-timeout-ms).",
     [](const Shard& s) { return double(s.stats.evictions); }},
    {"tether_shard_late_pushes_total", "counter",
     "Pushes for a clock already closed (backup workers), dropped.",
     [](const Shard& s) { return double(s.stats.late_pushes); }},
    {"tether_shard_waiting_pulls", "gauge",
     "Pulls each shard holds until the slowest worker catches up.",
     [](const Shard& s) { return double(s.stats.waiting_pulls); }},
};

void PerShardFamilies(const MonitorState& state, TimePoint, Exposition& m) {
  for (const PerShard& f : kPerShard) {
    m.Family(f.name, f.type, f.help);
    for (size_t i = 0; i < state.shards.size(); ++i) {
      if (state.shards[i].seen) {
        m.Sample(f.name, ShardLabel(i), f.value(state.shards[i]));
      }
    }
  }
}

void ShardsReporting(const MonitorState& state, TimePoint now, Exposition& m) {
  m.Family("tether_shard_reporting", "gauge",
           "1 when the shard's figures are fresh, 0 when it went quiet.");
  for (size_t i = 0; i < state.shards.size(); ++i) {
    m.Sample("tether_shard_reporting", ShardLabel(i),
             i == 0 || state.Reporting(state.shards[i], now) ? 1 : 0);
  }
}

void CheckpointWriteSeconds(const MonitorState& state, TimePoint,
                            Exposition& m) {
  m.Family("tether_checkpoint_write_seconds", "summary",
           "Time each shard took to write its slice of a checkpoint round.");
  for (size_t i = 0; i < state.shards.size(); ++i) {
    m.Sample("tether_checkpoint_write_seconds_sum", ShardLabel(i),
             state.shards[i].write_seconds_sum);
    m.Sample("tether_checkpoint_write_seconds_count", ShardLabel(i),
             static_cast<double>(state.shards[i].writes));
  }
}

void CheckpointRounds(const MonitorState& state, TimePoint, Exposition& m) {
  m.Family("tether_checkpoint_rounds_total", "counter",
           "Checkpoint rounds by outcome.");
  m.Sample("tether_checkpoint_rounds_total",
           Exposition::Label("status", "complete"),
           static_cast<double>(state.rounds_complete));
  m.Sample("tether_checkpoint_rounds_total",
           Exposition::Label("status", "failed"),
           static_cast<double>(state.rounds_failed));
}

// Only when the run hands out data in chunks (--chunk-rows).
void DataChunks(const MonitorState& state, TimePoint, Exposition& m) {
  const ShardStats& s0 = state.shards[0].stats;
  if (s0.data_epochs.empty()) return;
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

void DashboardClients(const MonitorState& state, TimePoint, Exposition& m) {
  m.Family("tether_dashboard_clients", "gauge",
           "WebSocket clients of the dashboard.");
  m.Sample("tether_dashboard_clients", "",
           static_cast<double>(state.dashboard_clients));
}

void DashboardDroppedClients(const MonitorState& state, TimePoint,
                             Exposition& m) {
  m.Family("tether_dashboard_dropped_clients_total", "counter",
           "WebSocket clients dropped for not keeping up.");
  m.Sample("tether_dashboard_dropped_clients_total", "",
           static_cast<double>(state.dashboard_dropped));
}

constexpr FamilyWriter kFamilies[] = {
    Uptime,
    MinClock,
    WorkersByState,
    WorkersJoined,
    PerWorkerFamilies,
    WorkerEvictions,
    PushStaleness,
    PerShardFamilies,
    ShardsReporting,
    CheckpointWriteSeconds,
    CheckpointRounds,
    DataChunks,
    DashboardClients,
    DashboardDroppedClients,
};

}  // namespace

std::string MetricsText(const MonitorState& state, TimePoint now) {
  Exposition m;
  for (FamilyWriter write : kFamilies) write(state, now, m);
  return m.str();
}

}  // namespace tether

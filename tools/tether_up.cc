// tether-up: starts a whole local tether cluster (shards and workers as
// real processes on loopback), shows its progress, and stops every process
// at the end or on Ctrl-C. See --help.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/json.hpp>
#include <chrono>
#include <climits>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "schema/atomic_file.h"
#include "schema/flags.h"
#include "schema/launcher.h"
#include "schema/log.h"
#include "schema/provenance.h"
#include "schema/tls.h"
#include "schema/wire_values.h"
#include "server/checkpoint_codec.h"
#include "server/settings_fields.h"
#include "tools/process.h"
#include "worker/client.h"

namespace tether {
namespace {

// The tether-server flags tether-up takes as its own, with their names,
// help and types (server/settings_fields.h): shard 0 gets them, every shard
// --shards.
constexpr std::string_view kServerFlags[] = {
    "shards", "workers",          "seed",   "optimizer",
    "lr",     "checkpoint-every", "record", "backup-workers"};

static_assert(std::ranges::all_of(kServerFlags,
                                  [](std::string_view flag) {
                                    return FindSettingFlag(flag) != nullptr;
                                  }),
              "kServerFlags names a flag tether-server does not have");

bool IsServerFlag(const SettingField& field) {
  for (std::string_view flag : kServerFlags) {
    if (field.flag == flag) return true;
  }
  return false;
}

// --chunk-rows -1 with a slowed worker: about 30 steps of 64 rows, so that
// a straggler's chunk in hand is small next to what the fast ones take.
constexpr int kAutoChunkRows = 2000;

// tether-up's defaults for them.
RunSettings UpRunDefaults() {
  RunSettings run;
  run.num_shards = 2;
  run.num_workers = 4;
  run.seed = 7;
  run.optimizer.kind = OptimizerKind::kAdam;
  run.optimizer.lr = 0.001f;
  return run;
}

struct UpOptions {
  // kServerFlags' settings; the others are not used.
  RunSettings run = UpRunDefaults();
  int slow = 1;           // how many workers (the last ranks) are slowed
  double slowdown = 3.0;  // how much slower they are
  std::string wire_dtype = "f32";   // --wire-dtype, given to every worker
  bool overlap_steps = false;       // --overlap-steps, to every worker
  bool prefetch_with_push = false;  // --prefetch-with-push, to every worker
  bool eval_in_background = true;   // --eval-in-background, to every worker
  int staleness = 3;
  std::string model = "mlp";
  // --hidden: the MLP's layer widths, given to every tether-worker; empty:
  // the worker's default.
  std::string hidden;
  // FILE.py:CLASS: workers are `python3 -m tether.worker` training this
  // PyTorch module instead of tether-worker's built-in --model.
  std::string python_model;
  std::string model_args;  // JSON keyword arguments for the module class
  std::string data = "fashion-mnist";
  int epochs = 6;
  int batch = 64;
  double target_accuracy = 0.85;
  std::string log_dir;   // default: a new /tmp/tether-up-XXXXXX
  std::string data_dir;  // shards' data dirs DIR/shardN; default: log_dir
  std::string resume;    // latest or a round
  // DATA_DIR of a run started with --record: replay it (its flags, those
  // given now on top), every shard from DIR/shardN.
  std::string replay;
  // A run manifest (server/manifest.h) to start a new run from: its
  // run-wide settings for the shards, and each worker as it was started
  // (the worker's argv, pointed at this cluster), by rank; an empty argv:
  // no worker of that rank.
  std::string manifest;
  std::vector<std::vector<std::string>> manifest_workers;
  // HOST:PORT of a running run's coordinator: start --workers more workers
  // for it (they take free ranks) instead of a cluster of its own.
  std::string join;
  int threads = 1;  // compute threads per worker
  // Workers' --chunk-rows: chunks of N rows from shard 0 (the fast take
  // over a straggler's rows); 0: fixed shares; -1 (auto): chunks of
  // kAutoChunkRows when a worker is slowed, fixed shares otherwise --
  // resolved when the run starts and saved so, so that a resumed or
  // replayed run keeps it whatever its own --slow.
  int chunk_rows = -1;
  int eval_every = 200;  // rank 0 evaluates every K clocks (--target-accuracy)
  int gpu_workers = 0;   // the first N ranks use --device cuda
  std::string http = "127.0.0.1:8080";  // shard 0's dashboard; off: none
  // Seconds to keep the shards and the dashboard up after training; -1:
  // until Ctrl-C.
  double linger_s = 0;
  std::string auth_key_file;  // the run's shared key, for every process
  TlsOptions tls;             // --tls-*: TLS for every process
  // The dashboard's token for POST endpoints; default LOG_DIR/dashboard.token.
  std::string http_token_file;
  // JSON for scripts: where the run is and its processes, then how it
  // ended (README, "tether-up"); empty: none.
  std::string summary_file;
  // With --resume: the flags of RunFlags() given on the command line; shard
  // 0 gets only these of the run-wide ones and takes the rest from the
  // round.
  std::set<std::string> given;
  // With --resume: the run's shard count before (its saved flags); 0:
  // unknown. When --shards differs, every shard gets --reshard-from with
  // DATA_DIR/shard0..shardN-1 and loads its part of the round.
  int resumed_shards = 0;
};

std::string BoolText(bool value) { return value ? "true" : "false"; }

// The flags that make a run what it is, kept in DATA_DIR/tether-up.flags so
// that --resume needs none of them again. `identity`: a resumed run cannot
// change it (a differing value is refused, naming the flag).
struct RunFlag {
  const char* name;
  bool identity;
  std::function<std::string(const UpOptions&)> text;
};

const std::vector<RunFlag>& RunFlags() {
  static const std::vector<RunFlag> flags = [] {
    std::vector<RunFlag> out;
    for (const SettingField& f : kSettingFields) {
      if (!IsServerFlag(f)) continue;
      // --shards and --workers may change on resume (ResumeMayChange).
      out.push_back(
          {f.flag.data(), f.Has(kIdentity) && !ResumeMayChange(f.flag),
           [flag = f.flag](auto& o) { return SettingTextOf(o.run, flag); }});
    }
    const std::vector<RunFlag> own = {
        {"model", true, [](auto& o) { return o.model; }},
        {"hidden", true, [](auto& o) { return o.hidden; }},
        {"python-model", true, [](auto& o) { return o.python_model; }},
        {"model-args", true, [](auto& o) { return o.model_args; }},
        {"slow", false, [](auto& o) { return std::to_string(o.slow); }},
        {"slowdown", false, [](auto& o) { return NumberText(o.slowdown); }},
        {"staleness", false,
         [](auto& o) { return std::to_string(o.staleness); }},
        {"data", false, [](auto& o) { return o.data; }},
        {"epochs", false, [](auto& o) { return std::to_string(o.epochs); }},
        {"batch", false, [](auto& o) { return std::to_string(o.batch); }},
        {"target-accuracy", false,
         [](auto& o) { return NumberText(o.target_accuracy); }},
        {"threads", false, [](auto& o) { return std::to_string(o.threads); }},
        {"chunk-rows", true,
         [](auto& o) { return std::to_string(o.chunk_rows); }},
        {"eval-every", false,
         [](auto& o) { return std::to_string(o.eval_every); }},
        {"gpu-workers", false,
         [](auto& o) { return std::to_string(o.gpu_workers); }},
        {"wire-dtype", false, [](auto& o) { return o.wire_dtype; }},
        {"overlap-steps", false,
         [](auto& o) { return BoolText(o.overlap_steps); }},
        {"prefetch-with-push", false,
         [](auto& o) { return BoolText(o.prefetch_with_push); }},
        {"eval-in-background", false,
         [](auto& o) { return BoolText(o.eval_in_background); }},
    };
    out.insert(out.end(), own.begin(), own.end());
    return out;
  }();
  return flags;
}

std::string SavedFlagsPath(const UpOptions& o) {
  return o.data_dir + "/tether-up.flags";
}

std::atomic<bool> g_interrupted{false};

using Clock = std::chrono::steady_clock;

std::string BinDir() {
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? "." : self.parent_path().string();
}

class Launcher {
 public:
  explicit Launcher(UpOptions o) : o_(std::move(o)), bin_(BinDir()) {}
  ~Launcher() { StopAll(); }

  int Run();

 private:
  // How the run ended, for --summary-file.
  struct Outcome {
    int exit_code = 0;
    std::string error;  // why it failed; empty when it ran to its end
    double seconds = 0;
    double accuracy = -1;     // the final evaluation's; -1: none
    int64_t stopped_at = -1;  // stopped from the dashboard at this clock
    int64_t round = -1;       // the checkpoint round holding a stopped run
  };
  // A process started, as --summary-file lists it (after StopAll too).
  struct Started {
    pid_t pid;
    std::string log;
  };

  Status StartShards();
  Status StartWorkers();
  // --manifest: every worker as the manifest says it was started.
  Status StartManifestWorkers();
  // A worker's program and model flags: tether-worker --model M, or
  // python3 -m tether.worker --model FILE:CLASS.
  // How a Python worker is started: env, PYTHONPATH, the interpreter.
  std::vector<std::string> PythonCommand() const;
  std::vector<std::string> WorkerCommand() const;
  // Watches until every worker has exited; kUnavailable names a process
  // that failed.
  Status Watch();
  // Polls the coordinator; prints a progress line when `print`.
  void Poll(bool print, bool tty);
  Status Evaluate(double* accuracy);
  // The clock at which the workers said they stop (the run was stopped
  // from the dashboard), or -1. Before StopAll.
  int64_t StoppedAtClock() const;
  // The newest round shard 0 completed, or -1. Before StopAll.
  int64_t LastCompleteRound() const;
  void PrintStopped(int64_t clock, int64_t round, double accuracy, double secs);
  void StopAll();
  void PrintResult(double accuracy, double secs);
  // Writes --summary-file, if given: `state` is starting, running,
  // lingering or exited; `outcome` is null until the run has ended. Says
  // on stderr why it could not.
  Status WriteSummary(const char* state, const Outcome* outcome) const;
  // --summary-file's "result".
  boost::json::object ResultJson(const Outcome& outcome) const;
  Status Failed(const Process& p, const std::string& name,
                const std::string& what);
  // Appends --auth-key-file and the --tls-* flags to a shard's or
  // worker's arguments.
  std::vector<std::string> WithKey(std::vector<std::string> argv) const;

  const UpOptions o_;
  const std::string bin_;
  std::string coordinator_;
  std::string dashboard_;  // its URL, when served
  std::vector<std::unique_ptr<Process>> shards_;
  std::vector<std::unique_ptr<Process>> workers_;
  std::vector<Started> started_shards_;
  std::vector<Started> started_workers_;
  std::unique_ptr<Client> observer_;
  Clock::time_point start_ = Clock::now();
  double target_reached_s_ = -1;  // when a test accuracy >= target was seen
  // Workers in the run (connected, not left) at the last Poll, whoever
  // started them.
  int workers_in_run_ = 0;
};

Status Launcher::Failed(const Process& p, const std::string& name,
                        const std::string& what) {
  return Unavailable(name + " " + what + "; last lines of " + p.log_path() +
                     ":\n" + Tail(p.Log(), 10));
}

std::vector<std::string> Launcher::WithKey(
    std::vector<std::string> argv) const {
  if (!o_.auth_key_file.empty()) {
    argv.push_back("--auth-key-file");
    argv.push_back(o_.auth_key_file);
  }
  if (o_.tls.enabled()) {
    argv.insert(argv.end(), {"--tls-cert", o_.tls.cert_file, "--tls-key",
                             o_.tls.key_file, "--tls-ca", o_.tls.ca_file});
  }
  return argv;
}

Status Launcher::StartShards() {
  for (int id = 0; id < o_.run.num_shards; ++id) {
    std::vector<std::string> argv = {
        bin_ + "/tether-server",
        "--shard-id",
        std::to_string(id),
        "--shards",
        std::to_string(o_.run.num_shards),
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        o_.data_dir + "/shard" + std::to_string(id)};
    if (id == 0) {
      argv.push_back("--http");
      argv.push_back(o_.http);
      // A resumed run's shard 0 takes the run-wide settings from its round,
      // except for those given now (refused there if they cannot change).
      const bool resuming = !o_.resume.empty();
      const bool manifest = !o_.manifest.empty();
      auto wanted = [this, resuming, manifest](const SettingField& f) {
        // From a manifest, every run-wide setting is the manifest's.
        if (manifest) return !f.flag.empty() && f.flag != "shards";
        return IsServerFlag(f) && f.flag != "shards" &&
               (!resuming || o_.given.count(std::string(f.flag)) > 0);
      };
      for (std::string& word :
           SettingFlags(o_.run, wanted, AtDefault::kWritten)) {
        argv.push_back(std::move(word));
      }
      if (!manifest && (!resuming || o_.given.count("staleness") > 0)) {
        argv.push_back("--max-staleness");
        argv.push_back(std::to_string(o_.staleness));
      }
      if (o_.http != "off") {
        argv.push_back("--http-token-file");
        argv.push_back(o_.http_token_file);
      }
      if (!o_.resume.empty()) {
        argv.push_back("--resume");
        argv.push_back(o_.resume);
      }
    } else {
      argv.push_back("--coordinator");
      argv.push_back(coordinator_);
    }
    if (!o_.replay.empty()) {
      argv.push_back("--replay");
      argv.push_back(o_.replay + "/shard" + std::to_string(id));
    }
    if (!o_.resume.empty() && o_.resumed_shards > 0 &&
        o_.resumed_shards != o_.run.num_shards) {
      // The round was written by the old shards into their dirs, which
      // stay where tether-up put them.
      std::string old_dirs;
      for (int k = 0; k < o_.resumed_shards; ++k) {
        old_dirs += (k ? "," : "") + o_.data_dir + "/shard" + std::to_string(k);
      }
      argv.push_back("--reshard-from");
      argv.push_back(old_dirs);
    }
    const std::string name = "shard " + std::to_string(id);
    const std::string base = o_.log_dir + "/shard" + std::to_string(id);
    argv.push_back("--ready-file");
    argv.push_back(base + ".ready");
    auto p = Process::Start(WithKey(argv), base + ".log");
    if (!p.ok()) return p.status().WithContext(name);
    shards_.push_back(std::move(*p));
    started_shards_.push_back({shards_.back()->pid(), base + ".log"});
    auto ready = shards_.back()->WaitForReady(base + ".ready", 15000);
    if (!ready.ok()) return Failed(*shards_.back(), name, "did not start");
    if (id == 0) {
      coordinator_ = ready->advertise;
      dashboard_ = ready->dashboard;
      if (o_.http != "off" && dashboard_.empty()) {
        return Failed(*shards_.back(), name, "served no dashboard");
      }
    }
  }
  return Status::Ok();
}

std::vector<std::string> Launcher::WorkerCommand() const {
  if (o_.python_model.empty()) {
    std::vector<std::string> argv = {bin_ + "/tether-worker", "--model",
                                     o_.model};
    if (!o_.hidden.empty()) {
      argv.push_back("--hidden");
      argv.push_back(o_.hidden);
    }
    return argv;
  }
  std::vector<std::string> argv = PythonCommand();
  for (const char* s : {"-m", "tether.worker", "--model"}) {
    argv.push_back(s);
  }
  argv.push_back(o_.python_model);
  if (!o_.model_args.empty()) {
    argv.push_back("--model-args");
    argv.push_back(o_.model_args);
  }
  return argv;
}

std::vector<std::string> Launcher::PythonCommand() const {
  // The package next to the binaries of a build tree (build/release/python);
  // an installed one is on Debian's python3 path already.
  std::vector<std::string> argv = {"/usr/bin/env"};
  if (std::filesystem::exists(bin_ + "/python/tether")) {
    const char* old = std::getenv("PYTHONPATH");
    argv.push_back("PYTHONPATH=" + bin_ + "/python" +
                   (old != nullptr && *old ? std::string(":") + old : ""));
  }
#ifdef TETHER_PYTHON
  argv.push_back(TETHER_PYTHON);  // the one the package was built for
#else
  argv.push_back("python3");
#endif
  return argv;
}

Status Launcher::StartWorkers() {
  if (!o_.manifest.empty()) return StartManifestWorkers();
  for (int r = 0; r < o_.run.num_workers; ++r) {
    const bool slow = r >= o_.run.num_workers - o_.slow;
    std::vector<std::string> argv = WorkerCommand();
    // Joining a running run: the coordinator gives each a free rank.
    const int rank = o_.join.empty() ? r : -1;
    for (const std::string& arg :
         {std::string("--coordinator"), coordinator_,
          std::string("--rank"),        std::to_string(rank),
          std::string("--staleness"),   std::to_string(o_.staleness),
          std::string("--data"),        o_.data,
          std::string("--epochs"),      std::to_string(o_.epochs),
          std::string("--batch"),       std::to_string(o_.batch),
          std::string("--threads"),     std::to_string(o_.threads),
          std::string("--chunk-rows"),  std::to_string(o_.chunk_rows),
          std::string("--eval-every"),  std::to_string(o_.eval_every),
          std::string("--wire-dtype"),  o_.wire_dtype,
          std::string("--quiet")}) {
      argv.push_back(arg);
    }
    if (o_.overlap_steps) argv.push_back("--overlap-steps");
    if (o_.prefetch_with_push) argv.push_back("--prefetch-with-push");
    if (!o_.eval_in_background) argv.push_back("--eval-in-background=false");
    if (slow) {
      argv.push_back("--slowdown");
      argv.push_back(NumberText(o_.slowdown));
    }
    if (r < o_.gpu_workers) {
      argv.push_back("--device");
      argv.push_back("cuda");
    }
    auto p = Process::Start(
        WithKey(argv), o_.log_dir + (o_.join.empty() ? "/worker" : "/joined") +
                           std::to_string(r) + ".log");
    if (!p.ok()) return p.status().WithContext("worker " + std::to_string(r));
    workers_.push_back(std::move(*p));
    started_workers_.push_back(
        {workers_.back()->pid(), workers_.back()->log_path()});
  }
  return Status::Ok();
}

Status Launcher::StartManifestWorkers() {
  for (size_t r = 0; r < o_.manifest_workers.size(); ++r) {
    std::vector<std::string> argv = o_.manifest_workers[r];
    if (argv.empty()) continue;
    // This build's tether-worker or tether package, pointed at this
    // cluster.
    if (std::filesystem::path(argv[0]).filename() == "tether-worker") {
      argv[0] = bin_ + "/tether-worker";
    } else if (argv.size() > 2 && argv[1] == "-m" &&
               argv[2] == "tether.worker") {
      std::vector<std::string> python = PythonCommand();
      argv.erase(argv.begin());
      argv.insert(argv.begin(), python.begin(), python.end());
    }
    argv.push_back("--coordinator");
    argv.push_back(coordinator_);
    auto p = Process::Start(
        WithKey(argv), o_.log_dir + "/worker" + std::to_string(r) + ".log");
    if (!p.ok()) return p.status().WithContext("worker " + std::to_string(r));
    workers_.push_back(std::move(*p));
    started_workers_.push_back(
        {workers_.back()->pid(), workers_.back()->log_path()});
  }
  return Status::Ok();
}

void Launcher::Poll(bool print, bool tty) {
  if (!observer_) {
    ClientOptions co;
    co.coordinator = coordinator_;
    co.observer = true;
    co.name = "tether-up";
    co.auth_key_file = o_.auth_key_file;
    co.tls = o_.tls;
    co.connect_timeout_ms = 2000;
    co.join_timeout_ms = 2000;
    auto c = Client::Connect(co);
    if (!c.ok()) return;  // the cluster may still be forming
    observer_ = std::move(*c);
  }
  auto stats = observer_->Stats();
  if (!stats.ok() || stats->empty()) return;
  const ShardStats& s0 = (*stats)[0];
  workers_in_run_ = 0;
  for (const auto& w : s0.workers) workers_in_run_ += w.connected && !w.left;
  std::string clocks, accuracy = "-";
  double loss = 0, rate = 0;
  int reported = 0;
  int epoch = INT_MAX;  // the least advanced worker's, from 1
  for (const auto& w : s0.workers) {
    clocks += (clocks.empty() ? "" : " ") + std::to_string(w.clock);
    // Reports count epochs from 0; tether-worker prints them from 1.
    if (w.samples > 0) epoch = std::min(epoch, w.epoch + 1);
    if (w.loss >= 0) {
      loss += w.loss;
      ++reported;
    }
    rate += w.samples_per_s;
    if (w.test_accuracy >= o_.target_accuracy && target_reached_s_ < 0) {
      target_reached_s_ =
          std::chrono::duration<double>(Clock::now() - start_).count();
    }
    if (w.test_accuracy >= 0) {
      char a[16];
      std::snprintf(a, sizeof a, "%.1f%%", 100.0 * w.test_accuracy);
      accuracy = a;
    }
  }
  if (!print) return;
  // No worker has reported a loss yet: "-", not a 0 nobody measured.
  char loss_text[32] = "-";
  if (reported > 0) {
    std::snprintf(loss_text, sizeof loss_text, "%.3f", loss / reported);
  }
  // "epoch 6/6" as tether-worker says it; "-" before the first report.
  const std::string epoch_text =
      (epoch == INT_MAX ? std::string("-") : std::to_string(epoch)) + "/" +
      std::to_string(o_.epochs);
  char line[512];
  std::snprintf(line, sizeof line,
                "%5.1f s  epoch %s  clocks [%s]  min %lld  loss %s  "
                "test acc %s  %.0f samples/s",
                std::chrono::duration<double>(Clock::now() - start_).count(),
                epoch_text.c_str(), clocks.c_str(),
                static_cast<long long>(s0.min_clock), loss_text,
                accuracy.c_str(), rate);
  std::printf(tty ? "\r%s   " : "%s\n", line);
  std::fflush(stdout);
}

Status Launcher::Watch() {
  const bool tty = isatty(STDOUT_FILENO);
  auto last_line = Clock::now() - std::chrono::hours(1);
  while (true) {
    if (g_interrupted) return Status(Code::kUnavailable, "interrupted");
    for (size_t i = 0; i < shards_.size(); ++i) {
      if (!shards_[i]->Running()) {
        return Failed(*shards_[i], "shard " + std::to_string(i), "exited");
      }
    }
    bool running = false;
    for (size_t r = 0; r < workers_.size(); ++r) {
      if (workers_[r]->Running()) {
        running = true;
        continue;
      }
      auto code = workers_[r]->Wait(0);
      if (code.ok() && *code != 0) {
        return Failed(*workers_[r], "worker " + std::to_string(r),
                      "failed (exit " + std::to_string(*code) + ")");
      }
    }
    // A line every 5 s when the output is a log, 4 times a second on a
    // terminal.
    auto every = tty ? std::chrono::milliseconds(250) : std::chrono::seconds(5);
    const bool print = Clock::now() - last_line >= every || !running;
    Poll(print, tty);
    if (print) last_line = Clock::now();
    // Workers another tether-up added (--join) may still be training.
    if (!running && o_.join.empty() && workers_in_run_ > 0 &&
        !shards_.empty()) {
      running = true;
    }
    if (!running) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  if (tty) std::printf("\n");
  return Status::Ok();
}

Status Launcher::Evaluate(double* accuracy) {
  if (o_.model == "sparse-lr") return Status::Ok();
  std::string output;
  std::vector<std::string> argv = WorkerCommand();
  for (const std::string& arg :
       {std::string("--coordinator"), coordinator_,
        std::string("--evaluate-only"), std::string("--test-data"), o_.data}) {
    argv.push_back(arg);
  }
  TETHER_ASSIGN_OR_RETURN(
      auto p, Process::Start(WithKey(argv), o_.log_dir + "/evaluate.log"));
  auto code = p->Wait(120000);
  if (!code.ok() || *code != 0) return Failed(*p, "evaluation", "failed");
  std::string log = p->Log();
  auto at = log.find("test accuracy ");
  if (at == std::string::npos) return Failed(*p, "evaluation", "said nothing");
  *accuracy = std::atof(log.c_str() + at + 14);
  return Status::Ok();
}

void Launcher::StopAll() {
  observer_.reset();
  for (auto& w : workers_) w->Signal(SIGTERM);
  for (auto& s : shards_) s->Signal(SIGTERM);
  for (auto& w : workers_) (void)w->Wait(3000);
  for (auto& s : shards_) (void)s->Wait(3000);
  workers_.clear();  // SIGKILL for anything still running
  shards_.clear();
}

int Launcher::Run() {
  std::string model = o_.python_model.empty() ? o_.model : o_.python_model;
  if (!o_.hidden.empty()) model += " " + o_.hidden;
  const std::string rows =
      o_.chunk_rows > 0 ? "chunks of " + std::to_string(o_.chunk_rows) + " rows"
                        : "fixed shares";
  std::printf(
      "tether-up: %d shards, %d workers (%d slowed %.1fx), staleness %d, "
      "model %s on %s, %d epochs, %s\nlogs: %s\n",
      o_.run.num_shards, o_.run.num_workers, o_.slow, o_.slowdown, o_.staleness,
      model.c_str(), o_.data.c_str(), o_.epochs, rows.c_str(),
      o_.log_dir.c_str());
  if (!WriteSummary("starting", nullptr).ok()) return 1;
  Status s = Status::Ok();
  if (o_.join.empty()) {
    s = StartShards();
  } else {
    coordinator_ = o_.join;
    std::printf("tether-up: adding %d workers to the run at %s\n",
                o_.run.num_workers, coordinator_.c_str());
  }
  if (s.ok()) {
    std::printf("coordinator: %s\n", coordinator_.c_str());
    if (!o_.join.empty()) {
      // The run's own tether-up serves its dashboard.
    } else if (!dashboard_.empty()) {
      std::printf("dashboard:   %s\n", dashboard_.c_str());
      std::printf("token:       in %s (for the dashboard's buttons)\n",
                  o_.http_token_file.c_str());
    } else {
      std::printf("dashboard:   off (--http off)\n");
    }
    if (!o_.resume.empty()) {
      // Shard 0 says which round it loaded (the newest complete one for
      // latest) and the clock the workers go on from.
      auto line = shards_[0]->WaitForLine("resuming from round", 30000);
      if (line.ok()) {
        std::printf("tether-up: %s\n",
                    line->substr(line->find("resuming from round")).c_str());
      }
    }
    std::fflush(stdout);
    s = StartWorkers();
  }
  if (s.ok()) (void)WriteSummary("running", nullptr);
  if (s.ok()) s = Watch();
  const int64_t stopped_at = s.ok() ? StoppedAtClock() : -1;
  double accuracy = -1;
  // The run's own tether-up evaluates it.
  if (s.ok() && o_.join.empty()) s = Evaluate(&accuracy);
  const int64_t stopped_round = stopped_at >= 0 ? LastCompleteRound() : -1;
  double secs = std::chrono::duration<double>(Clock::now() - start_).count();
  if (!s.ok() || o_.linger_s == 0) StopAll();
  Outcome outcome;
  outcome.seconds = secs;
  if (!s.ok()) {
    std::fprintf(stderr, "\ntether-up: %s\n", s.message().c_str());
    std::fprintf(stderr, "tether-up: stopped every process; logs in %s\n",
                 o_.log_dir.c_str());
    outcome.exit_code = g_interrupted ? 130 : 1;
    outcome.error = s.message();
    (void)WriteSummary("exited", &outcome);
    return outcome.exit_code;
  }
  // A stopped run did what it was told: no target to miss.
  const bool reached =
      stopped_at >= 0 || accuracy < 0 || accuracy >= o_.target_accuracy;
  outcome.exit_code = reached ? 0 : 1;
  outcome.accuracy = accuracy;
  outcome.stopped_at = stopped_at;
  outcome.round = stopped_round;
  if (stopped_at >= 0) {
    PrintStopped(stopped_at, stopped_round, accuracy, secs);
  } else if (accuracy < 0) {
    std::printf("tether-up: done in %.1f s\n", secs);
  } else {
    PrintResult(accuracy, secs);
  }
  if (o_.linger_s != 0 && !g_interrupted) {
    std::string until = o_.linger_s < 0
                            ? std::string("until Ctrl-C")
                            : "for " + std::to_string(int(o_.linger_s)) +
                                  " s (Ctrl-C stops them sooner)";
    (void)WriteSummary("lingering", &outcome);
    std::printf("tether-up: training done; the shards%s stay up %s\n",
                dashboard_.empty() ? "" : (" and " + dashboard_).c_str(),
                until.c_str());
    std::fflush(stdout);
    const auto end =
        Clock::now() +
        std::chrono::milliseconds(static_cast<int64_t>(o_.linger_s * 1000));
    while (!g_interrupted && (o_.linger_s < 0 || Clock::now() < end)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    StopAll();
  }
  (void)WriteSummary("exited", &outcome);
  return outcome.exit_code;
}

boost::json::object Launcher::ResultJson(const Outcome& outcome) const {
  boost::json::object result;
  result["exit_code"] = outcome.exit_code;
  result["error"] = nullptr;
  if (!outcome.error.empty()) result["error"] = outcome.error;
  result["seconds"] = outcome.seconds;
  // null: not measured (sparse-lr, or a failed run), or not stopped.
  result["accuracy"] = nullptr;
  result["target_accuracy"] = o_.target_accuracy;
  result["reached_target"] = nullptr;
  if (outcome.accuracy >= 0) {
    result["accuracy"] = outcome.accuracy;
    result["reached_target"] = outcome.accuracy >= o_.target_accuracy;
  }
  result["stopped_at_clock"] = nullptr;
  result["stopped_round"] = nullptr;
  if (outcome.stopped_at >= 0) {
    result["stopped_at_clock"] = outcome.stopped_at;
    if (outcome.round >= 0) result["stopped_round"] = outcome.round;
  }
  return result;
}

Status Launcher::WriteSummary(const char* state, const Outcome* outcome) const {
  if (o_.summary_file.empty()) return Status::Ok();
  namespace json = boost::json;
  auto text_or_null = [](const std::string& text) -> json::value {
    if (text.empty()) return nullptr;
    return json::value(text);
  };
  auto list = [](const std::vector<Started>& started) {
    json::array list;
    for (const Started& p : started) {
      json::object process;
      process["pid"] = p.pid;
      process["log"] = p.log;
      list.push_back(std::move(process));
    }
    return list;
  };
  json::object summary;
  summary["state"] = state;
  summary["pid"] = getpid();
  summary["coordinator"] = text_or_null(coordinator_);
  summary["dashboard"] = text_or_null(dashboard_);
  summary["token_file"] =
      text_or_null(dashboard_.empty() ? "" : o_.http_token_file);
  summary["log_dir"] = o_.log_dir;
  summary["data_dir"] = o_.data_dir;
  summary["shards"] = list(started_shards_);
  summary["workers"] = list(started_workers_);
  summary["result"] = nullptr;
  if (outcome != nullptr) summary["result"] = ResultJson(*outcome);
  Status s =
      WriteFileAtomically(o_.summary_file, json::serialize(summary) + "\n");
  if (!s.ok()) {
    std::fprintf(stderr, "tether-up: --summary-file: %s\n",
                 s.message().c_str());
  }
  return s;
}

int64_t Launcher::StoppedAtClock() const {
  int64_t clock = -1;
  constexpr std::string_view kSaid = "stopping at clock ";
  for (const auto& w : workers_) {
    const std::string log = w->Log();
    if (auto at = log.find(kSaid); at != std::string::npos) {
      clock =
          std::max<int64_t>(clock, std::atoll(log.c_str() + at + kSaid.size()));
    }
  }
  return clock;
}

int64_t Launcher::LastCompleteRound() const {
  // Shard 0 logs each round it completes.
  const std::string log = shards_.empty() ? "" : shards_[0]->Log();
  constexpr std::string_view kRound = "checkpoint round ";
  int64_t round = -1;
  for (size_t at = log.find(kRound); at != std::string::npos;
       at = log.find(kRound, at + 1)) {
    const std::string line = log.substr(at, log.find('\n', at) - at);
    if (line.find(" complete") != std::string::npos) {
      round = std::atoll(line.c_str() + kRound.size());
    }
  }
  return round;
}

void Launcher::PrintStopped(int64_t clock, int64_t round, double accuracy,
                            double secs) {
  std::printf("tether-up: the run was stopped at clock %lld after %.1f s",
              static_cast<long long>(clock), secs);
  if (accuracy >= 0) std::printf(" (test accuracy %.2f%%)", 100 * accuracy);
  std::printf("\n");
  if (round >= 0) {
    std::printf(
        "tether-up: checkpoint round %lld holds it; resume with:\n"
        "  tether-up --data-dir %s --resume latest\n",
        static_cast<long long>(round), o_.data_dir.c_str());
  } else {
    std::printf("tether-up: no checkpoint round holds it\n");
  }
  std::fflush(stdout);
}

void Launcher::PrintResult(double accuracy, double secs) {
  const bool reached = accuracy >= o_.target_accuracy;
  std::printf(
      "tether-up: test accuracy %.2f%% after %.1f s: %s the %.0f%% "
      "target\n",
      100 * accuracy, secs, reached ? "reached" : "MISSED",
      100 * o_.target_accuracy);
  if (target_reached_s_ >= 0) {
    std::printf("tether-up: rank 0 first measured %.0f%% at %.1f s\n",
                100 * o_.target_accuracy, target_reached_s_);
  }
  std::fflush(stdout);
}

constexpr const char* kSummary =
    "Starts a local tether cluster: shards and workers as real\n"
    "processes on 127.0.0.1, some workers slowed down as\n"
    "stragglers. Shows progress; Ctrl-C stops everything.";

void BindFlags(FlagParser& p, UpOptions& o) {
  BindSettingFlags(p, &o.run, IsServerFlag);
  p.AddInt("slow", &o.slow, "how many workers (the last ranks) are slowed");
  p.AddDouble("slowdown", &o.slowdown, "how many times slower they are");
  p.AddInt("staleness", &o.staleness, "SSP bound (0 BSP, -1 async)");
  p.AddString("model", &o.model, "softmax, mlp or sparse-lr");
  p.AddString("hidden", &o.hidden,
              "--model mlp: its hidden layer widths, e.g. 512,256 "
              "(tether-worker --hidden); default: the worker's, 256,128");
  p.AddString("python-model", &o.python_model,
              "FILE.py:CLASS: workers train this PyTorch module with "
              "`python3 -m tether.worker` (the tether package)");
  p.AddString("model-args", &o.model_args,
              "JSON keyword arguments for --python-model's class");
  p.AddString("data", &o.data, "fashion-mnist, IMAGES,LABELS, or LIBSVM");
  p.AddInt("epochs", &o.epochs, "epochs per worker");
  p.AddInt("batch", &o.batch, "batch size");
  p.AddDouble("target-accuracy", &o.target_accuracy,
              "test accuracy the run must reach to exit 0");
  p.AddInt("threads", &o.threads, "compute threads per worker");
  p.AddInt("chunk-rows", &o.chunk_rows,
           "workers take chunks of N rows of each epoch from shard 0 (the "
           "fast train a straggler's rows); 0: fixed shares; -1: chunks of "
           "2000 when a worker is slowed (--slow, --slowdown > 1) and the "
           "model is built in (mlp, softmax), fixed shares otherwise");
  p.AddInt("eval-every", &o.eval_every,
           "rank 0 evaluates on the test set every K clocks (when the run "
           "first reaches --target-accuracy); 0: only at the end");
  p.AddInt("gpu-workers", &o.gpu_workers,
           "how many workers (the first ranks) compute on the GPU "
           "(--device cuda)");
  p.AddString("wire-dtype", &o.wire_dtype,
              "f32, bf16 or int8: workers push gradients and pull weights "
              "as bfloat16 (half the bytes) or int8 (about a quarter); the "
              "shards keep f32");
  p.AddBool("overlap-steps", &o.overlap_steps,
            "workers overlap steps (tether-worker and python3 -m "
            "tether.worker --overlap-steps; with --staleness other than 0)");
  p.AddBool("prefetch-with-push", &o.prefetch_with_push,
            "workers ask for each layer's next weights right behind its "
            "gradients (tether-worker --prefetch-with-push; for slow links; "
            "not with --python-model)");
  p.AddBool("eval-in-background", &o.eval_in_background,
            "rank 0 evaluates on a copy of the weights while it trains on "
            "(tether-worker and python3 -m tether.worker "
            "--eval-in-background); =false: the run waits for each "
            "evaluation");
  p.AddString("log-dir", &o.log_dir, "where logs go (default: a new /tmp dir)");
  p.AddString("data-dir", &o.data_dir,
              "shards keep checkpoints in DIR/shard0, DIR/shard1, ... "
              "(default: the log dir)");
  p.AddString("join", &o.join,
              "HOST:PORT of a running run's coordinator (another tether-up's): "
              "add --workers workers to it, with this command's worker flags, "
              "instead of starting a cluster");
  p.AddString("resume", &o.resume,
              "resume from a complete round in --data-dir: latest or a "
              "round number");
  p.AddString("manifest", &o.manifest,
              "FILE: start a new run from a run manifest (a run's "
              "DATA_DIR/manifest.json, or one `tether-ckpt show "
              "--manifest-out` wrote from a round): its run-wide settings and "
              "every worker as it was started; data files must be unchanged");
  p.AddString("replay", &o.replay,
              "DIR: the --data-dir of a run made with --record: start it "
              "again with its flags (those given now on top: --slow, "
              "--slowdown) and have every shard take pushes and pulls in "
              "the recorded order, so that it ends bit-identical; with "
              "--resume ROUND, from that round (copied into --data-dir)");
  p.AddString("http", &o.http,
              "HOST:PORT of the live dashboard (shard 0; port 0: any free "
              "port; off: none)");
  p.AddDouble("linger", &o.linger_s,
              "after training, keep the shards and the dashboard up this "
              "many seconds; -1: until Ctrl-C");
  p.AddString("auth-key-file", &o.auth_key_file,
              "the run's shared key, given to every shard and worker");
  BindTlsFlags(p, &o.tls);
  p.AddString("http-token-file", &o.http_token_file,
              "the dashboard's token for POST endpoints (created when "
              "missing; default: LOG_DIR/dashboard.token)");
  p.AddString("summary-file", &o.summary_file,
              "write this JSON file (whole, by rename) as the run starts, "
              "once its processes run, and when it ends: coordinator, "
              "dashboard, log dir, pids, then the result");
}

// --resume: the run's flags come from DATA_DIR/tether-up.flags (written when
// the run started), those given now on top. A given identity flag that
// differs is refused, naming it; --shards and --workers may differ (the
// shards then reshard the round). --replay: the same, from the recorded
// run's DATA_DIR. Returns an exit code on error.
std::optional<int> TakeSavedFlags(int argc, char** argv,
                                  const FlagParser& given, UpOptions* o) {
  for (const RunFlag& f : RunFlags()) {
    if (given.WasSet(f.name)) o->given.insert(f.name);
  }
  const std::string path =
      o->replay.empty() ? SavedFlagsPath(*o) : o->replay + "/tether-up.flags";
  std::ifstream in(path);
  if (!in) {
    // Not a run tether-up started: the flags given are all there is, and
    // shard 0 checks the counts against its round.
    std::cerr << "tether-up: --resume: no " << path
              << " (the run was not started by tether-up): using the flags "
                 "given, defaults for the rest\n";
    o->given.insert("workers");
    o->given.insert("shards");
    return std::nullopt;
  }
  std::vector<std::string> args = {"tether-up"};
  for (std::string line; std::getline(in, line);) args.push_back(line);
  std::vector<const char*> saved_argv;
  for (const std::string& a : args) saved_argv.push_back(a.c_str());
  UpOptions saved = *o;
  FlagParser q("tether-up", kSummary);
  BindFlags(q, saved);
  if (Status st =
          q.Parse(static_cast<int>(saved_argv.size()), saved_argv.data());
      !st.ok()) {
    std::cerr << "tether-up: --resume: " << path << ": " << st.message()
              << "\n";
    return 1;
  }
  for (const RunFlag& f : RunFlags()) {
    if (!f.identity || !given.WasSet(f.name)) continue;
    if (f.text(saved) != f.text(*o)) {
      std::cerr << "tether-up: --resume: --" << f.name << " " << f.text(saved)
                << " in the run (" << path << "), " << f.text(*o)
                << " now: a resumed run keeps it; leave --" << f.name
                << " out\n";
      return 2;
    }
  }
  // The saved flags, then the command line's over them.
  UpOptions merged = saved;
  FlagParser again("tether-up", kSummary);
  BindFlags(again, merged);
  if (Status st = again.Parse(argc, argv); !st.ok()) {
    std::cerr << "tether-up: " << st.message() << "\n";
    return 2;
  }
  merged.given = o->given;
  merged.resumed_shards = saved.run.num_shards;
  if (merged.run.num_shards != saved.run.num_shards) {
    std::cerr << "tether-up: --resume: --shards " << merged.run.num_shards
              << " now, " << saved.run.num_shards << " in the run (" << path
              << "): every shard loads its part of the round from "
              << o->data_dir << "/shard0.." << saved.run.num_shards - 1 << "\n";
  }
  *o = merged;
  return std::nullopt;
}

// --manifest FILE: the run-wide settings and every worker's argv from a run
// manifest (a run's DATA_DIR/manifest.json, or `tether-ckpt show
// --manifest-out`). Each worker's data files must still have the SHA-256
// the manifest says. Returns an exit code on error.
std::optional<int> TakeManifest(UpOptions* o) {
  const std::string where = "tether-up: --manifest " + o->manifest + ": ";
  std::ifstream in(o->manifest);
  if (!in) {
    std::cerr << where << "cannot read it\n";
    return 2;
  }
  const std::string text((std::istreambuf_iterator<char>(in)),
                         std::istreambuf_iterator<char>());
  boost::system::error_code ec;
  const boost::json::value v = boost::json::parse(text, ec);
  const boost::json::object* m = ec ? nullptr : v.if_object();
  const boost::json::value* run = m ? m->if_contains("run") : nullptr;
  const boost::json::value* workers = m ? m->if_contains("workers") : nullptr;
  if (run == nullptr || workers == nullptr || !workers->is_array()) {
    std::cerr << where
              << "not a run manifest (expected a JSON object with \"run\" "
                 "and \"workers\")\n";
    return 2;
  }
  Result<RunSettings> settings = checkpoint::SettingsFromJson(*run);
  if (!settings.ok()) {
    std::cerr << where << settings.status().message() << "\n";
    return 2;
  }
  o->run = *settings;
  o->run.run_id.clear();     // a new run
  o->run.resume_round = -1;  // from the start
  o->slow = 0;               // each worker keeps its own --slowdown
  o->manifest_workers.clear();
  int rank = 0;
  for (const boost::json::value& w : workers->as_array()) {
    std::vector<std::string>& argv = o->manifest_workers.emplace_back();
    const std::string who = "worker " + std::to_string(rank++);
    const boost::json::object* part = w.if_object();
    const boost::json::value* args = part ? part->if_contains("argv") : nullptr;
    if (args == nullptr || !args->is_array() || args->as_array().empty()) {
      std::cerr << where << who
                << " has no argv (not known when the manifest was taken, or "
                   "not a tether worker): not started\n";
      continue;
    }
    // Its flags, less those that tie it to the old cluster.
    static const std::set<std::string> kOwnedByTheRun = {
        "--coordinator", "--auth-key-file", "--tls-cert", "--tls-key",
        "--tls-ca"};
    const boost::json::array& a = args->as_array();
    for (size_t i = 0; i < a.size(); ++i) {
      if (!a[i].is_string()) continue;
      const std::string arg(a[i].get_string());
      const std::string name = arg.substr(0, arg.find('='));
      if (kOwnedByTheRun.count(name) > 0) {
        if (arg.find('=') == std::string::npos) ++i;  // and its value
        continue;
      }
      argv.push_back(arg);
    }
    // What tether-up says about the run (its banner, its epochs) follows
    // the first worker's settings.
    if (const boost::json::value* s = part->if_contains("settings");
        o->manifest_workers.size() == 1 && s != nullptr && s->is_object()) {
      const boost::json::object& ws = s->as_object();
      auto number = [&ws](const char* key, auto* out) {
        if (const boost::json::value* f = ws.if_contains(key);
            f != nullptr && f->is_number()) {
          *out = f->to_number<std::remove_pointer_t<decltype(out)>>();
        }
      };
      auto text = [&ws](const char* key, std::string* out) {
        if (const boost::json::value* f = ws.if_contains(key);
            f != nullptr && f->is_string()) {
          *out = std::string(f->get_string());
        }
      };
      number("staleness", &o->staleness);
      number("epochs", &o->epochs);
      number("batch", &o->batch);
      number("threads", &o->threads);
      number("chunk_rows", &o->chunk_rows);
      number("eval_every", &o->eval_every);
      text("model", &o->model);
      text("hidden", &o->hidden);
      text("data", &o->data);
    }
    const boost::json::value* files = part->if_contains("data_files");
    if (files == nullptr || !files->is_array()) continue;
    for (const boost::json::value& f : files->as_array()) {
      const boost::json::object* file = f.if_object();
      if (file == nullptr || !file->contains("sha256")) continue;
      const std::string path(file->at("path").as_string());
      const std::string then(file->at("sha256").as_string());
      Result<FileDigest> now = Sha256File(path);
      if (!now.ok()) {
        std::cerr << where << who << "'s data file: " << now.status().message()
                  << "\n";
        return 1;
      }
      if (now->sha256 != then) {
        std::cerr << where << who << "'s data file " << path
                  << " has changed since the run (sha256 " << then << " then, "
                  << now->sha256 << " now)\n";
        return 1;
      }
    }
  }
  return std::nullopt;
}

// Keeps the run's flags in DATA_DIR/tether-up.flags for a later --resume.
void SaveFlags(const UpOptions& o) {
  const std::string path = SavedFlagsPath(o);
  std::error_code ec;
  std::filesystem::create_directories(o.data_dir, ec);
  std::ofstream out(path + ".tmp", std::ios::trunc);
  for (const RunFlag& f : RunFlags()) {
    // --NAME=VALUE: a boolean flag takes its value only so.
    out << "--" << f.name << "=" << f.text(o) << "\n";
  }
  out.close();
  if (!out) {
    std::cerr << "tether-up: cannot write " << path
              << ": --resume will need this run's flags again\n";
    return;
  }
  std::filesystem::rename(path + ".tmp", path, ec);
}

int Main(int argc, char** argv) {
  DieWithLauncher();  // when started by a launcher of its own (the tests)
  UpOptions o;
  FlagParser p("tether-up", kSummary);
  BindFlags(p, o);
  if (auto exit_code = p.ParseForMain(argc, argv)) return *exit_code;
  if (Status tls = CheckTlsOptions(o.tls); !tls.ok()) {
    std::cerr << "tether-up: " << tls.message() << "\n";
    return 2;
  }
  if (!o.join.empty() && !o.resume.empty()) {
    std::cerr << "tether-up: --join adds workers to a running run; --resume "
                 "starts one: give one of them\n";
    return 2;
  }
  if (!o.replay.empty() && !std::filesystem::is_directory(o.replay)) {
    std::cerr << "tether-up: --replay " << o.replay
              << ": no such directory, so no run to replay\n";
    return 2;
  }
  if (!o.replay.empty() && !o.resume.empty() && !o.data_dir.empty() &&
      !std::filesystem::exists(o.data_dir + "/shard0")) {
    // The replay from a round resumes a copy: the recorded run stays whole.
    std::error_code ec;
    std::filesystem::create_directories(o.data_dir, ec);
    for (const auto& entry : std::filesystem::directory_iterator(o.replay)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("shard", 0) != 0 || !entry.is_directory()) continue;
      std::filesystem::copy(entry.path(), o.data_dir + "/" + name,
                            std::filesystem::copy_options::recursive, ec);
      if (ec) {
        std::cerr << "tether-up: --replay: cannot copy " << entry.path()
                  << " into --data-dir " << o.data_dir << ": " << ec.message()
                  << "\n";
        return 1;
      }
    }
  }
  if (!o.resume.empty() && o.data_dir.empty()) {
    std::cerr << "tether-up: --resume needs --data-dir (the directory of the "
                 "run to resume"
              << (o.replay.empty()
                      ? ""
                      : "; with --replay, a new one the round is copied into")
              << ")\n";
    return 2;
  }
  if (!o.resume.empty() && !std::filesystem::is_directory(o.data_dir)) {
    std::cerr << "tether-up: --data-dir " << o.data_dir
              << ": no such directory, so no run to resume\n";
    return 2;
  }
  if (o.log_dir.empty()) {
    char pattern[] = "/tmp/tether-up-XXXXXX";
    if (mkdtemp(pattern) == nullptr) {
      std::cerr << "tether-up: cannot create a log directory in /tmp\n";
      return 1;
    }
    o.log_dir = pattern;
  } else {
    std::error_code ec;
    std::filesystem::create_directories(o.log_dir, ec);
    if (ec) {
      std::cerr << "tether-up: --log-dir: cannot create " << o.log_dir << ": "
                << ec.message() << "\n";
      return 1;
    }
  }
  if (o.data_dir.empty()) o.data_dir = o.log_dir;
  if (o.http_token_file.empty()) {
    o.http_token_file = o.log_dir + "/dashboard.token";
  }
  if (!o.replay.empty()) {
    std::error_code ec;
    if (std::filesystem::equivalent(o.replay, o.data_dir, ec)) {
      std::cerr << "tether-up: --replay " << o.replay
                << ": give another --data-dir: a replay must not write over "
                   "the recorded run\n";
      return 2;
    }
  }
  if (!o.manifest.empty() &&
      (!o.resume.empty() || !o.replay.empty() || !o.join.empty())) {
    std::cerr << "tether-up: --manifest starts a new run: not with --resume, "
                 "--replay or --join\n";
    return 2;
  }
  if (!o.resume.empty() || !o.replay.empty()) {
    if (auto exit_code = TakeSavedFlags(argc, argv, p, &o)) return *exit_code;
  }
  if (!o.manifest.empty()) {
    if (auto exit_code = TakeManifest(&o)) return *exit_code;
  }
  const int workers = o.run.num_workers;
  if (o.run.num_shards < 1 || workers < 1 || o.slow < 0 || o.slow > workers ||
      o.slowdown < 1 || o.gpu_workers < 0 || o.gpu_workers > workers) {
    std::cerr << "tether-up: need --shards >= 1, --workers >= 1, 0 <= --slow "
                 "<= --workers, --slowdown >= 1, 0 <= --gpu-workers <= "
                 "--workers\n";
    return 2;
  }
  if (auto dtype = tether::ParseWireDtype(o.wire_dtype, "--wire-dtype");
      !dtype.ok()) {
    std::cerr << "tether-up: " << dtype.status().message() << "\n";
    return 2;
  }
  if (!o.hidden.empty()) {
    Status widths = tether::ParseWidths(o.hidden, "--hidden").status();
    if (widths.ok() && (o.model != "mlp" || !o.python_model.empty())) {
      widths = InvalidArgument(
          "--hidden: sets the widths of --model mlp, not of " +
          (o.python_model.empty() ? "--model " + o.model
                                  : "--python-model " + o.python_model));
    }
    if (!widths.ok()) {
      std::cerr << "tether-up: " << widths.message() << "\n";
      return 2;
    }
  }
  if (o.chunk_rows < -1) {
    std::cerr << "tether-up: --chunk-rows " << o.chunk_rows
              << ": need N >= 0 rows, or -1 (chunks when a worker is "
                 "slowed)\n";
    return 2;
  }
  if (o.chunk_rows == -1) {
    // Built-in dense models only: sparse-lr streams its LIBSVM file; a
    // chunked run of Python workers was seen to stall for half a minute
    // at its end (issue 20's note), so they keep fixed shares unless told.
    o.chunk_rows = o.slow > 0 && o.slowdown > 1 && o.model != "sparse-lr" &&
                           o.python_model.empty()
                       ? kAutoChunkRows
                       : 0;
  }
  if (o.join.empty()) SaveFlags(o);
  InitLogging("tether-up", LogLevel::kError);
  struct sigaction sa {};
  sa.sa_handler = [](int) { g_interrupted = true; };
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  return Launcher(o).Run();
}

}  // namespace
}  // namespace tether

int main(int argc, char** argv) { return tether::Main(argc, argv); }

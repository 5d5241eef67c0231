// End to end with real processes: workers training on Fashion-MNIST (the
// Debian package dataset-fashion-mnist) and on generated sparse data.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <boost/json.hpp>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "tests/support/cluster.h"
#include "tests/support/worker_pool.h"
#include "tools/http_client.h"
#include "tools/process.h"

namespace tether::testing {
namespace {

namespace json = boost::json;

// Whether `pid` is a live process: not gone, and not a zombie (an orphan's
// stays one where pid 1 does not reap).
bool Runs(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return false;
  const size_t name_end = stat.rfind(") ");
  return name_end != std::string::npos && stat[name_end + 2] != 'Z';
}

// tether-up's --summary-file, parsed; null when missing or not JSON.
json::value ReadSummary(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  boost::system::error_code ec;
  json::value v = json::parse(text.str(), ec);
  return ec ? json::value(nullptr) : v;
}

// Waits until tether-up's summary says its processes run; null otherwise.
json::value WaitForRunning(const std::string& path, int timeout_ms) {
  json::value summary;
  Eventually(
      [&] {
        summary = ReadSummary(path);
        return summary.is_object() && summary.at("state") == "running";
      },
      timeout_ms);
  return summary.is_object() && summary.at("state") == "running" ? summary
                                                                 : nullptr;
}

void ExpectAllSucceed(std::vector<std::unique_ptr<Process>>& workers) {
  for (size_t r = 0; r < workers.size(); ++r) {
    auto code = workers[r]->Wait(240000);
    ASSERT_TRUE(code.ok()) << code.status().ToString();
    EXPECT_EQ(*code, 0) << "worker " << r << ":\n"
                        << Tail(workers[r]->Log(), 10);
  }
}

// Three epochs: the final weights of a two-epoch run measured 83-85% here
// and once 80.9% on a loaded CI machine (85.6% a few clocks before), too
// close to the 82% target to tell a broken launcher from noise.
TEST(Training, LauncherRunReachesStatedAccuracyOnFashionMnist) {
  TempDir dir;
  std::string output;
  const std::string summary_file = dir.path() + "/summary.json";
  auto code = RunToExit(
      {TETHER_UP_BIN, "--http",     "127.0.0.1:0", "--shards",
       "2",           "--workers",  "3",           "--slow",
       "1",           "--slowdown", kSlowdown,     "--staleness",
       "2",           "--epochs",   "3",           "--target-accuracy",
       "0.82",        "--log-dir",  dir.path(),    "--summary-file",
       summary_file},
      &output, 240000);
  ASSERT_TRUE(code.ok()) << code.status().ToString();
  EXPECT_EQ(*code, 0) << output;
  EXPECT_NE(output.find("reached the 82% target"), std::string::npos) << output;
  // The summary says the same for a script: where the run was, its
  // processes, and how it ended.
  const json::value summary = ReadSummary(summary_file);
  ASSERT_TRUE(summary.is_object()) << summary_file;
  EXPECT_EQ(summary.at("state"), "exited") << summary;
  const std::string coordinator(summary.at("coordinator").as_string());
  EXPECT_NE(output.find("coordinator: " + coordinator + "\n"),
            std::string::npos)
      << summary;
  const std::string dashboard(summary.at("dashboard").as_string());
  EXPECT_EQ(dashboard.rfind("http://127.0.0.1:", 0), 0u) << summary;
  EXPECT_NE(output.find("dashboard:   " + dashboard), std::string::npos)
      << summary;
  EXPECT_EQ(summary.at("log_dir"), dir.path().c_str());
  ASSERT_EQ(summary.at("shards").as_array().size(), 2u) << summary;
  ASSERT_EQ(summary.at("workers").as_array().size(), 3u) << summary;
  EXPECT_EQ(summary.at("shards").at(1).at("log"),
            (dir.path() + "/shard1.log").c_str());
  EXPECT_GT(summary.at("workers").at(2).at("pid").to_number<int>(), 0);
  const json::value& result = summary.at("result");
  ASSERT_TRUE(result.is_object()) << summary;
  EXPECT_EQ(result.at("exit_code"), 0);
  EXPECT_TRUE(result.at("error").is_null()) << summary;
  EXPECT_EQ(result.at("reached_target"), true);
  const double accuracy = result.at("accuracy").to_number<double>();
  EXPECT_GE(accuracy, 0.82);
  char printed[64];
  std::snprintf(printed, sizeof printed, "test accuracy %.2f%%",
                100 * accuracy);
  EXPECT_NE(output.find(printed), std::string::npos) << summary;
  EXPECT_TRUE(result.at("stopped_at_clock").is_null()) << summary;
  // Before any worker reports, the loss is "-", not a made-up 0 (the
  // first line comes as the workers start).
  EXPECT_EQ(output.find("loss 0.000"), std::string::npos) << output;
  // The launcher leaves no process behind.
  std::string ps;
  ASSERT_TRUE(RunToExit({"/usr/bin/pgrep", "-f", dir.path()}, &ps, 5000).ok());
  EXPECT_EQ(ps, "") << "still running: " << ps;
}

// tether-up `mode` (--overlap-steps, --prefetch-with-push) on 2 shards and
// 3 workers (one slowed by kSlowdown) at s = 2, with `more` flags: every
// worker is started with it, the run keeps the flag for a resume, and
// still reaches 80% (lower than the plain run's target: overlapped steps
// cost accuracy per epoch). `worker_args`: sequences each worker's command
// line must also have; `kept`: lines the kept flags must also have.
void ExpectLauncherRunReaches80Percent(
    const std::string& mode, const std::vector<std::string>& more,
    const std::vector<std::vector<std::string>>& worker_args,
    const std::vector<std::string>& kept = {}) {
  TempDir dir;
  const std::string summary_file = dir.path() + "/summary.json";
  std::vector<std::string> argv = {TETHER_UP_BIN,
                                   "--http",
                                   "127.0.0.1:0",
                                   "--shards",
                                   "2",
                                   "--workers",
                                   "3",
                                   "--slow",
                                   "1",
                                   "--slowdown",
                                   kSlowdown,
                                   "--staleness",
                                   "2",
                                   "--target-accuracy",
                                   "0.8",
                                   mode,
                                   "--log-dir",
                                   dir.path(),
                                   "--summary-file",
                                   summary_file};
  argv.insert(argv.end(), more.begin(), more.end());
  auto up = Process::Start(argv, dir.path() + "/up.out");
  ASSERT_TRUE(up.ok()) << up.status().ToString();
  const json::value running = WaitForRunning(summary_file, 60000);
  ASSERT_TRUE(running.is_object()) << (*up)->Log();
  int asked = 0;
  for (const auto& w : running.at("workers").as_array()) {
    const int pid = w.at("pid").to_number<int>();
    bool has_all = CommandLineHas(pid, {mode});
    for (const auto& args : worker_args) {
      has_all = has_all && CommandLineHas(pid, args);
    }
    asked += has_all;
  }
  EXPECT_EQ(asked, 3) << running;
  auto code = (*up)->Wait(240000);
  ASSERT_TRUE(code.ok()) << code.status().ToString();
  const std::string out = (*up)->Log();
  EXPECT_EQ(*code, 0) << out;
  EXPECT_NE(out.find("reached the 80% target"), std::string::npos) << out;
  std::ifstream saved(dir.path() + "/tether-up.flags");
  std::stringstream flags;
  flags << saved.rdbuf();
  EXPECT_NE(flags.str().find(mode + "=true\n"), std::string::npos)
      << flags.str();
  for (const std::string& line : kept) {
    EXPECT_NE(flags.str().find(line + "\n"), std::string::npos)
        << line << " not in:\n"
        << flags.str();
  }
}

// Four epochs, as the Python workers' test: the final weights of a run
// with overlapped steps were once 79.8% after two (under TSan) and once
// 79.85% after three (the release suite, cores shared with other tests),
// each time though 80% had been measured mid-run; quiet runs end at 85-86%.
// Rank 0 evaluates in the foreground here (--eval-in-background=false
// reaches every worker and is kept too).
TEST(Training, LauncherOverlapStepsReachesEveryWorkerAndTheTarget) {
  ExpectLauncherRunReaches80Percent(
      "--overlap-steps", {"--epochs", "4", "--eval-in-background=false"},
      {{"--model", "mlp"}, {"--eval-in-background=false"}},
      {"--eval-in-background=false"});
}

// With --hidden too: every worker trains an MLP of those widths.
TEST(Training, LauncherPrefetchWithPushReachesEveryWorkerAndTheTarget) {
  ExpectLauncherRunReaches80Percent("--prefetch-with-push",
                                    {"--epochs", "3", "--hidden", "128,64"},
                                    {{"--model", "mlp", "--hidden", "128,64"}});
}

// A bad --hidden, or one for a model without hidden layers, is refused
// before anything starts, naming the flag.
TEST(Training, LauncherRefusesHiddenWidthsItCannotUse) {
  struct Case {
    std::vector<std::string> flags;
    std::string says;
  };
  for (const Case& c : std::vector<Case>{
           {{"--hidden", "128,0"},
            "--hidden: expected widths like 256,128, got '128,0'"},
           {{"--hidden", "64", "--model", "softmax"},
            "--hidden: sets the widths of --model mlp, not of --model "
            "softmax"}}) {
    std::vector<std::string> argv = {TETHER_UP_BIN};
    argv.insert(argv.end(), c.flags.begin(), c.flags.end());
    std::string output;
    auto code = RunToExit(argv, &output, 10000);
    ASSERT_TRUE(code.ok()) << code.status().ToString();
    EXPECT_EQ(*code, 2) << output;
    EXPECT_NE(output.find(c.says), std::string::npos) << output;
  }
}

#ifdef TETHER_PYTHON_TEST_MODEL
// The same two with python3 -m tether.worker workers (--python-model: a
// linear classifier, 4 epochs). Builds without the Python package (the
// sanitizer presets) do not have this test. Its rank 0 evaluates in the
// foreground too.
TEST(Training, LauncherOverlapStepsReachesPythonWorkersAndTheTarget) {
  ExpectLauncherRunReaches80Percent(
      "--overlap-steps",
      {"--epochs", "4", "--python-model", TETHER_PYTHON_TEST_MODEL,
       "--eval-in-background=false"},
      {{"-m", "tether.worker"}, {"--eval-in-background=false"}});
}

TEST(Training, LauncherPrefetchWithPushReachesPythonWorkersAndTheTarget) {
  ExpectLauncherRunReaches80Percent(
      "--prefetch-with-push",
      {"--epochs", "4", "--python-model", TETHER_PYTHON_TEST_MODEL},
      {{"-m", "tether.worker"}});
}
#endif

// "Stop run" on the dashboard: tether-up says the run was stopped, at
// which clock and round, how to resume it, and exits 0 (not "MISSED").
TEST(Training, LauncherRunStoppedFromTheDashboardExitsZero) {
  TempDir dir;
  const std::string summary_file = dir.path() + "/summary.json";
  auto up = Process::Start(
      {TETHER_UP_BIN, "--http", "127.0.0.1:0", "--shards", "2", "--workers",
       "2", "--slow", "0", "--epochs", "50", "--model", "softmax", "--log-dir",
       dir.path(), "--summary-file", summary_file},
      dir.path() + "/up.out");
  ASSERT_TRUE(up.ok()) << up.status().ToString();
  const json::value running = WaitForRunning(summary_file, 30000);
  ASSERT_TRUE(running.is_object()) << (*up)->Log();
  const std::string url(running.at("dashboard").as_string());
  const std::string address = url.substr(7, url.find('/', 7) - 7);
  EXPECT_EQ(running.at("token_file"),
            (dir.path() + "/dashboard.token").c_str());
  ASSERT_TRUE(Eventually(
      [&] {
        auto status = HttpFetch(address, "GET", "/api/status");
        if (!status.ok() || status->status != 200) return false;
        return json::parse(status->body).at("min_clock").to_number<int64_t>() >=
               20;
      },
      60000))
      << (*up)->Log();
  std::ifstream in(dir.path() + "/dashboard.token");
  std::string token;
  ASSERT_TRUE(std::getline(in, token));
  auto stopped = HttpFetch(address, "POST", "/api/stop", "",
                           {{"Authorization", "Bearer " + token}});
  ASSERT_TRUE(stopped.ok() && stopped->status == 202)
      << (stopped.ok() ? stopped->body : stopped.status().ToString());
  auto code = (*up)->Wait(60000);
  ASSERT_TRUE(code.ok()) << code.status().ToString();
  const std::string out = (*up)->Log();
  EXPECT_EQ(*code, 0) << out;
  EXPECT_NE(out.find("tether-up: the run was stopped at clock "),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("holds it; resume with:"), std::string::npos) << out;
  EXPECT_NE(out.find("--data-dir " + dir.path() + " --resume latest"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("MISSED"), std::string::npos) << out;
  const json::value summary = ReadSummary(summary_file);
  ASSERT_TRUE(summary.is_object()) << summary_file;
  const json::value& result = summary.at("result");
  EXPECT_EQ(result.at("exit_code"), 0) << summary;
  const int64_t clock = result.at("stopped_at_clock").to_number<int64_t>();
  EXPECT_NE(out.find("stopped at clock " + std::to_string(clock) + " "),
            std::string::npos)
      << summary;
  EXPECT_NE(
      out.find("checkpoint round " +
               std::to_string(result.at("stopped_round").to_number<int64_t>()) +
               " holds it"),
      std::string::npos)
      << summary;

  // The printed command resumes it with the run's own flags (2 shards, 2
  // workers, none slowed, softmax: kept in DIR/tether-up.flags), those
  // given now on top; a flag the run cannot change is refused, named
  // (--shards and --workers may change: issue 18).
  std::string refused;
  auto code2 = RunToExit({TETHER_UP_BIN, "--data-dir", dir.path(), "--resume",
                          "latest", "--model", "mlp", "--http", "off"},
                         &refused, 10000);
  ASSERT_TRUE(code2.ok());
  EXPECT_EQ(*code2, 2) << refused;
  EXPECT_NE(refused.find("--model softmax in the run"), std::string::npos)
      << refused;
  std::string resumed;
  auto code3 =
      RunToExit({TETHER_UP_BIN, "--data-dir", dir.path(), "--resume", "latest",
                 "--log-dir", dir.path() + "/resumed", "--http", "off",
                 "--epochs", "1", "--target-accuracy", "0.5"},
                &resumed, 120000);
  ASSERT_TRUE(code3.ok());
  EXPECT_EQ(*code3, 0) << resumed;
  EXPECT_NE(resumed.find("2 shards, 2 workers (0 slowed"), std::string::npos)
      << resumed;
  EXPECT_NE(resumed.find("model softmax"), std::string::npos) << resumed;
  EXPECT_NE(resumed.find("tether-up: resuming from round"), std::string::npos)
      << resumed;
}

// tether-up killed with SIGKILL takes its shards and workers with it: none
// is left training or holding its data dir.
TEST(Training, LauncherKilledTakesItsProcessesWithIt) {
  TempDir dir;
  const std::string summary_file = dir.path() + "/summary.json";
  auto up = Process::Start(
      {TETHER_UP_BIN, "--http", "off", "--shards", "2", "--workers", "2",
       "--slow", "0", "--epochs", "50", "--model", "softmax", "--log-dir",
       dir.path(), "--summary-file", summary_file},
      dir.path() + "/up.out");
  ASSERT_TRUE(up.ok()) << up.status().ToString();
  const json::value running = WaitForRunning(summary_file, 60000);
  ASSERT_TRUE(running.is_object()) << (*up)->Log();
  EXPECT_TRUE(running.at("dashboard").is_null());
  std::vector<pid_t> pids;
  for (const char* kind : {"shards", "workers"}) {
    for (const json::value& p : running.at(kind).as_array()) {
      pids.push_back(p.at("pid").to_number<pid_t>());
    }
  }
  ASSERT_EQ(pids.size(), 4u) << running;
  // Training is under way (a progress line with clocks).
  ASSERT_TRUE((*up)->WaitForLine("min ", 60000).ok()) << (*up)->Log();
  std::string ps;
  ASSERT_TRUE(RunToExit({"/usr/bin/pgrep", "-f", dir.path()}, &ps, 5000).ok());
  ASSERT_NE(ps, "") << "no shard or worker running";
  (*up)->Signal(SIGKILL);
  ASSERT_TRUE((*up)->Wait(5000).ok());
  EXPECT_TRUE(Eventually(
      [&] {
        ps.clear();
        return RunToExit({"/usr/bin/pgrep", "-f", dir.path()}, &ps, 5000)
                   .ok() &&
               ps.empty();
      },
      10000))
      << "still running: " << ps;
  // Workers (whose command lines do not name the dir) take a moment to
  // die too, the more so under a sanitizer.
  for (pid_t pid : pids) {
    EXPECT_TRUE(Eventually([&] { return !Runs(pid); }, 10000)) << "pid " << pid;
  }
}

// Trains an MLP at s = 0 with 2 workers, rank 0 evaluating every
// `eval_every` clocks; its weights then, and the workers' logs in `logs`.
std::map<std::string, std::vector<float>> TrainBspAndPull(
    uint64_t seed, const std::string& eval_every = "0",
    std::string* logs = nullptr) {
  TempDir dir;
  ClusterOptions o;
  o.shards = 2;
  o.workers = 2;
  o.seed = seed;
  o.optimizer = "adam";
  o.lr = 0.001f;
  o.block_size = 4096;
  auto cluster = Cluster::Start(o, dir.path());
  EXPECT_TRUE(cluster.ok()) << cluster.status().ToString();
  if (!cluster.ok()) return {};
  std::vector<std::string> flags = {
      "--staleness", "0", "--model", "mlp", "--hidden",     "64",
      "--epochs",    "1", "--batch", "128", "--eval-every", eval_every};
  if (logs != nullptr) flags.push_back("--quiet=false");  // every line
  auto workers = StartWorkers((*cluster)->coordinator(), 2, dir.path(), flags);
  ExpectAllSucceed(workers);
  if (logs != nullptr) {
    for (auto& w : workers) *logs += w->Log();
  }
  auto observer = ConnectObserver((*cluster)->coordinator());
  std::map<std::string, std::vector<float>> params;
  const std::vector<std::pair<std::string, std::vector<uint64_t>>> shapes = {
      {"fc1.weight", {64, 784}},
      {"fc1.bias", {64}},
      {"fc2.weight", {10, 64}},
      {"fc2.bias", {10}}};
  for (const auto& [name, shape] : shapes) {
    EXPECT_TRUE(observer->DefineTensor(name, shape).ok()) << name;
    std::vector<float>& v = params[name];
    v.resize(shape.size() == 1 ? shape[0] : shape[0] * shape[1]);
    EXPECT_TRUE(observer->Pull(name, v).ok()) << name;
  }
  return params;
}

// tether-up --join adds workers to a run another tether-up started: they
// get free ranks (2 and 3), train from the next epoch on, and both
// launchers exit 0.
TEST(Training, LauncherJoinAddsWorkersToARunningLocalCluster) {
  TempDir dir;
  const std::string summary = dir.path() + "/run.json";
  auto run = Process::Start({TETHER_UP_BIN,
                             "--shards",
                             "2",
                             "--workers",
                             "2",
                             "--slow",
                             "0",
                             "--model",
                             "mlp",
                             "--epochs",
                             "3",
                             "--staleness",
                             "2",
                             "--http",
                             "off",
                             "--target-accuracy",
                             "0.8",
                             "--log-dir",
                             dir.path() + "/run",
                             "--summary-file",
                             summary},
                            dir.path() + "/up.log");
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  json::value running = WaitForRunning(summary, 60000);
  ASSERT_TRUE(running.is_object()) << Tail((*run)->Log(), 20);
  const std::string coordinator =
      std::string(running.at("coordinator").as_string());
  // Joiners take free ranks: once the run's own ranks 0 and 1 are in.
  ASSERT_TRUE(Eventually(
      [&] {
        std::ifstream in(dir.path() + "/run/shard0.log");
        std::stringstream text;
        text << in.rdbuf();
        return text.str().find("training starts") != std::string::npos;
      },
      60000));

  std::string joined;
  auto code = RunToExit({TETHER_UP_BIN, "--join", coordinator, "--workers", "2",
                         "--slow", "0", "--model", "mlp", "--epochs", "3",
                         "--staleness", "2", "--log-dir", dir.path() + "/join"},
                        &joined, 240000);
  ASSERT_TRUE(code.ok()) << code.status().ToString();
  EXPECT_EQ(*code, 0) << joined;
  EXPECT_NE(joined.find("adding 2 workers to the run at " + coordinator),
            std::string::npos)
      << joined;
  auto main_code = (*run)->Wait(240000);
  ASSERT_TRUE(main_code.ok());
  EXPECT_EQ(*main_code, 0) << Tail((*run)->Log(), 20);
  // The joiners trained with ranks of their own.
  std::string ranks;
  for (int i = 0; i < 2; ++i) {
    std::ifstream in(dir.path() + "/join/joined" + std::to_string(i) + ".log");
    std::stringstream text;
    text << in.rdbuf();
    const std::string log = text.str();
    EXPECT_NE(log.find("done in"), std::string::npos) << log;
    const size_t at = log.rfind("worker ");
    if (at != std::string::npos) ranks += log.substr(at + 7, 1);
  }
  std::sort(ranks.begin(), ranks.end());
  EXPECT_EQ(ranks, "23");
}

// The second run's rank 0 evaluates every 20 clocks in the background
// (each reported a clock or more later, naming its clock): the weights
// are the same bit for bit all the same.
TEST(Training, BspRunsWithSameSeedAreBitIdenticalEvaluatingOrNot) {
  auto a = TrainBspAndPull(11);
  std::string logs;
  auto b = TrainBspAndPull(11, "20", &logs);
  // Rank 0's line at clock 20 has no accuracy yet (in the foreground it
  // would); a later one has clock 20's.
  const size_t at20 = logs.find("worker 0: epoch 1/1 clock 20 ");
  ASSERT_NE(at20, std::string::npos) << logs;
  const std::string line20 = logs.substr(at20, logs.find('\n', at20) - at20);
  EXPECT_EQ(line20.find("test accuracy"), std::string::npos) << line20;
  EXPECT_NE(logs.find("(of clock 20)", at20), std::string::npos) << logs;
  ASSERT_EQ(a.size(), 4u);
  for (const auto& [name, values] : a) {
    ASSERT_EQ(values.size(), b[name].size()) << name;
    EXPECT_EQ(std::memcmp(values.data(), b[name].data(),
                          values.size() * sizeof(float)),
              0)
        << name << " differs between two identical BSP runs";
  }
  // Training moved the weights away from their initial values.
  double norm = 0;
  for (float v : a["fc1.bias"]) norm += v * v;
  EXPECT_GT(norm, 0.0);
}

// Without a usable GPU (no CUDA module in this build, no device, no driver)
// a GPU worker stops at start saying why, before it joins any cluster (with
// one, it makes its model on the GPU and then finds no cluster); a device
// that is not one is refused naming the flag.
TEST(Training, CudaWorkerWithoutAGpuStopsAtStartSayingWhy) {
  std::string out;
  auto code = RunToExit({TETHER_WORKER_BIN, "--device", "cuda:0", "--model",
                         "mlp", "--coordinator", "127.0.0.1:1"},
                        &out, 60000);
  ASSERT_TRUE(code.ok());
  EXPECT_NE(*code, 0) << out;  // no cluster listens on port 1 either way
  if (out.find("computes on cuda:0") != std::string::npos) {
    // A machine with a GPU: the model was made; only the cluster is absent.
    EXPECT_NE(out.find("127.0.0.1:1"), std::string::npos) << out;
  } else {
    EXPECT_NE(out.find("tether-worker: --device cuda:0: "), std::string::npos)
        << out;
    EXPECT_EQ(out.find("127.0.0.1:1"), std::string::npos)
        << "it tried the cluster first: " << out;
  }
  code = RunToExit({TETHER_WORKER_BIN, "--device", "tpu"}, &out, 60000);
  ASSERT_TRUE(code.ok());
  EXPECT_NE(*code, 0);
  EXPECT_NE(out.find("--device: expected cpu, cuda or cuda:N, got 'tpu'"),
            std::string::npos)
      << out;
}

TEST(Training, SparseLogisticRegressionApproachesTrueWeights) {
  TempDir dir;
  const std::string data = dir.path() + "/train.svm";
  const std::string test = dir.path() + "/test.svm";
  const std::string truth = dir.path() + "/truth.txt";
  const std::string all = dir.path() + "/all.svm";
  std::string out;
  auto gen = RunToExit(
      {TETHER_GEN_SPARSE_BIN, "--out", all, "--rows", "45000", "--features",
       "2000", "--nnz", "10", "--seed", "5", "--weights-out", truth, "--quiet"},
      &out, 60000);
  ASSERT_TRUE(gen.ok() && *gen == 0) << out;
  {
    // The first 40,000 rows train, the last 5,000 (same true weights) test.
    std::ifstream in(all);
    std::ofstream train_out(data), test_out(test);
    std::string line;
    for (int i = 0; std::getline(in, line); ++i) {
      (i < 40000 ? train_out : test_out) << line << "\n";
    }
  }

  ClusterOptions o;
  o.shards = 2;
  o.workers = 2;
  o.optimizer = "adagrad";
  o.lr = 0.5f;
  auto cluster = Cluster::Start(o, dir.path());
  ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
  auto workers =
      StartWorkers((*cluster)->coordinator(), 2, dir.path(),
                   {"--staleness", "2", "--model", "sparse-lr", "--data", data,
                    "--test-data", test, "--epochs", "5", "--batch", "100"});
  ExpectAllSucceed(workers);

  // Compare the learned weights of the features seen with the truth.
  std::ifstream in(truth);
  std::vector<uint64_t> keys;
  std::vector<float> expected;
  uint64_t key;
  float w;
  while (in >> key >> w) {
    keys.push_back(key);
    expected.push_back(w);
  }
  ASSERT_GT(keys.size(), 1000u);
  auto observer = ConnectObserver((*cluster)->coordinator());
  ASSERT_TRUE(observer->DefineTable("sparse_lr.weight", 1).ok());
  std::vector<float> learned(keys.size());
  ASSERT_TRUE(observer->PullRows("sparse_lr.weight", keys, learned).ok());
  double dot = 0, nl = 0, ne = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    dot += double(learned[i]) * expected[i];
    nl += double(learned[i]) * learned[i];
    ne += double(expected[i]) * expected[i];
  }
  double cosine = dot / std::sqrt(nl * ne);
  EXPECT_GT(cosine, 0.8) << "learned weights point away from the truth";
  // Rank 0 reports the held-out accuracy at the end.
  std::string log = workers[0]->Log();
  auto at = log.find("test accuracy ");
  ASSERT_NE(at, std::string::npos) << log;
  EXPECT_GT(std::atof(log.c_str() + at + 14), 70.0) << log;
}

}  // namespace
}  // namespace tether::testing

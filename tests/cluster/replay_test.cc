// Recording an asynchronous run and replaying it bit for bit, with real
// processes: 2 shards, 4 CPU workers at s = 3 (one slowed 4x), Adam. The
// replay slows another worker instead, so its timing differs throughout;
// every parameter must still end memcmp-equal.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "tests/support/cluster.h"
#include "tests/support/model_params.h"
#include "tests/support/worker_pool.h"

namespace tether::testing {
namespace {

// tether-worker --model mlp --hidden 32.
const Shapes kShapes = MlpShapes(32);

constexpr int kWorkers = 4;
// 60000 rows / 4 workers / batch 200 = 75 clocks; rounds at 20, 40, 60.
constexpr int kRoundEvery = 20;

ClusterOptions RunOptions(const std::vector<std::string>& extra,
                          const std::vector<std::string>& shard_flags = {}) {
  ClusterOptions o;
  o.shards = 2;
  o.workers = kWorkers;
  o.seed = 33;
  o.optimizer = "adam";
  o.lr = 0.002f;
  o.block_size = 4096;
  o.extra_flags = {"--record", "--checkpoint-every",
                   std::to_string(kRoundEvery)};
  o.extra_flags.insert(o.extra_flags.end(), extra.begin(), extra.end());
  o.shard_flags = shard_flags;
  return o;
}

// Starts the 4 workers at s = 3, `slow` slowed 4x; `data` (by rank) replaces
// a worker's --data; `extra` flags go to every worker.
std::vector<std::unique_ptr<Process>> StartRun(
    const Cluster& cluster, const std::string& dir, const std::string& tag,
    int slow, const std::map<int, std::string>& data = {},
    const std::vector<std::string>& extra = {}) {
  std::vector<std::unique_ptr<Process>> workers;
  for (int r = 0; r < kWorkers; ++r) {
    std::vector<std::string> argv = {TETHER_WORKER_BIN,
                                     "--coordinator",
                                     cluster.coordinator(),
                                     "--rank",
                                     std::to_string(r),
                                     "--staleness",
                                     "3",
                                     "--model",
                                     "mlp",
                                     "--hidden",
                                     "32",
                                     "--epochs",
                                     "1",
                                     "--batch",
                                     "200",
                                     "--threads",
                                     "1",
                                     "--eval-every",
                                     "0",
                                     "--report-every",
                                     "1"};
    // Under ThreadSanitizer every process is slow already.
    if (r == slow) {
      argv.insert(argv.end(), {"--slowdown", kUnderTsan ? "2" : "4"});
    }
    if (auto it = data.find(r); it != data.end()) {
      argv.insert(argv.end(), {"--data", it->second});
    }
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto p = Process::Start(
        argv, dir + "/" + tag + "-worker" + std::to_string(r) + ".log");
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    if (p.ok()) workers.push_back(std::move(*p));
  }
  return workers;
}

Params PullParams(const Cluster& cluster) {
  return tether::testing::PullParams(cluster.coordinator(), kShapes);
}

// "clock C loss L" of every progress line a worker printed (one a clock,
// --report-every 1): the loss of its latest batch, to 4 decimals.
std::vector<std::string> Losses(const std::string& log_path) {
  std::ifstream in(log_path);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) {
    const size_t clock = line.find(" clock ");
    const size_t loss = line.find(" loss ", clock);
    if (clock == std::string::npos || loss == std::string::npos) continue;
    const size_t end = line.find(' ', loss + 6);
    out.push_back(line.substr(clock + 1, end - clock - 1));
  }
  return out;
}

// Records a run into DIR/recorded; returns its final parameters. `extra`
// flags go to every worker.
Params RecordedRun(const std::string& dir,
                   const std::vector<std::string>& extra = {}) {
  const std::string at = dir + "/recorded";
  std::filesystem::create_directories(at);
  auto cluster = Cluster::Start(RunOptions({}), at);
  EXPECT_TRUE(cluster.ok()) << cluster.status().ToString();
  if (!cluster.ok()) return {};
  auto workers = StartRun(**cluster, at, "run", /*slow=*/3, {}, extra);
  WaitForWorkers(workers);
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(std::filesystem::file_size(at + "/shard" + std::to_string(i) +
                                           "/record.log") > 1000)
        << "shard " << i << " recorded next to nothing";
  }
  return PullParams(**cluster);
}

TEST(Replay, AsyncRunReplayedWithAnotherStragglerIsBitIdentical) {
  TempDir dir;
  const Params recorded = RecordedRun(dir.path());
  ASSERT_EQ(recorded.size(), kShapes.size());

  // The same run without a recording ends elsewhere: the order matters.
  {
    const std::string at = dir.path() + "/free";
    std::filesystem::create_directories(at);
    auto cluster = Cluster::Start(RunOptions({}), at);
    ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
    auto workers = StartRun(**cluster, at, "run", /*slow=*/1);
    WaitForWorkers(workers);
    const Params free = PullParams(**cluster);
    ASSERT_EQ(free.size(), kShapes.size());
    EXPECT_NE(std::memcmp(free.at("fc1.weight").data(),
                          recorded.at("fc1.weight").data(),
                          recorded.at("fc1.weight").size() * sizeof(float)),
              0)
        << "an unreplayed async run with another straggler ended exactly as "
           "the recorded one: this test would prove nothing";
  }

  const std::string at = dir.path() + "/replay";
  std::filesystem::create_directories(at);
  auto cluster = Cluster::Start(
      RunOptions({}, {"--replay", dir.path() + "/recorded/shard{shard}"}), at);
  ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
  auto replaying =
      (*cluster)->shard(1).WaitForLine("recorded events from", 5000);
  EXPECT_TRUE(replaying.ok()) << replaying.status().ToString();
  auto workers = StartRun(**cluster, at, "run", /*slow=*/1);
  WaitForWorkers(workers);
  ExpectBitIdentical(recorded, PullParams(**cluster),
                     "the replay, against the recorded run");
  // And every worker saw the same loss at every clock.
  for (int r = 0; r < kWorkers; ++r) {
    const std::string log = "/run-worker" + std::to_string(r) + ".log";
    const std::vector<std::string> then =
        Losses(dir.path() + "/recorded" + log);
    EXPECT_GE(then.size(), 70u) << "worker " << r << " printed too few clocks";
    EXPECT_EQ(then, Losses(at + log)) << "worker " << r;
  }
  for (int i = 0; i < 2; ++i) {
    auto done =
        (*cluster)->shard(i).WaitForLine("recorded events of shard", 5000);
    EXPECT_TRUE(done.ok()) << "shard " << i << " did not finish its replay";
  }
}

// With --chunk-rows the fast workers take more chunks than the straggler,
// as timing has it: the replay hands out the same chunks in the same order.
TEST(Replay, ChunkedRunReplayedWithAnotherStragglerIsBitIdentical) {
  TempDir dir;
  const std::vector<std::string> chunked = {"--chunk-rows", "2000"};
  const Params recorded = RecordedRun(dir.path(), chunked);
  ASSERT_EQ(recorded.size(), kShapes.size());
  const std::string at = dir.path() + "/replay";
  std::filesystem::create_directories(at);
  auto cluster = Cluster::Start(
      RunOptions({}, {"--replay", dir.path() + "/recorded/shard{shard}"}), at);
  ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
  auto workers = StartRun(**cluster, at, "run", /*slow=*/0, {}, chunked);
  WaitForWorkers(workers);
  ExpectBitIdentical(recorded, PullParams(**cluster),
                     "the chunked replay, against the recorded run");
}

TEST(Replay, ReplayFromAMiddleRoundIsBitIdentical) {
  TempDir dir;
  const Params recorded = RecordedRun(dir.path());
  ASSERT_EQ(recorded.size(), kShapes.size());

  // The replay resumes the recorded run's round 40 from a copy of its data
  // dirs: the recorded run itself stays as it was.
  const std::string at = dir.path() + "/from-round";
  std::filesystem::create_directories(at);
  for (int i = 0; i < 2; ++i) {
    const std::string shard = "/shard" + std::to_string(i);
    std::filesystem::copy(dir.path() + "/recorded" + shard, at + shard,
                          std::filesystem::copy_options::recursive);
  }
  auto cluster = Cluster::Start(
      RunOptions({"--resume", std::to_string(2 * kRoundEvery)},
                 {"--replay", dir.path() + "/recorded/shard{shard}"}),
      at);
  ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
  auto resumed =
      (*cluster)->shard(0).WaitForLine("resumed from checkpoint round", 10000);
  ASSERT_TRUE(resumed.ok()) << resumed.status().ToString();
  auto workers = StartRun(**cluster, at, "run", /*slow=*/0);
  WaitForWorkers(workers);
  ExpectBitIdentical(recorded, PullParams(**cluster),
                     "the replay from round 40, against the recorded run");
}

// Round 40 of a run, as tether-ckpt exports it (safetensors bytes).
std::string ExportRound40(const std::string& data_dir, const std::string& out) {
  std::string output;
  auto code = RunToExit({TETHER_CKPT_BIN, "export", "--data-dir", data_dir,
                         "--round", std::to_string(2 * kRoundEvery), "--format",
                         "safetensors", "--out", out},
                        &output, 60000);
  EXPECT_TRUE(code.ok() && *code == 0) << output;
  std::ifstream in(out, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)),
                     std::istreambuf_iterator<char>());
}

// Every process of a recorded run SIGKILLed after a round: the recording
// holds every event up to the last complete round, so a replay of it
// reaches that round bit-identical. (Past it, each shard's recording ends
// where its last write did: the replay goes on as timing has it there.)
TEST(Replay, RecordingSurvivesACrashUpToItsLastRound) {
  TempDir dir;
  const std::string recorded = dir.path() + "/recorded";
  const std::string round =
      "checkpoint round " + std::to_string(2 * kRoundEvery) + " complete";
  std::filesystem::create_directories(recorded);
  {
    auto cluster = Cluster::Start(RunOptions({}), recorded);
    ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
    auto workers = StartRun(**cluster, recorded, "run", /*slow=*/3);
    auto line = (*cluster)->shard(0).WaitForLine(round, 120000);
    ASSERT_TRUE(line.ok()) << line.status().ToString();
    for (auto& w : workers) w->Signal(SIGKILL);
    for (int i = 0; i < 2; ++i) (*cluster)->shard(i).Signal(SIGKILL);
  }
  const std::string at = dir.path() + "/again";
  std::filesystem::create_directories(at);
  {
    auto cluster = Cluster::Start(
        RunOptions({}, {"--replay", recorded + "/shard{shard}"}), at);
    ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
    auto workers = StartRun(**cluster, at, "run", /*slow=*/1);
    auto line = (*cluster)->shard(0).WaitForLine(round, 120000);
    ASSERT_TRUE(line.ok()) << line.status().ToString();
    for (auto& w : workers) w->Signal(SIGKILL);
  }
  const std::string a = ExportRound40(recorded, dir.path() + "/a.safetensors");
  const std::string b = ExportRound40(at, dir.path() + "/b.safetensors");
  ASSERT_GT(a.size(), 10000u);
  EXPECT_TRUE(a == b) << "the replay's round " << 2 * kRoundEvery
                      << " differs from the crashed run's";
}

// A copy of Fashion-MNIST's training images with a few pixels changed in
// every image, uncompressed (the worker reads both kinds).
std::string ChangedImages(const std::string& dir) {
  const std::string path = dir + "/changed-images-idx3-ubyte";
  const std::string command =
      "gzip -dc /usr/share/datasets/fashion-mnist/"
      "train-images-idx3-ubyte.gz > " +
      path;
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  constexpr size_t kHeader = 16;
  constexpr size_t kImage = 28 * 28;
  for (size_t image = 0; image < 60000; ++image) {
    const size_t at = kHeader + image * kImage + 14 * 28 + 14;  // the middle
    f.seekp(static_cast<std::streamoff>(at));
    f.put(static_cast<char>(200));
  }
  return path;
}

TEST(Replay, ChangedDataFileIsReportedAsADivergence) {
  TempDir dir;
  // A short recording is enough: the first push of the changed worker
  // differs.
  const std::string recorded = dir.path() + "/recorded";
  std::filesystem::create_directories(recorded);
  {
    auto cluster = Cluster::Start(RunOptions({}), recorded);
    ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
    auto workers = StartRun(**cluster, recorded, "run", /*slow=*/3);
    WaitForWorkers(workers);
  }
  const std::string images = ChangedImages(dir.path());
  const std::string at = dir.path() + "/replay";
  std::filesystem::create_directories(at);
  auto cluster = Cluster::Start(
      RunOptions({}, {"--replay", recorded + "/shard{shard}"}), at);
  ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
  auto workers = StartRun(**cluster, at, "run", /*slow=*/3,
                          {{2, images + ",/usr/share/datasets/fashion-mnist/"
                                        "train-labels-idx1-ubyte.gz"}});
  // Reported, not hung on: every worker ends, within the run's timeout.
  for (int r = 0; r < kWorkers; ++r) {
    auto code = workers[r]->Wait(60000);
    ASSERT_TRUE(code.ok()) << "worker " << r
                           << " hangs: " << code.status().ToString();
    if (r == 2) {
      EXPECT_NE(*code, 0) << Tail(workers[r]->Log(), 10);
    }
  }
  std::string report;
  for (int i = 0; i < 2 && report.empty(); ++i) {
    auto line = (*cluster)->shard(i).WaitForLine("replay diverged", 1000);
    if (line.ok()) report = *line;
  }
  ASSERT_FALSE(report.empty()) << "no shard reported the divergence";
  // Shard, worker, clock and tensor, by name.
  EXPECT_NE(report.find("replay diverged on shard "), std::string::npos)
      << report;
  EXPECT_NE(report.find("worker 2 sent worker 2's push of fc"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("read at clock 0 with other values"), std::string::npos)
      << report;
  EXPECT_NE(Tail(workers[2]->Log(), 20).find("replay diverged"),
            std::string::npos)
      << Tail(workers[2]->Log(), 20);
}

}  // namespace
}  // namespace tether::testing

// Checkpoints and resume with real processes and real RocksDB on disk:
// every process killed with SIGKILL mid-run, then the run resumed.
#include <gtest/gtest.h>
#include <signal.h>

#include <boost/json.hpp>
#include <cstring>
#include <filesystem>

#include "tests/support/cluster.h"
#include "tests/support/model_params.h"
#include "tests/support/worker_pool.h"
#include "tools/http_client.h"

namespace tether::testing {
namespace {

// tether-worker --model mlp --hidden 32.
const Shapes kShapes = MlpShapes(32);

ClusterOptions RunOptions(const std::vector<std::string>& extra) {
  ClusterOptions o;
  o.shards = 2;
  o.workers = 2;
  o.seed = 21;
  o.optimizer = "adam";
  o.lr = 0.001f;
  o.block_size = 4096;
  o.extra_flags = {"--checkpoint-every", "60"};
  o.extra_flags.insert(o.extra_flags.end(), extra.begin(), extra.end());
  return o;
}

std::vector<std::unique_ptr<Process>> StartWorkers(
    const Cluster& cluster, const std::string& dir, const std::string& tag,
    int staleness = 0, int epochs = 1, const std::string& model = "mlp") {
  std::vector<std::unique_ptr<Process>> workers;
  for (int r = 0; r < 2; ++r) {
    auto p = Process::Start(
        {TETHER_WORKER_BIN, "--coordinator", cluster.coordinator(), "--rank",
         std::to_string(r), "--staleness", std::to_string(staleness), "--model",
         model, "--hidden", "32", "--epochs", std::to_string(epochs), "--batch",
         "200", "--eval-every", "0", "--quiet"},
        dir + "/" + tag + "-worker" + std::to_string(r) + ".log");
    EXPECT_TRUE(p.ok());
    if (p.ok()) workers.push_back(std::move(*p));
  }
  return workers;
}

Params PullParams(const Cluster& cluster) {
  return tether::testing::PullParams(cluster.coordinator(), kShapes);
}

// 60000 rows / 2 workers / batch 200 = 150 clocks; rounds at 60 and 120.
Params UninterruptedRun() {
  TempDir dir;
  auto cluster = Cluster::Start(RunOptions({}), dir.path());
  EXPECT_TRUE(cluster.ok()) << cluster.status().ToString();
  if (!cluster.ok()) return {};
  auto workers = StartWorkers(**cluster, dir.path(), "a");
  WaitForWorkers(workers);
  return PullParams(**cluster);
}

TEST(Resume, BspRunKilledAndResumedIsBitIdentical) {
  Params expected = UninterruptedRun();
  ASSERT_EQ(expected.size(), 4u);

  TempDir dir;
  {
    auto cluster = Cluster::Start(RunOptions({}), dir.path());
    ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
    auto workers = StartWorkers(**cluster, dir.path(), "first");
    auto round = WaitForRoundComplete((*cluster)->shard(0), 60, 120000);
    ASSERT_TRUE(round.ok()) << round.status().ToString();
    // Every process dies at once, mid-run, without a chance to clean up.
    for (auto& w : workers) w->Signal(SIGKILL);
    for (int i = 0; i < 2; ++i) (*cluster)->shard(i).Signal(SIGKILL);
  }
  auto cluster = Cluster::Start(RunOptions({"--resume", "latest"}), dir.path());
  ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
  auto resumed =
      (*cluster)->shard(0).WaitForLine("resumed from checkpoint round", 5000);
  ASSERT_TRUE(resumed.ok()) << resumed.status().ToString();
  auto workers = StartWorkers(**cluster, dir.path(), "second");
  WaitForWorkers(workers);
  ExpectBitIdentical(expected, PullParams(**cluster),
                     "the resumed run, against the uninterrupted one");
}

TEST(Resume, MismatchedRunOrMissingRoundRefusedAndNothingOverwritten) {
  TempDir dir;
  {
    auto cluster = Cluster::Start(RunOptions({}), dir.path());
    ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
    auto workers = StartWorkers(**cluster, dir.path(), "first");
    WaitForWorkers(workers);
    ASSERT_TRUE((*cluster)
                    ->shard(0)
                    .WaitForLine("checkpoint round 120 complete", 10000)
                    .ok());
  }
  auto refused = [&](std::vector<std::string> flags, const std::string& why) {
    std::vector<std::string> argv = {TETHER_SERVER_BIN,
                                     "--shard-id",
                                     "0",
                                     "--shards",
                                     "2",
                                     "--listen",
                                     "127.0.0.1:0",
                                     "--http",
                                     "127.0.0.1:0",
                                     "--workers",
                                     "2",
                                     "--optimizer",
                                     "adam",
                                     "--block-size",
                                     "4096",
                                     "--data-dir",
                                     dir.path() + "/shard0"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    std::string out;
    auto code = RunToExit(argv, &out, 10000);
    ASSERT_TRUE(code.ok());
    EXPECT_NE(*code, 0) << out;
    EXPECT_NE(out.find(why), std::string::npos) << out;
  };
  refused({"--seed", "22", "--resume", "latest"}, "round 120");
  refused({"--seed", "22", "--resume", "latest"}, "--seed 21 in the round");
  refused({"--seed", "21", "--resume", "7"}, "round 7 is not a complete round");
  refused({"--seed", "21", "--resume", "soon"}, "--resume");
  refused({"--optimizer", "sgd", "--resume", "latest"},
          "--optimizer adam in the round, sgd now");
  // The rounds are still there and still load, and the run's settings come
  // from the round: shard 0 is given none but --lr, which overrides it.
  ClusterOptions o = RunOptions({"--resume", "120", "--lr", "0.0005"});
  o.run_flags = false;
  o.extra_flags.erase(o.extra_flags.begin(), o.extra_flags.begin() + 2);
  auto cluster = Cluster::Start(o, dir.path());
  ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
  EXPECT_TRUE((*cluster)
                  ->shard(0)
                  .WaitForLine("resumed from checkpoint round 120", 5000)
                  .ok());
  EXPECT_TRUE((*cluster)
                  ->shard(1)
                  .WaitForLine("loaded checkpoint round 120", 5000)
                  .ok());
  EXPECT_TRUE((*cluster)
                  ->shard(0)
                  .WaitForLine("--lr 0.0005 now (0.001 in the round)", 1000)
                  .ok());
  auto reply =
      HttpFetch((*cluster)->dashboard(), "GET", "/api/config", "", {}, 5000);
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  const boost::json::object config =
      boost::json::parse(reply->body).as_object();
  EXPECT_EQ(config.at("workers").to_number<int>(), 2) << reply->body;
  EXPECT_EQ(config.at("seed").to_number<int>(), 21) << reply->body;
  EXPECT_EQ(config.at("block_size").to_number<int>(), 4096) << reply->body;
  EXPECT_EQ(config.at("checkpoint_every").to_number<int>(), 60) << reply->body;
  EXPECT_EQ(config.at("optimizer").as_string(), "adam") << reply->body;
  EXPECT_EQ(config.at("lr").to_number<double>(), 0.0005) << reply->body;
}

// Test accuracy of the model the cluster holds, from tether-worker
// --evaluate-only.
double Accuracy(const Cluster& cluster, const std::string& model) {
  std::string out;
  auto code =
      RunToExit({TETHER_WORKER_BIN, "--coordinator", cluster.coordinator(),
                 "--model", model, "--hidden", "32", "--evaluate-only",
                 "--test-data", "fashion-mnist"},
                &out, 60000);
  EXPECT_TRUE(code.ok() && *code == 0) << out;
  auto at = out.find("test accuracy ");
  EXPECT_NE(at, std::string::npos) << out;
  return at == std::string::npos ? -1 : std::atof(out.c_str() + at + 14);
}

// Softmax regression: convex, so both runs settle near the same accuracy
// and the comparison is not at the mercy of SSP's scheduling noise.
TEST(Resume, AsyncRunKilledAndResumedEndsWithinOnePercent) {
  double clean = 0;
  {
    TempDir dir;
    auto cluster = Cluster::Start(RunOptions({}), dir.path());
    ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
    auto workers =
        StartWorkers(**cluster, dir.path(), "clean", 2, 5, "softmax");
    WaitForWorkers(workers);
    clean = Accuracy(**cluster, "softmax");
  }
  TempDir dir;
  {
    auto cluster = Cluster::Start(RunOptions({}), dir.path());
    ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
    auto workers =
        StartWorkers(**cluster, dir.path(), "first", 2, 5, "softmax");
    auto round = WaitForRoundComplete((*cluster)->shard(0), 120, 120000);
    ASSERT_TRUE(round.ok()) << round.status().ToString();
    for (auto& w : workers) w->Signal(SIGKILL);
    for (int i = 0; i < 2; ++i) (*cluster)->shard(i).Signal(SIGKILL);
  }
  auto cluster = Cluster::Start(RunOptions({"--resume", "latest"}), dir.path());
  ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
  auto workers = StartWorkers(**cluster, dir.path(), "second", 2, 5, "softmax");
  WaitForWorkers(workers);
  // Every process says where the run goes on from.
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(
        (*cluster)->shard(i).WaitForLine("resuming from round ", 1000).ok())
        << "shard " << i;
  }
  for (auto& w : workers) {
    EXPECT_NE(w->Log().find("resuming from round "), std::string::npos)
        << w->Log();
  }
  double resumed = Accuracy(**cluster, "softmax");
  EXPECT_GT(clean, 0.7);
  EXPECT_NEAR(resumed, clean, 0.01);
}

TEST(Resume, ShardKilledWhileWritingNeverLeavesAHalfRound) {
  TempDir dir;
  const uint64_t n = 4 << 20;  // large enough that a round takes a while
  std::vector<float> ones(n, 1.0f);
  {
    auto cluster = Cluster::Start(RunOptions({}), dir.path());
    ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
    auto workers = ConnectWorkers((*cluster)->coordinator(), {-1, -1});
    ASSERT_EQ(workers.size(), 2u);
    auto observer = ConnectObserver((*cluster)->coordinator());
    ASSERT_TRUE(observer->DefineTensor("ballast", {n}).ok());
    auto clock_to = [&](int64_t target) {
      for (auto& w : workers) {
        while (w->clock() < target) ASSERT_TRUE(w->Clock().ok());
      }
    };
    // Adam from zero with a unit gradient: each push moves every value by
    // -lr, so the ballast tells which round was loaded.
    ASSERT_TRUE(observer->Push("ballast", ones).ok());
    clock_to(60);
    ASSERT_TRUE((*cluster)
                    ->shard(0)
                    .WaitForLine("checkpoint round 60 complete", 60000)
                    .ok());
    ASSERT_TRUE(observer->Push("ballast", ones).ok());
    clock_to(120);
    auto writing =
        (*cluster)->shard(1).WaitForLine("writing checkpoint round 120", 60000);
    ASSERT_TRUE(writing.ok()) << writing.status().ToString();
    (*cluster)->shard(1).Signal(SIGKILL);  // most likely mid-write
    (*cluster)->shard(0).Signal(SIGKILL);
  }
  auto cluster = Cluster::Start(RunOptions({"--resume", "latest"}), dir.path());
  ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
  auto line =
      (*cluster)->shard(0).WaitForLine("resumed from checkpoint round", 10000);
  ASSERT_TRUE(line.ok()) << line.status().ToString();
  const int64_t round = std::atoll(line->c_str() + line->rfind("round ") + 6);
  ASSERT_TRUE(round == 60 || round == 120) << *line;
  EXPECT_TRUE((*cluster)
                  ->shard(1)
                  .WaitForLine(
                      "loaded checkpoint round " + std::to_string(round), 10000)
                  .ok());
  auto observer = ConnectObserver((*cluster)->coordinator());
  ASSERT_TRUE(observer->DefineTensor("ballast", {n}).ok());
  std::vector<float> ballast(n);
  ASSERT_TRUE(observer->Pull("ballast", ballast).ok());
  const float expected = -0.001f * static_cast<float>(round / 60);
  EXPECT_NEAR(ballast.front(), expected, 1e-6);
  EXPECT_NEAR(ballast.back(), expected, 1e-6);
}

}  // namespace
}  // namespace tether::testing

namespace tether::testing {
namespace {

TEST(Checkpoints, OnDemandRoundFromTheToolCompletesAndLists) {
  TempDir dir;
  ClusterOptions o = RunOptions({});
  o.extra_flags = {};  // no periodic rounds: only the one asked for
  auto cluster = Cluster::Start(o, dir.path());
  ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
  auto workers = ConnectWorkers((*cluster)->coordinator(), {-1, -1});
  ASSERT_EQ(workers.size(), 2u);
  for (auto& w : workers) {
    for (int k = 0; k < 7; ++k) ASSERT_TRUE(w->Clock().ok());
  }
  std::string out;
  auto code = RunToExit(
      {TETHER_CKPT_BIN, "now", "--coordinator", (*cluster)->coordinator()},
      &out, 20000);
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 0) << out;
  EXPECT_NE(out.find("round 7 started"), std::string::npos) << out;
  ASSERT_TRUE((*cluster)
                  ->shard(0)
                  .WaitForLine("checkpoint round 7 complete", 20000)
                  .ok());
  code = RunToExit({TETHER_CKPT_BIN, "list", "--data-dir", dir.path()}, &out,
                   20000);
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 0) << out;
  EXPECT_NE(out.find("7"), std::string::npos) << out;
}

}  // namespace
}  // namespace tether::testing

namespace tether::testing {
namespace {

// A tmpfs of `size` mounted at `path` for the test's lifetime (we run as
// root, as CI does).
class TinyFilesystem {
 public:
  TinyFilesystem(const std::string& path, const std::string& size)
      : path_(path) {
    std::filesystem::create_directories(path);
    std::string out;
    auto code = RunToExit(
        {"/bin/mount", "-t", "tmpfs", "-o", "size=" + size, "tmpfs", path},
        &out, 10000);
    mounted_ = code.ok() && *code == 0;
    EXPECT_TRUE(mounted_) << "mounting a tmpfs at " << path
                          << " needs root: " << out;
  }
  ~TinyFilesystem() {
    std::string out;
    if (mounted_) (void)RunToExit({"/bin/umount", path_}, &out, 10000);
  }
  bool mounted() const { return mounted_; }
  void Grow(const std::string& size) {
    std::string out;
    auto code = RunToExit({"/bin/mount", "-o", "remount,size=" + size, path_},
                          &out, 10000);
    EXPECT_TRUE(code.ok() && *code == 0) << out;
  }

 private:
  std::string path_;
  bool mounted_ = false;
};

TEST(Checkpoints, FullDiskFailsTheRoundTrainingGoesOnPreviousRoundLoads) {
  TempDir dir;
  TinyFilesystem tiny(dir.path() + "/shard1", "3m");
  ASSERT_TRUE(tiny.mounted());
  {
    auto cluster = Cluster::Start(RunOptions({}), dir.path());
    ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
    auto workers = ConnectWorkers((*cluster)->coordinator(), {-1, -1});
    ASSERT_EQ(workers.size(), 2u);
    auto observer = ConnectObserver((*cluster)->coordinator());
    auto clock_to = [&](int64_t target) {
      for (auto& w : workers) {
        while (w->clock() < target) ASSERT_TRUE(w->Clock().ok());
      }
    };
    ASSERT_TRUE(observer->DefineTensor("small", {1000}).ok());
    std::vector<float> ones(2 << 20, 1.0f);
    ASSERT_TRUE(observer->Push("small", std::span(ones).first(1000)).ok());
    clock_to(60);
    ASSERT_TRUE((*cluster)
                    ->shard(0)
                    .WaitForLine("checkpoint round 60 complete", 30000)
                    .ok());
    // Now shard 1's slice no longer fits its 3 MB filesystem.
    ASSERT_TRUE(observer->DefineTensor("big", {2 << 20}).ok());
    ASSERT_TRUE(observer->Push("big", ones).ok());
    clock_to(120);
    auto failed = (*cluster)->shard(0).WaitForLine(
        "checkpoint round 120 failed on shard 1", 30000);
    ASSERT_TRUE(failed.ok()) << failed.status().ToString();
    EXPECT_NE(failed->find("space"), std::string::npos) << *failed;
    // Training goes on.
    clock_to(150);
    ASSERT_TRUE(observer->Push("big", ones).ok());
    std::vector<float> small(1000);
    ASSERT_TRUE(observer->Pull("small", small).ok());
  }
  // Once there is room again, the previous complete round loads.
  tiny.Grow("64m");
  auto cluster = Cluster::Start(RunOptions({"--resume", "latest"}), dir.path());
  ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
  EXPECT_TRUE((*cluster)
                  ->shard(1)
                  .WaitForLine("loaded checkpoint round 60", 10000)
                  .ok())
      << Tail((*cluster)->shard(1).Log(), 5);
}

// A round shard 1 could not write (its disk full) is written when asked for
// again at the same clock once there is room, and completes: the shard
// that wrote it says so again instead of rewriting it, the other writes it.
TEST(Checkpoints, RoundThatFailedIsWrittenWhenAskedAgain) {
  TempDir dir;
  TinyFilesystem tiny(dir.path() + "/shard1", "3m");
  ASSERT_TRUE(tiny.mounted());
  ClusterOptions o = RunOptions({});
  o.extra_flags = {};  // no periodic rounds: only those asked for
  auto cluster = Cluster::Start(o, dir.path());
  ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
  auto workers = ConnectWorkers((*cluster)->coordinator(), {-1, -1});
  ASSERT_EQ(workers.size(), 2u);
  auto observer = ConnectObserver((*cluster)->coordinator());
  // Shard 1's slice does not fit its 3 MB filesystem.
  std::vector<float> ones(2 << 20, 1.0f);
  ASSERT_TRUE(observer->DefineTensor("big", {2 << 20}).ok());
  ASSERT_TRUE(observer->Push("big", ones).ok());
  for (auto& w : workers) {
    for (int k = 0; k < 7; ++k) ASSERT_TRUE(w->Clock().ok());
  }
  auto now = [&] {
    std::string out;
    auto code = RunToExit(
        {TETHER_CKPT_BIN, "now", "--coordinator", (*cluster)->coordinator()},
        &out, 20000);
    EXPECT_TRUE(code.ok() && *code == 0) << out;
    EXPECT_NE(out.find("round 7 started"), std::string::npos) << out;
  };
  now();
  auto failed = (*cluster)->shard(0).WaitForLine(
      "checkpoint round 7 failed on shard 1", 30000);
  ASSERT_TRUE(failed.ok()) << failed.status().ToString();
  // Shard 0's own write of the round may still run (shard 1 failed fast);
  // asked again before it ends, it would be answered as on its way.
  auto wrote =
      (*cluster)->shard(0).WaitForLine("checkpoint round 7 written: ", 30000);
  ASSERT_TRUE(wrote.ok()) << wrote.status().ToString();
  tiny.Grow("64m");
  now();  // the clocks have not moved: round 7 again
  EXPECT_TRUE((*cluster)
                  ->shard(0)
                  .WaitForLine("checkpoint round 7 complete", 30000)
                  .ok())
      << Tail((*cluster)->shard(0).Log(), 8);
  EXPECT_TRUE((*cluster)
                  ->shard(0)
                  .WaitForLine("checkpoint round 7 asked for again: written "
                               "already",
                               1000)
                  .ok());
}

}  // namespace
}  // namespace tether::testing

// Training goes on when workers are slow, die or come back: real shard and
// tether-worker processes, stopped with SIGSTOP and killed with SIGKILL.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "tests/support/cluster.h"
#include "tests/support/worker_pool.h"

namespace tether::testing {
namespace {

using std::chrono::milliseconds;

class Failure : public ::testing::Test {
 protected:
  void KillAndResumeShard(bool overlap);
  void StartCluster(int workers, std::vector<std::string> flags,
                    int reject_staleness = -1) {
    ClusterOptions o;
    o.shards = 2;
    o.workers = workers;
    o.max_staleness = 2;
    o.reject_staleness = reject_staleness;
    o.optimizer = "adam";
    o.lr = 0.001f;
    o.block_size = 4096;
    o.extra_flags = std::move(flags);
    auto c = Cluster::Start(o, dir_.path());
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    cluster_ = std::move(*c);
  }
  void StartTraining(int workers, int epochs,
                     std::vector<std::string> extra = {}) {
    std::vector<std::string> flags = {
        "--model", "softmax", "--epochs", std::to_string(epochs), "--staleness",
        "2",       "--batch", "100",      "--eval-every",         "0"};
    flags.insert(flags.end(), extra.begin(), extra.end());
    workers_ =
        StartWorkers(cluster_->coordinator(), workers, dir_.path(), flags);
    ASSERT_EQ(static_cast<int>(workers_.size()), workers);
  }
  // Every shard's figures, from an observer.
  std::vector<ShardStats> Stats() {
    auto observer = ConnectObserver(cluster_->coordinator());
    if (observer == nullptr) return {};
    auto stats = observer->Stats();
    EXPECT_TRUE(stats.ok()) << stats.status().ToString();
    return stats.ok() ? *stats : std::vector<ShardStats>{};
  }
  int64_t ClockOf(int rank) {
    auto stats = Stats();
    return stats.empty() ? -1 : stats[0].workers[rank].clock;
  }
  // Waits for every worker to exit 0.
  void FinishAll() {
    for (size_t r = 0; r < workers_.size(); ++r) {
      auto code = workers_[r]->Wait(180000);
      ASSERT_TRUE(code.ok())
          << "worker " << r << ": " << code.status().ToString();
      EXPECT_EQ(*code, 0) << "worker " << r << ":\n"
                          << Tail(workers_[r]->Log(), 10);
    }
  }
  // Rank 0's final test accuracy, from its last line.
  double FinalAccuracy() {
    const std::string log = workers_[0]->Log();
    auto at = log.rfind("test accuracy ");
    EXPECT_NE(at, std::string::npos) << Tail(log, 5);
    return at == std::string::npos ? -1 : std::atof(log.c_str() + at + 14);
  }

  TempDir dir_;
  std::unique_ptr<Cluster> cluster_;
  std::vector<std::unique_ptr<Process>> workers_;
};

TEST_F(Failure, StoppedWorkerIsEvictedThenRejoinsWithinTheBound) {
  ASSERT_NO_FATAL_FAILURE(
      StartCluster(3, {"--worker-timeout-ms", "1500", "--heartbeat-ms", "200"},
                   /*reject_staleness=*/4));
  ASSERT_NO_FATAL_FAILURE(StartTraining(3, 6));
  ASSERT_TRUE(Eventually([&] { return ClockOf(2) >= 20; }, 60000));

  workers_[2]->Signal(SIGSTOP);
  const auto stopped = std::chrono::steady_clock::now();
  // Evicted on every shard once silent for the timeout, not before.
  for (int shard = 0; shard < 2; ++shard) {
    auto line =
        cluster_->shard(shard).WaitForLine("worker 2 evicted: silent", 10000);
    ASSERT_TRUE(line.ok()) << "shard " << shard << ": "
                           << line.status().ToString();
  }
  EXPECT_GE(std::chrono::steady_clock::now() - stopped, milliseconds(1400));
  // The others no longer wait for it: both run well past its clock + 2
  // (both, since it rejoins at the slower one's clock).
  const int64_t frozen = ClockOf(2);
  EXPECT_TRUE(Eventually(
      [&] { return std::min(ClockOf(0), ClockOf(1)) > frozen + 20; }, 20000))
      << "workers 0 and 1 at " << ClockOf(0) << " and " << ClockOf(1)
      << ", the stopped one at " << frozen;
  auto stats = Stats();
  ASSERT_EQ(stats.size(), 2u);
  EXPECT_FALSE(stats[0].workers[2].live);
  EXPECT_TRUE(stats[0].workers[2].connected);
  EXPECT_EQ(stats[0].evictions + stats[1].evictions, 2u);

  workers_[2]->Signal(SIGCONT);
  for (int shard = 0; shard < 2; ++shard) {
    ASSERT_TRUE(cluster_->shard(shard)
                    .WaitForLine("worker 2 is back after its eviction", 10000)
                    .ok())
        << "shard " << shard;
  }
  // It rejoined at the others' clock, not its own.
  EXPECT_GT(ClockOf(2), frozen + 20);
  ASSERT_NO_FATAL_FAILURE(FinishAll());
  // Whatever it pushed from before its stop was handled as the bound says:
  // refused above --reject-staleness 4, so no accepted push is staler.
  uint64_t accepted_stale = 0;
  for (const ShardStats& s : Stats()) {
    for (size_t i = 5; i < s.staleness_histogram.size(); ++i) {
      accepted_stale += s.staleness_histogram[i];
    }
  }
  EXPECT_EQ(accepted_stale, 0u);
  EXPECT_GT(FinalAccuracy(), 70);
}

// `tether-client train` stopped past its eviction and continued finds its
// connections silent, drops them and dials again, as tether-worker does:
// the iteration in flight is repeated and it finishes with exit 0.
TEST_F(Failure, StoppedTetherClientTrainRejoinsAndFinishes) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(
      1, {"--worker-timeout-ms", "1500", "--heartbeat-ms", "200"}));
  auto client = Process::Start(
      {TETHER_CLIENT_BIN, "train", "--coordinator", cluster_->coordinator(),
       "--tensor", "w", "--shape", "1000", "--iterations", "300", "--staleness",
       "2", "--sleep-ms", "10"},
      dir_.path() + "/client.log");
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  ASSERT_TRUE(Eventually([&] { return ClockOf(0) >= 20; }, 30000))
      << Tail((*client)->Log(), 10);

  (*client)->Signal(SIGSTOP);
  for (int shard = 0; shard < 2; ++shard) {
    ASSERT_TRUE(cluster_->shard(shard)
                    .WaitForLine("worker 0 evicted: silent", 10000)
                    .ok())
        << "shard " << shard;
  }
  // Stopped past its own silence check too (--worker-timeout-ms from the
  // shards), so that it finds its connections silent when it goes on: a
  // SIGCONT right at the eviction could let it carry on over them.
  std::this_thread::sleep_for(milliseconds(2000));
  (*client)->Signal(SIGCONT);
  for (int shard = 0; shard < 2; ++shard) {
    EXPECT_TRUE(cluster_->shard(shard)
                    .WaitForLine("worker 0 is back after its eviction", 10000)
                    .ok())
        << "shard " << shard;
  }
  auto code = (*client)->Wait(60000);
  ASSERT_TRUE(code.ok()) << code.status().ToString();
  const std::string log = (*client)->Log();
  EXPECT_EQ(*code, 0) << Tail(log, 10);
  EXPECT_NE(log.find("done, 300 iterations"), std::string::npos)
      << Tail(log, 10);
  // It did lose its connections on the way, and came back.
  EXPECT_NE(log.find("reconnected to shard"), std::string::npos)
      << Tail(log, 10);
}

TEST_F(Failure, KilledWorkerCostsAtMostOnePercentOfAccuracy) {
  double clean = 0;
  {
    ASSERT_NO_FATAL_FAILURE(StartCluster(3, {"--worker-timeout-ms", "2000"}));
    ASSERT_NO_FATAL_FAILURE(StartTraining(3, 4));
    ASSERT_NO_FATAL_FAILURE(FinishAll());
    clean = FinalAccuracy();
    workers_.clear();
    cluster_.reset();
  }
  ASSERT_NO_FATAL_FAILURE(StartCluster(3, {"--worker-timeout-ms", "2000"}));
  ASSERT_NO_FATAL_FAILURE(StartTraining(3, 4));
  ASSERT_TRUE(Eventually([&] { return ClockOf(2) >= 100; }, 60000));
  workers_[2]->Signal(SIGKILL);
  for (int r = 0; r < 2; ++r) {
    auto code = workers_[r]->Wait(180000);
    ASSERT_TRUE(code.ok());
    EXPECT_EQ(*code, 0) << Tail(workers_[r]->Log(), 10);
  }
  const double survived = FinalAccuracy();
  EXPECT_GT(clean, 75);
  EXPECT_NEAR(survived, clean, 1.0)
      << "clean " << clean << "%, one killed " << survived << "%";
}

TEST_F(Failure, BackupWorkersCloseClocksWithoutTheStraggler) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(3, {"--backup-workers", "1"}));
  // BSP (bound 0); rank 2 is five times slower. The MLP, not softmax:
  // softmax's compute is so small next to a clock's round trip that five
  // times it did not always make rank 2 the slowest on a loaded machine.
  std::vector<std::string> flags = {"--model",     "mlp", "--hidden",     "64",
                                    "--epochs",    "2",   "--batch",      "100",
                                    "--staleness", "0",   "--eval-every", "0"};
  for (int r = 0; r < 3; ++r) {
    std::vector<std::string> argv = {TETHER_WORKER_BIN,       "--coordinator",
                                     cluster_->coordinator(), "--rank",
                                     std::to_string(r),       "--quiet"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    if (r == 2) {
      argv.push_back("--slowdown");
      argv.push_back("5");
    }
    auto p = Process::Start(
        argv, dir_.path() + "/worker" + std::to_string(r) + ".log");
    ASSERT_TRUE(p.ok());
    workers_.push_back(std::move(*p));
  }
  // The fast two finish without waiting for the slow one each clock.
  for (int r = 0; r < 2; ++r) {
    auto code = workers_[r]->Wait(180000);
    ASSERT_TRUE(code.ok());
    EXPECT_EQ(*code, 0) << Tail(workers_[r]->Log(), 10);
  }
  auto stats = Stats();
  ASSERT_EQ(stats.size(), 2u);
  EXPECT_TRUE(workers_[2]->Running() ||
              stats[0].workers[2].samples < stats[0].workers[0].samples)
      << "the slow worker kept up: backup workers made no difference";
  // The slow worker's pushes arrive after their clocks closed; the fast two
  // may finish before its first one does.
  EXPECT_TRUE(Eventually(
      [&] {
        uint64_t late = 0;
        for (const ShardStats& s : Stats()) late += s.late_pushes;
        return late > 0;
      },
      30000))
      << "no push arrived after its clock closed";
  EXPECT_GT(FinalAccuracy(), 70);
}

TEST_F(Failure, StalenessAwareRateScalesAStalePush) {
  ClusterOptions o;
  o.shards = 1;
  o.workers = 2;
  o.optimizer = "sgd";
  o.lr = 1.0f;
  o.block_size = 16;
  o.extra_flags = {"--staleness-lr"};
  auto c = Cluster::Start(o, dir_.path());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  cluster_ = std::move(*c);
  auto w = ConnectWorkers(cluster_->coordinator(), {-1, -1});
  ASSERT_EQ(w.size(), 2u);
  for (auto& client : w) ASSERT_TRUE(client->DefineTensor("w", {4}).ok());
  std::vector<float> before(4), after(4), grad(4, 1.0f);
  ASSERT_TRUE(w[1]->Pull("w", before).ok());  // read at clock 0
  for (int k = 0; k < 3; ++k) ASSERT_TRUE(w[0]->Clock().ok());
  ASSERT_TRUE(w[1]->Push("w", grad).ok());  // 3 clocks stale
  ASSERT_TRUE(w[1]->Pull("w", after).ok());
  for (int i = 0; i < 4; ++i) {
    // SGD at lr 1 would move it by 1; staleness 3 scales that by 1/4.
    EXPECT_FLOAT_EQ(before[i] - after[i], 0.25f) << i;
  }
}

TEST_F(Failure, RestartedWorkerRejoinsAndEveryRowIsUsedOnce) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(3, {"--worker-timeout-ms", "2000"}));
  ASSERT_NO_FATAL_FAILURE(StartTraining(3, 2, {"--chunk-rows", "2000"}));
  ASSERT_TRUE(Eventually([&] { return ClockOf(2) >= 40; }, 60000));
  workers_[2]->Signal(SIGKILL);
  ASSERT_TRUE(workers_[2]->Wait(5000).ok());
  // The same rank comes back and asks for chunks again.
  auto again = Process::Start(
      {TETHER_WORKER_BIN, "--coordinator", cluster_->coordinator(), "--rank",
       "2", "--quiet", "--model", "softmax", "--epochs", "2", "--staleness",
       "2", "--batch", "100", "--eval-every", "0", "--chunk-rows", "2000"},
      dir_.path() + "/worker2-again.log");
  ASSERT_TRUE(again.ok());
  workers_[2] = std::move(*again);
  ASSERT_NO_FATAL_FAILURE(FinishAll());
  EXPECT_NE(workers_[2]->Log().find("done in"), std::string::npos)
      << Tail(workers_[2]->Log(), 5);

  auto stats = Stats();
  ASSERT_FALSE(stats.empty());
  const ShardStats& s0 = stats[0];
  ASSERT_EQ(s0.data_epochs.size(), 2u);
  for (const ShardStats::DataEpoch& e : s0.data_epochs) {
    EXPECT_EQ(e.chunks_total, 30u) << "epoch " << e.epoch;
    EXPECT_EQ(e.chunks_done, 30u) << "epoch " << e.epoch;
    EXPECT_EQ(e.rows_done, 60000u) << "epoch " << e.epoch;
    EXPECT_EQ(e.duplicates, 0u) << "epoch " << e.epoch;
  }
  // The killed worker's chunk went back to the pool and was done again.
  EXPECT_GE(s0.chunks_reassigned, 1u);
  EXPECT_GT(FinalAccuracy(), 70);
}

// A shard killed and restarted with --resume; every worker reconnects and
// the run finishes. `overlap`: workers with --overlap-steps, whose clock and
// prefetch are in flight when the shard dies.
void Failure::KillAndResumeShard(bool overlap) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(2, {"--checkpoint-every", "40"}));
  ASSERT_NO_FATAL_FAILURE(StartTraining(
      2, 4, {std::string("--overlap-steps=") + (overlap ? "true" : "false")}));
  auto round = WaitForRoundComplete(cluster_->shard(0), 80, 60000);
  ASSERT_TRUE(round.ok()) << round.status().ToString();
  // Shard 1 dies; it comes back on the same address with --resume.
  const std::string address = cluster_->address(1);
  cluster_->shard(1).Signal(SIGKILL);
  ASSERT_TRUE(cluster_->shard(1).Wait(5000).ok());
  std::this_thread::sleep_for(milliseconds(500));
  auto again =
      Process::Start({TETHER_SERVER_BIN, "--shard-id", "1", "--shards", "2",
                      "--listen", address, "--http", "127.0.0.1:0",
                      "--coordinator", cluster_->coordinator(), "--data-dir",
                      dir_.path() + "/shard1", "--resume", "latest"},
                     dir_.path() + "/shard1-again.log");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  auto resumed = (*again)->WaitForLine("loaded checkpoint round", 10000);
  ASSERT_TRUE(resumed.ok()) << resumed.status().ToString() << "\n"
                            << Tail((*again)->Log(), 10);
  // Every worker says what it waits for, reconnects, and finishes.
  ASSERT_NO_FATAL_FAILURE(FinishAll());
  for (auto& w : workers_) {
    EXPECT_NE(w->Log().find("reconnected to shard 1"), std::string::npos)
        << Tail(w->Log(), 10);
  }
  EXPECT_GT(FinalAccuracy(), 70);
  (*again)->Signal(SIGTERM);
  EXPECT_TRUE((*again)->Wait(5000).ok());
}

TEST_F(Failure, KilledShardRestartedWithResumeAndTheRunFinishes) {
  KillAndResumeShard(/*overlap=*/false);
}

TEST_F(Failure, KilledShardRestartedWithResumeAndOverlappingWorkersFinish) {
  KillAndResumeShard(/*overlap=*/true);
}

}  // namespace
}  // namespace tether::testing

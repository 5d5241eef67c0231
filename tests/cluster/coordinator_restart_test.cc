// The coordinator can die: shard 0 of a running 2-shard, 4-worker run is
// killed with SIGKILL and started again (same --listen and --data-dir,
// --resume latest). Shard 1 and the workers keep their processes, wait for
// it, register again, and the run completes as well as an uninterrupted
// one does.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <regex>
#include <thread>

#include "tests/support/cluster.h"

namespace tether::testing {
namespace {

int CountOf(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos;
       at = text.find(what, at + 1)) {
    ++n;
  }
  return n;
}

class CoordinatorRestart : public ::testing::Test {
 protected:
  // 4 workers, 5 epochs of 150 clocks each; a round every 10 clocks. Small
  // (softmax) so that it also runs under ThreadSanitizer in time; slowed
  // there too, so that rounds are not skipped (shard 0 would then go back
  // further than 10 clocks). Rank 0 evaluates every 5 clocks in the
  // foreground, and reports then (each of its lines carries a fresh
  // evaluation; in the background, the default, a line would carry the
  // last one finished, and each result would count twice).
  void Start() {
    ClusterOptions o;
    o.shards = 2;
    o.workers = 4;
    o.seed = 5;
    o.max_staleness = 2;
    o.optimizer = "adam";
    o.lr = 0.001f;
    o.block_size = 4096;
    o.extra_flags = {"--checkpoint-every", "10", "--worker-timeout-ms", "2000"};
    auto c = Cluster::Start(o, dir_.path());
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    cluster_ = std::move(*c);
    workers_ = StartWorkers(
        cluster_->coordinator(), 4, dir_.path(),
        {"--model", "softmax", "--epochs", "5", "--staleness", "2", "--batch",
         "100", "--eval-every", "5", "--report-every", "5", "--quiet=false",
         "--slowdown", "3", "--eval-in-background=false"});
    ASSERT_EQ(workers_.size(), 4u);
  }
  // Every worker exits 0. Returns the run's test accuracy (percent): the
  // mean of every evaluation in its last two epochs (rank 0's, every 5
  // clocks, and each worker's final one). One evaluation of an async run's
  // weights moves about a point from run to run with the last few steps;
  // the mean over 60 of them is what the run learned.
  double Finish() {
    double sum = 0;
    int count = 0;
    for (auto& w : workers_) {
      auto code = w->Wait(240000);
      EXPECT_TRUE(code.ok()) << code.status().ToString();
      EXPECT_EQ(code.ok() ? *code : -1, 0) << w->log_path() << ":\n"
                                           << Tail(w->Log(), 15);
      const std::string log = w->Log();
      const int before = count;
      for (size_t at = log.find(" epoch "); at != std::string::npos;
           at = log.find(" epoch ", at + 1)) {
        if (log.compare(at, 11, " epoch 4/5 ") != 0 &&
            log.compare(at, 11, " epoch 5/5 ") != 0) {
          continue;
        }
        const size_t end = log.find('\n', at);
        const size_t acc = log.find("test accuracy ", at);
        if (acc == std::string::npos || acc > end) continue;
        sum += std::atof(log.c_str() + acc + 14);
        ++count;
      }
      EXPECT_GT(count, before) << "no test accuracy in its last epochs:\n"
                               << Tail(log, 5);
    }
    EXPECT_GE(count, 40) << "too few evaluations in the last two epochs";
    return count == 0 ? 0 : sum / count;
  }
  // Kills shard 0 once it has completed a round at or past 100 (under
  // load a round is skipped while the one before is still being written),
  // waits `down`, starts it again.
  void KillAndRestartCoordinator(std::chrono::milliseconds down) {
    const std::regex past_100("checkpoint round [1-9][0-9]{2,} complete");
    ASSERT_TRUE(Eventually(
        [&] { return std::regex_search(cluster_->shard(0).Log(), past_100); },
        120000))
        << Tail(cluster_->shard(0).Log(), 20);
    const pid_t shard1 = cluster_->shard(1).pid();
    cluster_->shard(0).Signal(SIGKILL);
    ASSERT_TRUE(cluster_->shard(0).Wait(5000).ok());
    std::this_thread::sleep_for(down);
    // Shard 1 is still the same process, waiting.
    EXPECT_TRUE(cluster_->shard(1).Running())
        << Tail(cluster_->shard(1).Log(), 20);
    EXPECT_EQ(cluster_->shard(1).pid(), shard1);
    for (auto& w : workers_) {
      EXPECT_TRUE(w->Running()) << Tail(w->Log(), 10);
    }
    Status restarted = cluster_->Restart(0, {"--resume", "latest"});
    ASSERT_TRUE(restarted.ok()) << restarted.ToString();
    auto back = cluster_->shard(0).WaitForLine(
        "took the running run back from checkpoint round", 30000);
    ASSERT_TRUE(back.ok()) << Tail(cluster_->shard(0).Log(), 20);
  }
  void ExpectEveryoneCameBack() {
    const std::string shard1 = cluster_->shard(1).Log();
    EXPECT_EQ(CountOf(shard1, "lost the coordinator"), 1) << Tail(shard1, 20);
    EXPECT_EQ(CountOf(shard1, "registered again with the coordinator"), 1)
        << Tail(shard1, 20);
    EXPECT_NE(cluster_->shard(0).Log().find("shard 1 registered again at " +
                                            cluster_->address(1)),
              std::string::npos)
        << Tail(cluster_->shard(0).Log(), 20);
    for (auto& w : workers_) {
      EXPECT_NE(w->Log().find("reconnected to shard 0"), std::string::npos)
          << Tail(w->Log(), 10);
    }
  }

  // The final accuracy of the same run without a kill, once.
  static double Uninterrupted() {
    static double accuracy = [] {
      CoordinatorRestart run;
      run.Start();
      return run.Finish();
    }();
    return accuracy;
  }

  void TestBody() override {}  // Uninterrupted() makes one of its own

  TempDir dir_;
  std::unique_ptr<Cluster> cluster_;
  std::vector<std::unique_ptr<Process>> workers_;
};

TEST_F(CoordinatorRestart, KilledCoordinatorRestartedTakesTheRunBack) {
  const double expected = Uninterrupted();
  ASSERT_GT(expected, 78);
  ASSERT_NO_FATAL_FAILURE(Start());
  ASSERT_NO_FATAL_FAILURE(
      KillAndRestartCoordinator(std::chrono::milliseconds(500)));
  const double accuracy = Finish();
  std::printf(
      "last two epochs' mean test accuracy %.2f%%, uninterrupted %.2f%%\n",
      accuracy, expected);
  EXPECT_NEAR(accuracy, expected, 1.0);
  ASSERT_NO_FATAL_FAILURE(ExpectEveryoneCameBack());
}

TEST_F(CoordinatorRestart, CoordinatorDownLongerThanTheWorkerTimeout) {
  const double expected = Uninterrupted();
  ASSERT_GT(expected, 78);
  ASSERT_NO_FATAL_FAILURE(Start());
  // 5 s: more than twice the run's --worker-timeout-ms of 2 s.
  ASSERT_NO_FATAL_FAILURE(
      KillAndRestartCoordinator(std::chrono::milliseconds(5000)));
  const double accuracy = Finish();
  std::printf(
      "last two epochs' mean test accuracy %.2f%%, uninterrupted %.2f%%\n",
      accuracy, expected);
  EXPECT_NEAR(accuracy, expected, 1.0);
  ASSERT_NO_FATAL_FAILURE(ExpectEveryoneCameBack());
}

}  // namespace
}  // namespace tether::testing

// Elastic membership with real processes: workers join a running run (rank
// -1: shard 0 picks a free one) and leave it (SIGTERM), and a chunked run
// killed mid-epoch resumes on another number of workers; in every case each
// row of each epoch is trained exactly once.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdlib>
#include <numeric>

#include "tests/support/cluster.h"
#include "tests/support/worker_pool.h"
#include "tools/http_client.h"

namespace tether::testing {
namespace {

class Elastic : public ::testing::Test {
 public:
  void StartCluster(int workers, std::vector<std::string> flags = {}) {
    ClusterOptions o;
    o.shards = 2;
    o.workers = workers;
    o.max_staleness = 2;
    o.optimizer = "adam";
    o.lr = 0.001f;
    o.block_size = 4096;
    o.extra_flags = std::move(flags);
    auto c = Cluster::Start(o, dir_.path());
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    cluster_ = std::move(*c);
  }
  // One tether-worker claiming `rank` (-1: shard 0 picks).
  std::unique_ptr<Process> StartWorker(int rank, const std::string& tag) {
    std::vector<std::string> argv = {TETHER_WORKER_BIN,
                                     "--coordinator",
                                     cluster_->coordinator(),
                                     "--rank",
                                     std::to_string(rank),
                                     "--quiet",
                                     "--staleness",
                                     "2",
                                     "--batch",
                                     "100",
                                     "--eval-every",
                                     "0",
                                     "--report-every",
                                     "5"};
    argv.insert(argv.end(), worker_flags_.begin(), worker_flags_.end());
    auto p = Process::Start(argv, dir_.path() + "/" + tag + ".log");
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return p.ok() ? std::move(*p) : nullptr;
  }
  std::vector<ShardStats> Stats() {
    auto observer = ConnectObserver(cluster_->coordinator());
    if (observer == nullptr) return {};
    auto stats = observer->Stats();
    return stats.ok() ? *stats : std::vector<ShardStats>{};
  }
  // Shard 0's record of `rank`, or a default one.
  ShardStats::Worker WorkerStats(int rank) {
    auto stats = Stats();
    if (stats.empty() || rank >= static_cast<int>(stats[0].workers.size())) {
      return {};
    }
    return stats[0].workers[rank];
  }
  void ExpectExitsZero(Process& p) {
    auto code = p.Wait(240000);
    ASSERT_TRUE(code.ok()) << code.status().ToString();
    EXPECT_EQ(*code, 0) << p.log_path() << ":\n" << Tail(p.Log(), 10);
  }
  double FinalAccuracy(Process& p) {
    const std::string log = p.Log();
    auto at = log.rfind("test accuracy ");
    EXPECT_NE(at, std::string::npos) << Tail(log, 5);
    return at == std::string::npos ? -1 : std::atof(log.c_str() + at + 14);
  }
  // Every epoch's chunks completed once, all 60000 rows.
  void ExpectEveryRowOnce(int epochs) {
    auto stats = Stats();
    ASSERT_FALSE(stats.empty());
    ASSERT_EQ(stats[0].data_epochs.size(), static_cast<size_t>(epochs));
    for (const ShardStats::DataEpoch& e : stats[0].data_epochs) {
      EXPECT_EQ(e.chunks_done, e.chunks_total) << "epoch " << e.epoch;
      EXPECT_EQ(e.rows_done, 60000u) << "epoch " << e.epoch;
      EXPECT_EQ(e.duplicates, 0u) << "epoch " << e.epoch;
    }
  }

  // Starts with 2 workers, grows to 4 (two joining with rank -1) and
  // shrinks to 3 (one joiner stopped with SIGTERM); every worker exits 0.
  void GrowAndShrink() {
    ASSERT_NO_FATAL_FAILURE(StartCluster(2));
    std::vector<std::unique_ptr<Process>> w;
    w.push_back(StartWorker(0, "worker0"));
    w.push_back(StartWorker(1, "worker1"));
    ASSERT_TRUE(Eventually([&] { return WorkerStats(0).clock >= 20; }, 60000))
        << Tail(w[0]->Log(), 10);
    w.push_back(StartWorker(-1, "joined-a"));
    w.push_back(StartWorker(-1, "joined-b"));
    // Both get a free rank and train.
    ASSERT_TRUE(Eventually(
        [&] {
          return WorkerStats(2).samples > 0 && WorkerStats(3).samples > 0;
        },
        90000))
        << Tail(w[2]->Log(), 10) << Tail(w[3]->Log(), 10);
    EXPECT_GT(WorkerStats(0).clock, 20) << "the run went on while they joined";
    // The last joiner leaves for good: shard 0 hears it at once.
    w[3]->Signal(SIGTERM);
    ASSERT_NO_FATAL_FAILURE(ExpectExitsZero(*w[3]));
    // Which free rank it had (2 or 3: the joiners race for them) its last
    // line says: "worker R: epoch ...".
    const std::string last = w[3]->Log();
    const size_t at = last.rfind("worker ");
    ASSERT_NE(at, std::string::npos) << last;
    const int gone = std::atoi(last.c_str() + at + 7);
    ASSERT_TRUE(gone == 2 || gone == 3) << last;
    ASSERT_TRUE(Eventually([&] { return WorkerStats(gone).left; }, 5000));
    for (int r = 0; r < 3; ++r) ASSERT_NO_FATAL_FAILURE(ExpectExitsZero(*w[r]));
    for (int r = 0; r < 3; ++r) {
      EXPECT_GT(FinalAccuracy(*w[r]), 80) << "worker " << r;
    }
    // The dashboard's events say who joined and who left.
    auto events = HttpFetch(cluster_->dashboard(), "GET", "/api/events");
    ASSERT_TRUE(events.ok()) << events.status().ToString();
    // Each as "worker R (HOST) joined": the host is this machine's name.
    const std::string& body = events->body;
    for (const auto& [who, what] :
         std::vector<std::pair<std::string, std::string>>{
             {"worker 2", " joined"},
             {"worker 3", " joined"},
             {"worker " + std::to_string(gone), " left the run"}}) {
      bool found = false;
      for (size_t at = body.find(who + " "); at != std::string::npos && !found;
           at = body.find(who + " ", at + 1)) {
        const size_t end = body.find('"', at);
        found = body.substr(at, end - at).find(what) != std::string::npos;
      }
      EXPECT_TRUE(found) << who << what << " is not among the events: " << body;
    }
  }

  TempDir dir_;
  std::unique_ptr<Cluster> cluster_;
  // Slow enough (several seconds an epoch, on a loaded machine too) that
  // the joiners, which take seconds to load the data, come in before the
  // last of the 4 epochs.
  std::vector<std::string> worker_flags_ = {
      "--epochs", "4",   "--model",    "mlp",
      "--hidden", "128", "--slowdown", kUnderTsan ? "2" : "5"};
};

TEST_F(Elastic, ChunkedRunGrowsToFourShrinksToThreeAndTrainsEveryRowOnce) {
  worker_flags_.insert(worker_flags_.end(), {"--chunk-rows", "2000"});
  ASSERT_NO_FATAL_FAILURE(GrowAndShrink());
  ASSERT_NO_FATAL_FAILURE(ExpectEveryRowOnce(4));
}

TEST_F(Elastic, StaticSharesRunGrowsToFourShrinksToThreeEveryRowOnce) {
  ASSERT_NO_FATAL_FAILURE(GrowAndShrink());
  // The worker that left mid-epoch left the rest of its share to the
  // others: 4 epochs of 60000 rows were trained, no more, no less.
  uint64_t trained = 0;
  for (int r = 0; r < 4; ++r) trained += WorkerStats(r).samples;
  EXPECT_EQ(trained, 4u * 60000u);
  EXPECT_NE(cluster_->shard(0).Log().find("leaves part of a share of epoch"),
            std::string::npos)
      << Tail(cluster_->shard(0).Log(), 20);
}

// --max-workers caps the ranks: a worker beyond it is refused saying so,
// and a rank freed by a worker that left is given to the next one.
TEST_F(Elastic, MaxWorkersRefusesOneMoreAndFreedRankIsTakenAgain) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(1, {"--max-workers", "2"}));
  auto two = ConnectWorkers(cluster_->coordinator(), {-1, -1});
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0]->rank(), 0);
  EXPECT_EQ(two[1]->rank(), 1);
  ClientOptions o;
  o.coordinator = cluster_->coordinator();
  o.join_timeout_ms = 10000;
  auto third = Client::Connect(o);
  ASSERT_FALSE(third.ok());
  EXPECT_NE(third.status().message().find("cluster full"), std::string::npos)
      << third.status().message();
  EXPECT_NE(third.status().message().find("--max-workers"), std::string::npos)
      << third.status().message();
  ASSERT_TRUE(two[1]->Leave("done here").ok());
  two[1].reset();
  std::unique_ptr<Client> next;
  ASSERT_TRUE(Eventually(
      [&] {
        auto c = Client::Connect(o);
        if (c.ok()) next = std::move(*c);
        return next != nullptr;
      },
      10000));
  EXPECT_EQ(next->rank(), 1);
}

// Runs 2 workers with `worker_flags_` until shard 0's round 60, kills every
// process, and resumes the run with --workers `workers`.
void KillAtRound60AndResume(Elastic& t, int workers) {
  ASSERT_NO_FATAL_FAILURE(t.StartCluster(2, {"--checkpoint-every", "60"}));
  {
    std::vector<std::unique_ptr<Process>> w;
    w.push_back(t.StartWorker(0, "first-worker0"));
    w.push_back(t.StartWorker(1, "first-worker1"));
    ASSERT_TRUE(t.cluster_->shard(0)
                    .WaitForLine("checkpoint round 60 complete", 120000)
                    .ok());
    for (auto& p : w) p->Signal(SIGKILL);
    for (int i = 0; i < 2; ++i) t.cluster_->shard(i).Signal(SIGKILL);
  }
  t.cluster_.reset();
  ClusterOptions o;
  o.shards = 2;
  o.run_flags = false;
  o.extra_flags = {"--resume", "latest", "--workers", std::to_string(workers)};
  auto c = Cluster::Start(o, t.dir_.path());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  t.cluster_ = std::move(*c);
  ASSERT_TRUE(t.cluster_->shard(0)
                  .WaitForLine("resumed from checkpoint round", 10000)
                  .ok());
}

// Resumed workers 0..n-1 run to the end; the samples they trained.
uint64_t FinishResumed(Elastic& t, int n) {
  std::vector<std::unique_ptr<Process>> w;
  for (int r = 0; r < n; ++r) {
    w.push_back(t.StartWorker(r, "second-worker" + std::to_string(r)));
  }
  for (auto& p : w) t.ExpectExitsZero(*p);
  uint64_t trained = 0;
  for (int r = 0; r < n; ++r) trained += t.WorkerStats(r).samples;
  return trained;
}

// The round holds 60 clocks of both workers' batches of 100: 12000 rows of
// the epoch. Resumed on another number of workers, the run trains the
// other 48000, each once.
TEST_F(Elastic, ChunkedRunKilledMidEpochResumesOnMoreWorkersEveryRowOnce) {
  worker_flags_ = {"--epochs",     "1",   "--model", "softmax",
                   "--chunk-rows", "2500"};
  ASSERT_NO_FATAL_FAILURE(KillAtRound60AndResume(*this, 3));
  auto stats = Stats();
  ASSERT_FALSE(stats.empty());
  ASSERT_EQ(stats[0].data_epochs.size(), 1u)
      << "the round kept no chunk progress";
  // The third chunk of each worker only partly.
  EXPECT_EQ(stats[0].data_epochs[0].rows_done, 12000u);
  EXPECT_EQ(FinishResumed(*this, 3), 48000u)
      << "the resumed workers trained rows the round already held, or "
         "missed some";
  ASSERT_NO_FATAL_FAILURE(ExpectEveryRowOnce(1));
}

// Fixed shares, resumed on one worker: rank 1's share is handed to rank 0
// from where the round has it.
TEST_F(Elastic,
       StaticSharesRunKilledMidEpochResumesOnFewerWorkersEveryRowOnce) {
  worker_flags_ = {"--epochs", "1", "--model", "softmax"};
  ASSERT_NO_FATAL_FAILURE(KillAtRound60AndResume(*this, 1));
  EXPECT_EQ(FinishResumed(*this, 1), 48000u);
  EXPECT_NE(cluster_->shard(0).Log().find("go to the others"),
            std::string::npos)
      << Tail(cluster_->shard(0).Log(), 20);
}

}  // namespace
}  // namespace tether::testing

// Every push counts: several worker processes push thousands of known
// gradients through several shards, and the final weights are the exact sums.
#include <gtest/gtest.h>

#include "tests/support/cluster.h"
#include "tests/support/worker_pool.h"

namespace tether::testing {
namespace {

TEST(NothingLost, FinalWeightsAreExactSumsOfAllPushes) {
  constexpr int kShards = 3, kWorkers = 4, kIterations = 500, kSize = 5000;
  TempDir dir;
  ClusterOptions o;
  o.shards = kShards;
  o.workers = kWorkers;
  o.block_size = 1000;
  o.lr = 1.0f;
  o.optimizer = "sgd";
  auto cluster = Cluster::Start(o, dir.path());
  ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();

  std::vector<std::unique_ptr<Process>> workers;
  for (int r = 0; r < kWorkers; ++r) {
    auto p = Process::Start(
        {TETHER_CLIENT_BIN, "train", "--coordinator", (*cluster)->coordinator(),
         "--tensor", "w", "--shape", std::to_string(kSize), "--iterations",
         std::to_string(kIterations), "--staleness", "2", "--grad", "pattern",
         "--quiet"},
        dir.path() + "/worker" + std::to_string(r) + ".log");
    ASSERT_TRUE(p.ok());
    workers.push_back(std::move(*p));
  }
  for (auto& w : workers) {
    auto code = w->Wait(120000);
    ASSERT_TRUE(code.ok()) << code.status().ToString();
    EXPECT_EQ(*code, 0) << Tail(w->Log(), 10);
  }

  auto observer = ConnectObserver((*cluster)->coordinator());
  ASSERT_NE(observer, nullptr);
  ASSERT_TRUE(observer->DefineTensor("w", {kSize}).ok());
  std::vector<float> w(kSize);
  ASSERT_TRUE(observer->Pull("w", w).ok());
  // Worker r pushes -(r + 1 + k % 5 + i % 7) at iteration k; SGD with
  // lr = 1 from zero adds it back. Integers this small are exact in f32.
  size_t wrong = 0;
  for (int i = 0; i < kSize; ++i) {
    double expected = 0;
    for (int r = 0; r < kWorkers; ++r) {
      for (int k = 0; k < kIterations; ++k) expected += r + 1 + k % 5 + i % 7;
    }
    if (w[i] != static_cast<float>(expected)) {
      if (++wrong < 5)
        ADD_FAILURE() << "w[" << i << "] = " << w[i] << ", expected "
                      << expected;
    }
  }
  EXPECT_EQ(wrong, 0u);

  auto stats = observer->Stats();
  ASSERT_TRUE(stats.ok());
  uint64_t pushes = 0;
  for (const ShardStats& s : *stats) {
    pushes += s.pushes;
    for (const auto& worker : s.workers) EXPECT_EQ(worker.clock, kIterations);
  }
  // Each push of 5 blocks reaches every shard that holds one of them.
  EXPECT_EQ(pushes, uint64_t{kWorkers} * kIterations * kShards);
}

}  // namespace
}  // namespace tether::testing

// Non-finite numbers never reach the model: pushes holding NaN or Inf are
// refused and counted, an update that would overflow a weight is refused
// with its block left as it was, and a worker whose loss turns non-finite
// stops with a clear message -- with real shards, workers and tether-up.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>

#include "tests/support/cluster.h"
#include "tests/support/worker_pool.h"
#include "tools/http_client.h"

namespace tether::testing {
namespace {

bool Has(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(NonFinite, NanInfAndOverflowingPushesRefusedCountedWeightsUnchanged) {
  TempDir dir;
  ClusterOptions o;
  o.shards = 2;
  o.workers = 1;
  o.optimizer = "sgd";
  o.lr = 10.0f;
  o.block_size = 1000;
  o.extra_flags = {"--dashboard-interval-ms", "50"};
  auto cluster = Cluster::Start(o, dir.path());
  ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
  auto workers = ConnectWorkers((*cluster)->coordinator(), {-1});
  ASSERT_EQ(workers.size(), 1u);
  Client& worker = *workers[0];
  constexpr size_t kSize = 5000;
  ASSERT_TRUE(
      worker.DefineTensor("w", {kSize}, {InitKind::kUniform, 0.1f}).ok());
  std::vector<float> before(kSize), after(kSize), grad(kSize, 0.0f);
  ASSERT_TRUE(worker.Pull("w", before).ok());

  grad[1234] = std::numeric_limits<float>::quiet_NaN();
  Status nan = worker.Push("w", grad);
  EXPECT_EQ(nan.code(), Code::kNonFinite) << nan.ToString();
  EXPECT_TRUE(Has(nan.message(), "tensor 'w'")) << nan.message();
  EXPECT_TRUE(Has(nan.message(), "NaN at element 1234")) << nan.message();

  grad[1234] = 0;
  grad[4321] = -std::numeric_limits<float>::infinity();
  Status inf = worker.Push("w", grad);
  EXPECT_EQ(inf.code(), Code::kNonFinite) << inf.ToString();
  EXPECT_TRUE(Has(inf.message(), "Inf at element 4321")) << inf.message();

  // Finite, but lr * 3e38 overflows every weight to -Inf.
  std::fill(grad.begin(), grad.end(), 3e38f);
  Status overflow = worker.Push("w", grad);
  EXPECT_EQ(overflow.code(), Code::kNonFinite) << overflow.ToString();
  EXPECT_TRUE(Has(overflow.message(), "overflow")) << overflow.message();

  ASSERT_TRUE(worker.Pull("w", after).ok());
  EXPECT_TRUE(SameBits(before, after)) << "a refused push changed weights";

  // An ordinary push still trains.
  std::fill(grad.begin(), grad.end(), 0.01f);
  ASSERT_TRUE(worker.Push("w", grad).ok());
  ASSERT_TRUE(worker.Pull("w", after).ok());
  EXPECT_FLOAT_EQ(after[0], before[0] - 0.1f);

  // Counted per worker and shard: blocks alternate between the shards, so
  // the NaN and the Inf are each refused by one shard, the overflow by
  // both. In /metrics and as dashboard events.
  const std::string sample =
      "tether_worker_nonfinite_pushes_total{rank=\"0\"} 4";
  std::string metrics;
  EXPECT_TRUE(Eventually(
      [&] {
        auto reply = HttpFetch((*cluster)->dashboard(), "GET", "/metrics");
        metrics = reply.ok() ? reply->body : "";
        return Has(metrics, sample);
      },
      10000))
      << metrics;
  auto events = HttpFetch((*cluster)->dashboard(), "GET", "/api/events");
  ASSERT_TRUE(events.ok());
  EXPECT_TRUE(Has(events->body, "refused as non-finite")) << events->body;
  auto workers_doc = HttpFetch((*cluster)->dashboard(), "GET", "/api/workers");
  ASSERT_TRUE(workers_doc.ok());
  EXPECT_TRUE(Has(workers_doc->body, "\"nonfinite_pushes\":4"))
      << workers_doc->body;
  EXPECT_TRUE(Has((*cluster)->shard(0).Log(), "non-finite so far"));
}

// The same for sparse rows, and for BSP, whose pushes wait to be applied
// in rank order: a non-finite gradient is refused before it waits.
TEST(NonFinite, SparseAndBspPushesRefusedBeforeTheyApply) {
  TempDir dir;
  ClusterOptions o;
  o.shards = 2;
  o.workers = 1;
  o.optimizer = "adagrad";
  auto cluster = Cluster::Start(o, dir.path());
  ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
  auto workers = ConnectWorkers((*cluster)->coordinator(), {0});
  ASSERT_EQ(workers.size(), 1u);
  Client& worker = *workers[0];
  ASSERT_TRUE(worker.DefineTable("emb", 4).ok());
  // Each row lives on one shard; refusal is that shard's.
  const std::vector<uint64_t> keys = {17};
  std::vector<float> before(4), after(4);
  ASSERT_TRUE(worker.PullRows("emb", keys, before).ok());
  std::vector<float> grad(4, 0.5f);
  grad[2] = std::numeric_limits<float>::infinity();
  Status s = worker.PushRows("emb", keys, grad);
  EXPECT_EQ(s.code(), Code::kNonFinite) << s.ToString();
  EXPECT_TRUE(Has(s.message(), "tensor 'emb'")) << s.message();
  ASSERT_TRUE(worker.Clock().ok());
  ASSERT_TRUE(worker.PullRows("emb", keys, after).ok());
  EXPECT_TRUE(SameBits(before, after));
  // A finite push of the same worker at the next clock applies.
  grad[2] = 0.5f;
  ASSERT_TRUE(worker.PushRows("emb", keys, grad).ok());
  ASSERT_TRUE(worker.Clock().ok());
  ASSERT_TRUE(worker.PullRows("emb", keys, after).ok());
  EXPECT_FALSE(SameBits(before, after));
}

// A LIBSVM file of extreme but finite values: logistic regression's loss
// overflows after the first update.
std::string ExtremeData(const std::string& dir) {
  const std::string path = dir + "/extreme.libsvm";
  std::ofstream out(path);
  for (int i = 0; i < 400; ++i) {
    out << (i % 2 ? "1" : "0") << " 1:" << (i % 3 ? "3e37" : "-2e37")
        << " 2:1e38 " << (i % 7 + 3) << ":0.5\n";
  }
  return path;
}

TEST(NonFinite, DivergingWorkerStopsSayingWhyAndTetherUpReportsIt) {
  TempDir dir;
  const std::string data = ExtremeData(dir.path());
  ClusterOptions o;
  o.workers = 1;
  o.optimizer = "sgd";
  o.lr = 0.5f;
  auto cluster = Cluster::Start(o, dir.path());
  ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
  std::string out;
  auto code = RunToExit(
      {TETHER_WORKER_BIN, "--coordinator", (*cluster)->coordinator(), "--model",
       "sparse-lr", "--data", data, "--epochs", "3", "--batch", "20"},
      &out, 60000);
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 1) << out;
  EXPECT_TRUE(Has(out, "the training loss is ")) << out;
  EXPECT_TRUE(Has(out, "the model diverged")) << out;

  std::string up;
  auto up_code = RunToExit({TETHER_UP_BIN,
                            "--http",
                            "127.0.0.1:0",
                            "--shards",
                            "1",
                            "--workers",
                            "1",
                            "--slow",
                            "0",
                            "--model",
                            "sparse-lr",
                            "--data",
                            data,
                            "--lr",
                            "0.5",
                            "--optimizer",
                            "sgd",
                            "--epochs",
                            "3",
                            "--linger",
                            "0",
                            "--log-dir",
                            dir.path() + "/up"},
                           &up, 120000);
  ASSERT_TRUE(up_code.ok());
  EXPECT_NE(*up_code, 0) << up;
  EXPECT_TRUE(Has(up, "worker 0 failed")) << up;
  EXPECT_TRUE(Has(up, "the model diverged")) << up;
}

}  // namespace
}  // namespace tether::testing

// Stale Synchronous Parallel over real TCP: real tether-server processes,
// worker clients in this process.
#include <gtest/gtest.h>

#include <filesystem>
#include <numeric>
#include <utility>
#include <vector>

#include "tests/support/cluster.h"
#include "tests/support/raw_peer.h"
#include "tests/support/worker_pool.h"
#include "worker/request_cutter.h"
#include "worker/shard_link.h"

namespace tether::testing {
namespace {

ClusterOptions TwoShardsTwoWorkers() {
  ClusterOptions o;
  o.shards = 2;
  o.workers = 2;
  o.block_size = 16;
  o.lr = 1.0f;
  return o;
}

class Staleness : public ::testing::Test {
 protected:
  void StartCluster(ClusterOptions o) {
    auto c = Cluster::Start(o, dir_.path());
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    cluster_ = std::move(*c);
  }
  uint64_t Sum(uint64_t ShardStats::*field) {
    auto observer = ConnectObserver(cluster_->coordinator());
    auto stats = observer->Stats();
    EXPECT_TRUE(stats.ok()) << stats.status().ToString();
    uint64_t total = 0;
    for (const ShardStats& s : *stats) total += s.*field;
    return total;
  }

  // Two workers of bound 2 with tensor "w" (100 floats): `slow` at clock
  // k = 1 and `fast` at k + 2, where a pull is still within the bound
  // (checked).
  void StartFastAndSlow(std::vector<std::unique_ptr<Client>>* w) {
    ASSERT_NO_FATAL_FAILURE(StartCluster(TwoShardsTwoWorkers()));
    *w = ConnectWorkers(cluster_->coordinator(), {2, 2});
    ASSERT_EQ(w->size(), 2u);
    Client& fast = *(*w)[0];
    Client& slow = *(*w)[1];
    ASSERT_EQ(fast.staleness(), 2);
    for (auto* c : {&fast, &slow}) {
      ASSERT_TRUE(c->DefineTensor("w", {100}).ok());
    }
    ASSERT_TRUE(slow.Clock().ok());
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(fast.Clock().ok());
    std::vector<float> values(100);
    auto within = Async([&](auto cb) { fast.PullAsync("w", values, cb); });
    ASSERT_TRUE(Ready(within, 5000)) << "pull at k + 2 waited";
    EXPECT_TRUE(within.get().ok());
  }
  // `held` (a fast worker's request for k + 3) waits for the slow worker,
  // and is answered once `slow` reaches k + 1.
  void ExpectHeldUntilSlowClocks(Client& slow, std::future<Status> held,
                                 const std::string& what) {
    EXPECT_FALSE(Ready(held, 500)) << what << " answered early";
    EXPECT_GE(Sum(&ShardStats::waiting_pulls), 1u);
    ASSERT_TRUE(slow.Clock().ok());
    ASSERT_TRUE(Ready(held, 5000)) << what << " not released by the slow clock";
    EXPECT_TRUE(held.get().ok());
    EXPECT_EQ(Sum(&ShardStats::waiting_pulls), 0u);
  }

  TempDir dir_;
  std::unique_ptr<Cluster> cluster_;
};

TEST_F(Staleness, PullWaitsForSlowestLiveWorker) {
  std::vector<float> values(100);  // outlives the clients
  std::vector<std::unique_ptr<Client>> w;
  ASSERT_NO_FATAL_FAILURE(StartFastAndSlow(&w));
  ASSERT_TRUE(w[0]->Clock().ok());  // fast at k + 3: must wait
  ASSERT_NO_FATAL_FAILURE(ExpectHeldUntilSlowClocks(
      *w[1], Async([&](auto cb) { w[0]->PullAsync("w", values, cb); }),
      "pull at k + 3"));
}

// A prefetch (the values for the next clock, sent while the worker is still
// at this one) is held as a pull at the next clock: the bound is exact.
TEST_F(Staleness, PrefetchIsHeldAsAPullAtTheNextClock) {
  std::vector<float> values(100);  // outlives the clients
  std::vector<std::unique_ptr<Client>> w;
  ASSERT_NO_FATAL_FAILURE(StartFastAndSlow(&w));
  // fast still at k + 2: its prefetch is for k + 3.
  ASSERT_NO_FATAL_FAILURE(ExpectHeldUntilSlowClocks(
      *w[1], Async([&](auto cb) { w[0]->PrefetchAsync("w", values, cb); }),
      "prefetch for k + 3"));
}

// Under BSP a prefetch sent before this worker's own pushes and clock is
// answered after them, with every push of the round; the pushes made from
// it are read at the new clock (staleness 0).
TEST_F(Staleness, PrefetchUnderLockStepSeesTheWholeRound) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(TwoShardsTwoWorkers()));
  auto w = ConnectWorkers(cluster_->coordinator(), {0, 0});
  ASSERT_EQ(w.size(), 2u);
  for (auto& c : w) ASSERT_TRUE(c->DefineTensor("w", {40}).ok());
  std::vector<float> values(40), g0(40, -1.0f), g1(40, -2.0f);
  for (int round = 1; round <= 3; ++round) {
    auto prefetch =
        Async([&](auto cb) { w[0]->PrefetchAsync("w", values, cb); });
    ASSERT_TRUE(w[0]->Push("w", g0).ok());
    ASSERT_TRUE(w[1]->Push("w", g1).ok());
    ASSERT_TRUE(w[1]->Clock().ok());
    EXPECT_FALSE(Ready(prefetch, 300)) << "round " << round;
    ASSERT_TRUE(w[0]->Clock().ok());
    ASSERT_TRUE(Ready(prefetch, 5000)) << "round " << round;
    ASSERT_TRUE(prefetch.get().ok());
    for (float v : values) ASSERT_EQ(v, 3.0f * round) << "round " << round;
    ASSERT_TRUE(w[1]->Pull("w", values).ok());
  }
  EXPECT_EQ(w[0]->max_push_staleness(), 0);
}

// A push and the next clock's prefetch of the same tensor, sent together
// (Client::PushAndPrefetchAsync): the push is acknowledged at once, the
// prefetch is held as a pull at the next clock (the bound stays exact),
// and what it brings holds the push (read behind it on each connection).
TEST_F(Staleness, PushAndPrefetchIsHeldByTheBoundAndReadsItsOwnPush) {
  std::vector<float> before(100), fetched(100), after(100);
  std::vector<float> grad(100, -1.0f);
  std::vector<std::unique_ptr<Client>> w;
  ASSERT_NO_FATAL_FAILURE(StartFastAndSlow(&w));
  ASSERT_TRUE(w[0]->Pull("w", before).ok());
  std::future<Status> pushed;
  auto prefetched = Async([&](auto got) {
    pushed = Async([&](auto done) {
      w[0]->PushAndPrefetchAsync("w", grad, fetched, done, got);
    });
  });
  ASSERT_TRUE(Ready(pushed, 5000)) << "the push waited for the prefetch";
  ASSERT_TRUE(pushed.get().ok());
  // fast at k + 2: its prefetch is for k + 3.
  ASSERT_NO_FATAL_FAILURE(ExpectHeldUntilSlowClocks(
      *w[1], std::move(prefetched), "push and prefetch for k + 3"));
  ASSERT_TRUE(w[0]->Pull("w", after).ok());
  EXPECT_EQ(fetched, after);
  EXPECT_NE(before, after) << "the push moved nothing";
}

// Cut into parts of ClientOptions::chunk_bytes, each part one push
// and one prefetch on its shard's connection, the prefetch behind the
// push: every value it brings back holds the push. A wrong-sized buffer is
// refused to both callbacks, naming the tensor.
TEST_F(Staleness, PushAndPrefetchGoesPartByPartAndEachPartReadsItsPush) {
  ClusterOptions o = TwoShardsTwoWorkers();
  o.workers = 1;
  ASSERT_NO_FATAL_FAILURE(StartCluster(o));
  auto w = ConnectWorkers(cluster_->coordinator(), {1},
                          [](ClientOptions& c) { c.chunk_bytes = 1024; });
  ASSERT_EQ(w.size(), 1u);
  constexpr size_t kN = 4000;  // 250 blocks of 16; parts of 16 blocks
  ASSERT_TRUE(w[0]->DefineTensor("w", {kN}).ok());
  std::vector<float> grad(kN), fetched(kN, 7.0f);
  for (size_t i = 0; i < kN; ++i) grad[i] = 0.25f * float(i % 9) - 1.0f;
  const uint64_t pushes = Sum(&ShardStats::pushes);
  const uint64_t pulls = Sum(&ShardStats::pulls);
  std::future<Status> pushed;
  auto prefetched = Async([&](auto got) {
    pushed = Async([&](auto done) {
      w[0]->PushAndPrefetchAsync("w", grad, fetched, done, got);
    });
  });
  ASSERT_TRUE(Ready(pushed, 5000));
  ASSERT_TRUE(Ready(prefetched, 5000));
  ASSERT_TRUE(pushed.get().ok());
  ASSERT_TRUE(prefetched.get().ok());
  EXPECT_GE(Sum(&ShardStats::pulls) - pulls, 16u) << "not cut into parts";
  EXPECT_EQ(Sum(&ShardStats::pushes) - pushes, Sum(&ShardStats::pulls) - pulls)
      << "a part's push without its prefetch, or the other way round";
  // SGD at lr 1 from zeros, read at this clock: -grad, exactly.
  for (size_t i = 0; i < kN; ++i) ASSERT_EQ(fetched[i], -grad[i]) << i;

  std::vector<float> small(kN - 1);
  std::future<Status> refused;
  auto refused_too = Async([&](auto got) {
    refused = Async([&](auto done) {
      w[0]->PushAndPrefetchAsync("w", grad, small, done, got);
    });
  });
  for (auto* f : {&refused, &refused_too}) {
    ASSERT_TRUE(Ready(*f, 1000));
    Status s = f->get();
    EXPECT_EQ(s.code(), Code::kInvalidArgument);
    EXPECT_NE(s.message().find("'w'"), std::string::npos) << s.message();
  }
}

// A prefetch is for the next clock only: a pull for a clock further ahead
// (which the bound could hold for the rest of the run) is refused with the
// clocks named, and the connection goes on serving.
TEST_F(Staleness, PullForAClockBeyondTheNextIsRefused) {
  ClusterOptions o;
  o.shards = 1;
  o.workers = 1;
  ASSERT_NO_FATAL_FAILURE(StartCluster(o));
  auto peer = RawPeer::Connect(cluster_->coordinator());
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  flatbuffers::FlatBufferBuilder fbb(256);
  auto name = fbb.CreateString("raw worker");
  ASSERT_FALSE((*peer)->Send(Bytes(*FinishFrame(
      fbb, wire::CreateHello(fbb, kProtocolVersion, wire::Role::Worker, 0, 1,
                             -1, 0, 0, name)))));
  auto welcome = (*peer)->ReadFrame(kReplyTimeoutMs);
  ASSERT_TRUE(welcome.ok()) << welcome.status().ToString();
  ASSERT_NE(welcome->message()->body_as_Welcome(), nullptr);
  ASSERT_FALSE((*peer)->Send(
      Bytes(*client_internal::DefineFrame(5, "w", false, {8}, 0, {}))));
  auto defined = (*peer)->ReadFrame(kReplyTimeoutMs);
  ASSERT_TRUE(defined.ok()) << defined.status().ToString();
  const wire::DefineAck* ack = defined->message()->body_as_DefineAck();
  ASSERT_NE(ack, nullptr);
  // Block 0 of the tensor; the worker is at clock 0.
  auto pull = [&](int64_t clock) -> Result<Frame> {
    if ((*peer)->Send(Bytes(*client_internal::PullBlocksFrame(
            7, ack->id(), {0}, WireDtype::kF32, clock)))) {
      return Unavailable("send failed");
    }
    return (*peer)->ReadFrame(kReplyTimeoutMs);
  };
  auto beyond = pull(2);
  ASSERT_TRUE(beyond.ok()) << beyond.status().ToString();
  const wire::Error* error = beyond->message()->body_as_Error();
  ASSERT_NE(error, nullptr);
  EXPECT_EQ(error->code(), wire::ErrorCode::BadRequest);
  EXPECT_TRUE(Contains(error->message()->str(),
                       "pull for clock 2 from a worker at clock 0"));
  auto next = pull(1);
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_NE(next->message()->body_as_PullReply(), nullptr)
      << wire::EnumNameBody(next->message()->body_type());
}

TEST_F(Staleness, ZeroIsLockStep) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(TwoShardsTwoWorkers()));
  auto w = ConnectWorkers(cluster_->coordinator(), {0, 0});
  ASSERT_EQ(w.size(), 2u);
  for (auto& c : w) ASSERT_TRUE(c->DefineTensor("w", {40}).ok());
  std::vector<float> values(40);
  for (int round = 1; round <= 3; ++round) {
    // Worker 0 finishes the round first; its pull must wait for worker 1
    // and then see worker 1's push from the same round (BSP).
    std::vector<float> g0(40, -1.0f), g1(40, -2.0f);
    ASSERT_TRUE(w[0]->Push("w", g0).ok());
    ASSERT_TRUE(w[0]->Clock().ok());
    auto pull = Async([&](auto cb) { w[0]->PullAsync("w", values, cb); });
    EXPECT_FALSE(Ready(pull, 300)) << "round " << round;
    ASSERT_TRUE(w[1]->Push("w", g1).ok());
    ASSERT_TRUE(w[1]->Clock().ok());
    ASSERT_TRUE(Ready(pull, 5000)) << "round " << round;
    ASSERT_TRUE(pull.get().ok());
    for (float v : values) ASSERT_EQ(v, 3.0f * round);
    ASSERT_TRUE(w[1]->Pull("w", values).ok());
  }
}

TEST_F(Staleness, UnboundedNeverWaits) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(TwoShardsTwoWorkers()));
  auto w = ConnectWorkers(cluster_->coordinator(), {-1, -1});
  ASSERT_EQ(w.size(), 2u);
  EXPECT_EQ(w[0]->staleness(), -1);
  for (auto& c : w) ASSERT_TRUE(c->DefineTensor("w", {40}).ok());
  std::vector<float> values(40), grad(40, -1.0f);
  ASSERT_TRUE(w[1]->Pull("w", values).ok());  // the slow one reads at 0
  for (int k = 0; k < 50; ++k) {
    auto pull = Async([&](auto cb) { w[0]->PullAsync("w", values, cb); });
    ASSERT_TRUE(Ready(pull, 5000)) << "pull at clock " << k << " waited";
    ASSERT_TRUE(pull.get().ok());
    ASSERT_TRUE(w[0]->Push("w", grad).ok());
    ASSERT_TRUE(w[0]->Clock().ok());
  }
  // The slow worker's push, read at clock 0, is 50 clocks stale.
  ASSERT_TRUE(w[1]->Push("w", grad).ok());
  EXPECT_EQ(w[1]->max_push_staleness(), 50);
  EXPECT_EQ(w[0]->max_push_staleness(), 0);
  auto observer = ConnectObserver(cluster_->coordinator());
  auto stats = observer->Stats();
  ASSERT_TRUE(stats.ok());
  for (const ShardStats& s : *stats) {
    ASSERT_EQ(s.workers.size(), 2u);
    EXPECT_EQ(s.workers[0].clock, 50);
    EXPECT_EQ(s.workers[1].clock, 0);
    EXPECT_EQ(s.min_clock, 0);
    ASSERT_EQ(s.staleness_histogram.size(), 17u);
    EXPECT_EQ(s.staleness_histogram.back(), 1u);  // the 50-stale push
  }
  ASSERT_TRUE(observer->DefineTensor("w", {40}).ok());
  ASSERT_TRUE(observer->Pull("w", values).ok());
  for (float v : values) EXPECT_EQ(v, 51.0f);
}

TEST_F(Staleness, PushesStalerThanBoundRejected) {
  ClusterOptions o = TwoShardsTwoWorkers();
  o.reject_staleness = 2;
  ASSERT_NO_FATAL_FAILURE(StartCluster(o));
  auto w = ConnectWorkers(cluster_->coordinator(), {-1, -1});
  ASSERT_EQ(w.size(), 2u);
  for (auto& c : w) ASSERT_TRUE(c->DefineTensor("w", {40}).ok());
  std::vector<float> values(40), grad(40, -1.0f);
  ASSERT_TRUE(w[1]->Pull("w", values).ok());
  for (int k = 0; k < 2; ++k) ASSERT_TRUE(w[0]->Clock().ok());
  EXPECT_TRUE(w[1]->Push("w", grad).ok()) << "2 clocks stale is allowed";
  ASSERT_TRUE(w[0]->Clock().ok());
  Status s = w[1]->Push("w", grad);
  EXPECT_EQ(s.code(), Code::kStalePush) << s.ToString();
  EXPECT_NE(s.message().find("3 clocks stale"), std::string::npos)
      << s.message();
  ASSERT_TRUE(w[0]->Pull("w", values).ok());
  EXPECT_TRUE(w[0]->Push("w", grad).ok()) << "a fresh push is accepted";
  EXPECT_GE(Sum(&ShardStats::rejected_pushes), 1u);
}

TEST_F(Staleness, RequestedBoundCappedByServer) {
  ClusterOptions o = TwoShardsTwoWorkers();
  o.max_staleness = 1;
  ASSERT_NO_FATAL_FAILURE(StartCluster(o));
  auto w = ConnectWorkers(cluster_->coordinator(), {5, 0});
  ASSERT_EQ(w.size(), 2u);
  std::vector<int> bounds = {w[0]->staleness(), w[1]->staleness()};
  std::sort(bounds.begin(), bounds.end());
  EXPECT_EQ(bounds, (std::vector<int>{0, 1}));
}

TEST_F(Staleness, DepartedWorkerNoLongerHoldsBackAndRejoinsAtTheOthersClock) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(TwoShardsTwoWorkers()));
  auto w = ConnectWorkers(cluster_->coordinator(), {0, 0});
  ASSERT_EQ(w.size(), 2u);
  for (auto& c : w) ASSERT_TRUE(c->DefineTensor("w", {40}).ok());
  std::vector<float> values(40);
  ASSERT_TRUE(w[1]->Clock().ok());  // worker 1 leaves at clock 1
  w[1].reset();
  for (int k = 0; k < 3; ++k) ASSERT_TRUE(w[0]->Clock().ok());
  auto pull = Async([&](auto cb) { w[0]->PullAsync("w", values, cb); });
  ASSERT_TRUE(Ready(pull, 5000)) << "a departed worker still holds back";
  ASSERT_TRUE(pull.get().ok());

  // Rank 1 comes back: it joins at the others' clock (3), not its own (1),
  // so it does not drag them back, and holds back again from there.
  ClientOptions o;
  o.coordinator = cluster_->coordinator();
  o.rank = 1;
  auto back = Client::Connect(o);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ((*back)->rank(), 1);
  EXPECT_EQ((*back)->clock(), 3);
  ASSERT_TRUE(w[0]->Clock().ok());  // worker 0 at 4 waits for 4
  auto waits = Async([&](auto cb) { w[0]->PullAsync("w", values, cb); });
  EXPECT_FALSE(Ready(waits, 300));
  ASSERT_TRUE((*back)->Clock().ok());
  ASSERT_TRUE(Ready(waits, 5000));
  EXPECT_TRUE(waits.get().ok());
}

TEST_F(Staleness, PullsHeldBeyondMaxWaitingAreRefused) {
  ClusterOptions o = TwoShardsTwoWorkers();
  o.shards = 1;
  o.extra_flags = {"--max-waiting", "2"};
  ASSERT_NO_FATAL_FAILURE(StartCluster(o));
  auto w = ConnectWorkers(cluster_->coordinator(), {0, 0});
  ASSERT_EQ(w.size(), 2u);
  for (auto& c : w) ASSERT_TRUE(c->DefineTensor("w", {40}).ok());
  ASSERT_TRUE(w[0]->Clock().ok());  // worker 0 at 1 waits for worker 1
  std::vector<std::vector<float>> out(3, std::vector<float>(40));
  std::vector<std::future<Status>> pulls;
  for (int i = 0; i < 3; ++i) {
    pulls.push_back(
        Async([&, i](auto cb) { w[0]->PullAsync("w", out[i], cb); }));
  }
  // The third cannot be held: it is refused at once, naming the flag.
  ASSERT_TRUE(Ready(pulls[2], 5000));
  Status third = pulls[2].get();
  EXPECT_EQ(third.code(), Code::kInvalidArgument) << third.ToString();
  EXPECT_NE(third.message().find("--max-waiting"), std::string::npos);
  EXPECT_FALSE(Ready(pulls[0], 200));
  ASSERT_TRUE(w[1]->Clock().ok());  // the held two are answered
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(Ready(pulls[i], 5000));
    EXPECT_TRUE(pulls[i].get().ok());
  }
}

TEST_F(Staleness, WorkerReportsReachShardZeroStats) {
  ClusterOptions o = TwoShardsTwoWorkers();
  ASSERT_NO_FATAL_FAILURE(StartCluster(o));
  auto w = ConnectWorkers(cluster_->coordinator(), {0, 0});
  ASSERT_EQ(w.size(), 2u);
  ASSERT_TRUE(w[1]->Clock().ok());
  Progress p;
  p.epoch = 2;
  p.samples = 640;
  p.loss = 0.5f;
  p.samples_per_s = 1234.0f;
  p.test_accuracy = 0.81f;
  p.test_loss = 0.6f;
  p.host = "box-7";
  ASSERT_TRUE(w[1]->Report(p).ok());
  auto observer = ConnectObserver(cluster_->coordinator());
  auto stats = observer->Stats();
  ASSERT_TRUE(stats.ok());
  const ShardStats::Worker& r1 = (*stats)[0].workers[1];
  EXPECT_EQ(r1.clock, 1);
  EXPECT_EQ(r1.epoch, 2);
  EXPECT_EQ(r1.samples, 640u);
  EXPECT_FLOAT_EQ(r1.loss, 0.5f);
  EXPECT_FLOAT_EQ(r1.test_accuracy, 0.81f);
  EXPECT_EQ(r1.device, "cpu");
  EXPECT_EQ(r1.host, "box-7");
  EXPECT_FLOAT_EQ((*stats)[0].workers[0].test_accuracy, -1.0f);
  EXPECT_EQ(observer->Report(p).code(), Code::kProtocol);
}

// tether-worker overlaps the wire with its compute: the next batch's pulls
// go right behind each clock, every layer's gradients leave as soon as
// backward has them, and forward starts on a layer once its weights are
// in; with --overlap-steps (s >= 1) the next batch's weights are
// prefetched once forward is done and the next batch computes while this
// one's clock travels. The bound stays exact: a pull behind the clock, and
// a prefetch, are held and read as pulls at the new clock, so under bound
// s no push is staler than s + 1 (the fastest worker at most s + 1 clocks
// past the slowest one's read), as with nothing overlapped. A pull read at
// the clock it was sent at would allow s + 2. So is a prefetch sent right
// behind each layer's pushes (--prefetch-with-push). Three workers, one
// slowed 4x, MLP on Fashion-MNIST, for s = 0, 1, 3, and 1, 3 with
// --overlap-steps and with --prefetch-with-push. Under TSan, where every
// step is slow already, the straggler is 2x (the fast workers still run
// ahead of it; at 4x the test took 123 s there).
TEST_F(Staleness, OverlappingWorkersPushNoStalerThanTheBound) {
  const std::string overlap = "--overlap-steps",
                    with_push = "--prefetch-with-push";
  for (auto [s, mode] :
       std::vector<std::pair<int, std::string>>{{0, ""},
                                                {1, ""},
                                                {3, ""},
                                                {1, overlap},
                                                {3, overlap},
                                                {1, with_push},
                                                {3, with_push}}) {
    SCOPED_TRACE("s = " + std::to_string(s) + " " + mode);
    ClusterOptions o;
    o.shards = 2;
    o.workers = 3;
    o.max_staleness = s;
    o.optimizer = "sgd";
    o.lr = 0.05f;
    o.block_size = 4096;
    cluster_.reset();
    ASSERT_NO_FATAL_FAILURE(StartCluster(o));
    const std::string dir = dir_.path() + "/s" + std::to_string(s) +
                            (mode.empty() ? "" : mode.substr(1));
    std::filesystem::create_directories(dir);
    std::vector<std::string> flags = {
        "--model",      "mlp", "--hidden",    "64",
        "--epochs",     "1",   "--batch",     "100",
        "--eval-every", "0",   "--staleness", std::to_string(s)};
    if (!mode.empty()) flags.push_back(mode);
    auto workers = StartWorkers(cluster_->coordinator(), 2, dir, flags);
    std::vector<std::string> slow = {TETHER_WORKER_BIN,
                                     "--coordinator",
                                     cluster_->coordinator(),
                                     "--rank",
                                     "2",
                                     "--quiet",
                                     "--slowdown",
                                     kUnderTsan ? "2" : "4"};
    slow.insert(slow.end(), flags.begin(), flags.end());
    auto straggler = Process::Start(slow, dir + "/worker2.log");
    ASSERT_TRUE(straggler.ok()) << straggler.status().ToString();
    workers.push_back(std::move(*straggler));
    ASSERT_EQ(workers.size(), 3u);
    for (size_t r = 0; r < workers.size(); ++r) {
      auto code = workers[r]->Wait(120000);
      ASSERT_TRUE(code.ok()) << "worker " << r;
      ASSERT_EQ(*code, 0) << "worker " << r << ":\n"
                          << Tail(workers[r]->Log(), 10);
    }
    auto observer = ConnectObserver(cluster_->coordinator());
    ASSERT_NE(observer, nullptr);
    auto stats = observer->Stats();
    ASSERT_TRUE(stats.ok()) << stats.status().ToString();
    uint64_t pushes = 0, stale = 0, beyond = 0;
    for (const ShardStats& shard : *stats) {
      const auto& h = shard.staleness_histogram;
      for (size_t i = 0; i < h.size(); ++i) {
        pushes += h[i];
        if (i >= 1) stale += h[i];
        if (i > static_cast<size_t>(s) + 1) beyond += h[i];
      }
    }
    // 600 batches of 4 tensors, each on 1 or 2 shards.
    EXPECT_GE(pushes, 600u * 4);
    EXPECT_EQ(beyond, 0u) << "pushes staler than " << s + 1;
    // The bound was used: the fast workers ran ahead of the straggler.
    if (s > 0) {
      EXPECT_GT(stale, 0u);
    }
  }
}

}  // namespace
}  // namespace tether::testing

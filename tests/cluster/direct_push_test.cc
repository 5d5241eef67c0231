// Pushes a shard reads from a same-host worker's memory, and pulls it writes
// into it (ClientOptions::direct_memory, tether-worker --direct-memory,
// tether-server --direct-memory, server/direct_read.h): they give exactly
// what pushes and pulls over TCP give, move almost no bytes over the
// connection, are taken only from and given only to the process that
// holds the other end of the connection, and fall back to TCP where the
// shard does not take them.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdint>
#include <future>
#include <string>
#include <vector>

#include "schema/auth.h"
#include "tests/support/cluster.h"
#include "tests/support/raw_peer.h"
#include "tests/support/temp_dir.h"
#include "worker/client.h"
#include "worker/request_cutter.h"
#include "worker/shard_link.h"

namespace tether::testing {
namespace {

constexpr float kLr = 0.5f;

class DirectPushes : public ::testing::Test {
 protected:
  void Start(int shards, int workers, int block_size) {
    ClusterOptions o;
    o.shards = shards;
    o.workers = workers;
    o.block_size = block_size;
    o.optimizer = "sgd";
    o.lr = kLr;
    auto c = Cluster::Start(o, dir_.path());
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    cluster_ = std::move(*c);
    observer_ = Connect(/*observer=*/true, true);
    ASSERT_TRUE(observer_);
  }

  std::unique_ptr<Client> Connect(bool observer, bool direct) {
    ClientOptions o;
    o.coordinator = cluster_->coordinator();
    o.observer = observer;
    o.staleness = -1;
    o.direct_memory = direct;
    o.name = observer ? "observer" : direct ? "direct worker" : "tcp worker";
    o.join_timeout_ms = 20000;
    auto c = Client::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(*c) : nullptr;
  }

  // Bytes every shard has received and sent so far.
  std::pair<uint64_t, uint64_t> Traffic() { return ShardTraffic(*observer_); }

  std::vector<float> Weights(const std::string& name, size_t n) {
    std::vector<float> w(n);
    Status s = observer_->DefineTensor(name, {n});
    if (s.ok()) s = observer_->Pull(name, w);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return w;
  }

  // Reads `raw`'s frames until the answer to `request` (an Error too).
  static Result<Frame> Answer(RawPeer& raw, uint64_t request) {
    for (int i = 0; i < 50; ++i) {
      auto f = raw.ReadFrame(kReplyTimeoutMs);
      if (!f.ok()) return f.status();
      const wire::Message* m = f->message();
      uint64_t id = ~uint64_t{0};
      if (m->body_as_Welcome() != nullptr) id = 0;
      if (auto* e = m->body_as_Error()) id = e->request_id();
      if (auto* d = m->body_as_DefineAck()) id = d->request_id();
      if (auto* a = m->body_as_PushAck()) id = a->request_id();
      if (auto* r = m->body_as_PullReply()) id = r->request_id();
      if (auto* c = m->body_as_ClockAck()) id = c->request_id();
      if (id == request) return f;
    }
    return Unavailable("no answer to request " + std::to_string(request));
  }

  TempDir dir_;
  std::unique_ptr<Cluster> cluster_;
  std::unique_ptr<Client> observer_;
};

// Two workers push the same gradient of a 1M-float tensor three times, one
// letting the shard read it, one sending it: the weights take all six
// exactly, and the reader's pushes (after its first, which learns that the
// shard reads) move a few hundred bytes where the sender's move 4 MB. Then
// each pulls the tensor: the same values, written into the first's memory
// for a few hundred bytes on the wire, 4 MB over TCP to the second.
TEST_F(DirectPushes, GiveWhatTcpGivesAndMoveAlmostNoBytes) {
  ASSERT_NO_FATAL_FAILURE(Start(1, 2, 65536));
  // Welcomed once both have joined.
  auto joining =
      std::async(std::launch::async, [&] { return Connect(false, true); });
  auto tcp = Connect(false, false);
  auto direct = joining.get();
  ASSERT_TRUE(direct && tcp);
  constexpr uint64_t kBig = 1 << 20;
  for (Client* c : {direct.get(), tcp.get()}) {
    ASSERT_TRUE(c->DefineTensor("big", {kBig}).ok());
  }
  const float g = 1.0f / 1024;  // kLr * g sums exactly
  std::vector<float> grad(kBig, g);
  uint64_t moved[2] = {0, 0};
  Client* clients[2] = {direct.get(), tcp.get()};
  for (int k = 0; k < 2; ++k) {
    for (int i = 0; i < 3; ++i) {
      const uint64_t before = Traffic().first;
      Status s = clients[k]->Push("big", grad);
      ASSERT_TRUE(s.ok()) << s.ToString();
      moved[k] = Traffic().first - before;  // the last push's
    }
  }
  EXPECT_LT(moved[0], uint64_t{16} << 10) << "read from the worker";
  EXPECT_GT(moved[1], kBig * 4) << "sent over TCP";
  const std::vector<float> w = Weights("big", kBig);
  size_t wrong = 0;
  for (float v : w) wrong += v != -6 * kLr * g;
  EXPECT_EQ(wrong, 0u) << "first: " << w[0];
  for (int k = 0; k < 2; ++k) {
    std::vector<float> pulled(kBig, 7.0f);
    const uint64_t before = Traffic().second;
    Status s = clients[k]->Pull("big", pulled);
    ASSERT_TRUE(s.ok()) << s.ToString();
    moved[k] = Traffic().second - before;
    EXPECT_TRUE(pulled == w) << "client " << k;
  }
  EXPECT_LT(moved[0], uint64_t{16} << 10) << "written into the worker";
  EXPECT_GT(moved[1], kBig * 4) << "sent over TCP";
}

// A worker naming a process that does not hold its socket (here init) is
// not read from: its pushes by address are refused as a protocol error,
// and its pushes with floats go on as before. One naming itself, with an
// address it has not mapped, is refused naming the address; nothing is
// applied for either refusal, and the connection still serves.
TEST_F(DirectPushes, AreTakenOnlyFromThePeersOwnProcessAndMappedMemory) {
  ASSERT_NO_FATAL_FAILURE(Start(1, 2, 4));
  // Both say Hello first: the Welcome comes once every worker has joined.
  const int claims[2] = {1, static_cast<int>(getpid())};
  std::unique_ptr<RawPeer> peers[2];
  for (int k = 0; k < 2; ++k) {
    auto peer = RawPeer::Connect(cluster_->coordinator());
    ASSERT_TRUE(peer.ok()) << peer.status().ToString();
    peers[k] = std::move(*peer);
    HelloFields hello;
    hello.role = wire::Role::Worker;
    hello.staleness = -1;
    hello.name = "raw worker";
    hello.direct_pid = claims[k];
    ASSERT_FALSE(peers[k]->Send(Bytes(*MakeHelloFrame(hello))));
  }
  for (int k = 0; k < 2; ++k) {
    const int claimed = claims[k];
    SCOPED_TRACE("pid " + std::to_string(claimed));
    RawPeer& raw = *peers[k];
    auto answer = [&](uint64_t request) { return Answer(raw, request); };
    auto welcome = answer(0);
    ASSERT_TRUE(welcome.ok()) << welcome.status().ToString();
    ASSERT_NE(welcome->message()->body_as_Welcome(), nullptr);
    const std::string name = "w" + std::to_string(claimed);
    ASSERT_FALSE(raw.Send(
        Bytes(*client_internal::DefineFrame(1, name, false, {8}, 0, Init{}))));
    auto defined = answer(1);
    ASSERT_TRUE(defined.ok()) << defined.status().ToString();
    const wire::DefineAck* ack = defined->message()->body_as_DefineAck();
    ASSERT_NE(ack, nullptr);
    const uint32_t id = ack->id();
    std::vector<float> grad = {1, 2, 3, 4, 5, 6, 7, 8};
    auto push = [&](uint64_t request, bool direct) {
      return Bytes(*client_internal::PushBlocksFrame(
          request, id, -1, client_internal::PushKind::kGradient, {0, 1}, 4,
          grad, WireDtype::kF32, direct));
    };
    const bool own = claimed == static_cast<int>(getpid());
    ASSERT_FALSE(raw.Send(push(2, /*direct=*/true)));
    auto first = answer(2);
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    if (own) {
      const wire::PushAck* pushed = first->message()->body_as_PushAck();
      ASSERT_NE(pushed, nullptr) << "read from this process";
      EXPECT_TRUE(pushed->direct());
    } else {
      const wire::Error* refused = first->message()->body_as_Error();
      ASSERT_NE(refused, nullptr) << "init does not hold the socket";
      EXPECT_EQ(refused->code(), wire::ErrorCode::Protocol);
      EXPECT_PRED2(Contains, refused->message()->str(),
                   "must carry their floats");
      ASSERT_FALSE(raw.Send(push(3, /*direct=*/false)));
      auto sent = answer(3);
      ASSERT_TRUE(sent.ok()) << sent.status().ToString();
      const wire::PushAck* pushed = sent->message()->body_as_PushAck();
      ASSERT_NE(pushed, nullptr);
      EXPECT_FALSE(pushed->direct());
    }
    // Block 1's floats at an address nothing is mapped at.
    flatbuffers::FlatBufferBuilder fbb(256);
    auto block0 = wire::CreateBlock(
        fbb, 0, 0, 0, reinterpret_cast<uintptr_t>(grad.data()), 4);
    auto block1 = wire::CreateBlock(fbb, 1, 0, 0, 0x10, 4);
    auto blocks = fbb.CreateVector(std::vector{block0, block1});
    wire::PushBuilder pb(fbb);
    pb.add_request_id(4);
    pb.add_tensor(id);
    pb.add_blocks(blocks);
    ASSERT_FALSE(raw.Send(Bytes(*FinishFrame(fbb, pb.Finish()))));
    auto bad = answer(4);
    ASSERT_TRUE(bad.ok()) << bad.status().ToString();
    const wire::Error* refused = bad->message()->body_as_Error();
    ASSERT_NE(refused, nullptr);
    if (own) {
      EXPECT_EQ(refused->code(), wire::ErrorCode::BadRequest);
      EXPECT_PRED2(Contains, refused->message()->str(), "at 0x10 in worker");
    }
    // One push applied, whichever way it came.
    std::vector<float> want(8);
    for (int i = 0; i < 8; ++i) want[i] = -kLr * grad[i];
    EXPECT_EQ(Weights(name, 8), want);
    // A pull asking for its values to be written into this process: done
    // for the process that holds the connection, refused for the other; an
    // unmapped address is refused, naming it.
    std::vector<float> landing(8, 99.0f);
    ASSERT_FALSE(raw.Send(Bytes(*client_internal::PullBlocksFrame(
        5, id, {0, 1}, WireDtype::kF32, -1,
        reinterpret_cast<uintptr_t>(landing.data())))));
    auto pulled = answer(5);
    ASSERT_TRUE(pulled.ok()) << pulled.status().ToString();
    if (own) {
      const wire::PullReply* reply = pulled->message()->body_as_PullReply();
      ASSERT_NE(reply, nullptr);
      ASSERT_EQ(reply->blocks()->size(), 2u);
      for (const wire::Block* b : *reply->blocks()) {
        EXPECT_TRUE(b->landed());
        EXPECT_EQ(b->values(), nullptr);
      }
      EXPECT_EQ(landing, want);
      ASSERT_FALSE(raw.Send(Bytes(*client_internal::PullBlocksFrame(
          6, id, {0, 1}, WireDtype::kF32, -1, 0x10))));
      auto unmapped = answer(6);
      ASSERT_TRUE(unmapped.ok()) << unmapped.status().ToString();
      const wire::Error* error = unmapped->message()->body_as_Error();
      ASSERT_NE(error, nullptr);
      EXPECT_EQ(error->code(), wire::ErrorCode::BadRequest);
      EXPECT_PRED2(Contains, error->message()->str(), "at 0x10 in worker");
    } else {
      const wire::Error* error = pulled->message()->body_as_Error();
      ASSERT_NE(error, nullptr);
      EXPECT_EQ(error->code(), wire::ErrorCode::Protocol);
      EXPECT_PRED2(Contains, error->message()->str(),
                   "answered with their values");
      EXPECT_EQ(landing, std::vector<float>(8, 99.0f));
    }
  }
  ExpectAllRunning(*cluster_);
}

// A shard restarted with --direct-memory=false: the worker's next push,
// sent by address as the last shard took them, is refused there and sent
// again with its floats, once; later ones go so from the start. Its next
// pull likewise, when it asks for its values to be written into it.
TEST_F(DirectPushes, FallBackToTcpWhereARestartedShardDoesNotRead) {
  ASSERT_NO_FATAL_FAILURE(Start(2, 1, 4));
  auto worker = Connect(false, true);
  ASSERT_TRUE(worker);
  ASSERT_TRUE(worker->DefineTensor("w", {8}).ok());  // a block on each shard
  const std::vector<float> grad = {1, 2, 3, 4, 5, 6, 7, 8};
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(worker->Push("w", grad).ok());
  std::vector<float> pulled(8);
  ASSERT_TRUE(worker->Pull("w", pulled).ok());  // lands, from both shards
  // Shard 1 killed and started again, with `flags`; the worker back.
  auto restart_shard1 = [&](const std::vector<std::string>& flags) {
    cluster_->shard(1).Signal(SIGKILL);
    (void)cluster_->shard(1).Wait(10000);
    ASSERT_TRUE(cluster_->Restart(1, flags).ok());
    Status back = worker->AwaitShards(20000);
    ASSERT_TRUE(back.ok()) << back.ToString();
  };
  ASSERT_NO_FATAL_FAILURE(restart_shard1({"--direct-memory=false"}));
  for (int i = 0; i < 2; ++i) {
    Status s = worker->Push("w", grad);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  // The block on shard 0 kept its weights (four pushes); the one on the
  // restarted shard 1 started again from zeros (two). Each pushed once per
  // call, whichever way it travelled. (A new observer: the first does not
  // dial a restarted shard again.)
  observer_ = Connect(/*observer=*/true, true);
  ASSERT_TRUE(observer_);
  std::vector<float> w = Weights("w", 8);
  int pushes[2] = {0, 0};
  for (int b = 0; b < 2; ++b) {
    for (int n : {2, 4}) {
      bool all = true;
      for (int i = 4 * b; i < 4 * b + 4; ++i) {
        float want = 0;
        for (int k = 0; k < n; ++k) want -= kLr * grad[i];
        all = all && w[i] == want;
      }
      if (all) pushes[b] = n;
    }
  }
  EXPECT_EQ(pushes[0] + pushes[1], 6)
      << "blocks took " << pushes[0] << " and " << pushes[1] << " pushes; w[0] "
      << w[0] << ", w[4] " << w[4];
  // The pulls: shard 1 back with direct reads (its answer to a push says
  // so), then once more without, before the worker's next pull, which
  // asks for a landing there, is refused and is asked again.
  ASSERT_NO_FATAL_FAILURE(restart_shard1({}));
  ASSERT_TRUE(worker->Push("w", grad).ok());
  ASSERT_TRUE(worker->Push("w", grad).ok());
  ASSERT_NO_FATAL_FAILURE(restart_shard1({"--direct-memory=false"}));
  Status pull = worker->Pull("w", pulled);
  ASSERT_TRUE(pull.ok()) << pull.ToString();
  observer_ = Connect(/*observer=*/true, true);
  ASSERT_TRUE(observer_);
  w = Weights("w", 8);
  EXPECT_EQ(pulled, w);
  EXPECT_TRUE(cluster_->shard(1).Running());
}

// A pull held for the bound while its worker goes away: when the slowest
// worker's clock releases it, nothing is written where it asked (that
// process could be gone, its id taken by another).
TEST_F(DirectPushes, AHeldPullOfAClosedConnectionWritesNothing) {
  ASSERT_NO_FATAL_FAILURE(Start(1, 2, 4));
  auto peer = RawPeer::Connect(cluster_->coordinator());
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  RawPeer& raw = **peer;
  HelloFields hello;
  hello.role = wire::Role::Worker;
  hello.staleness = 0;
  hello.name = "raw worker";
  hello.direct_pid = static_cast<int>(getpid());
  ASSERT_FALSE(raw.Send(Bytes(*MakeHelloFrame(hello))));
  ClientOptions o;
  o.coordinator = cluster_->coordinator();
  o.staleness = 0;
  o.name = "slowest worker";
  o.join_timeout_ms = 20000;
  auto slowest = Client::Connect(o);  // welcomed once both have joined
  ASSERT_TRUE(slowest.ok()) << slowest.status().ToString();
  ASSERT_TRUE((*slowest)->DefineTensor("w", {8}).ok());
  auto answer = [&](uint64_t request) { return Answer(raw, request); };
  ASSERT_TRUE(answer(0).ok());
  ASSERT_FALSE(raw.Send(
      Bytes(*client_internal::DefineFrame(1, "w", false, {8}, 0, Init{}))));
  auto defined = answer(1);
  ASSERT_TRUE(defined.ok()) << defined.status().ToString();
  const uint32_t id = defined->message()->body_as_DefineAck()->id();
  flatbuffers::FlatBufferBuilder fbb(64);
  ASSERT_FALSE(
      raw.Send(Bytes(*FinishFrame(fbb, wire::CreateClock(fbb, 2, 1)))));
  ASSERT_TRUE(answer(2).ok());
  // At clock 1 with the slowest at 0 and a bound of 0: held.
  std::vector<float> landing(8, 99.0f);
  ASSERT_FALSE(raw.Send(Bytes(*client_internal::PullBlocksFrame(
      3, id, {0, 1}, WireDtype::kF32, -1,
      reinterpret_cast<uintptr_t>(landing.data())))));
  raw.Close();
  ASSERT_TRUE(Eventually(
      [&] {
        auto stats = observer_->Stats();
        if (!stats.ok() || stats->empty()) return false;
        int connected = 0;
        for (const auto& w : stats->front().workers) connected += w.connected;
        return connected == 1;
      },
      10000))
      << "the shard did not see the raw worker go";
  // The slowest worker's clock releases the held pull.
  ASSERT_TRUE((*slowest)->Clock().ok());
  std::vector<float> w(8);
  ASSERT_TRUE((*slowest)->Pull("w", w).ok());
  EXPECT_EQ(landing, std::vector<float>(8, 99.0f));
  ExpectAllRunning(*cluster_);
}

}  // namespace
}  // namespace tether::testing

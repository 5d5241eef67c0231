// A worker's client rides out lost shards, and can be closed while it
// dials one again: real shard processes killed, restarted and stopped while
// an in-process Client sends. Under the asan preset these catch a handler
// that outlives its link or client.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/cluster.h"
#include "worker/client.h"

namespace tether::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

class Reconnect : public ::testing::Test {
 protected:
  void StartCluster(std::vector<std::string> flags = {}) {
    ClusterOptions o;
    o.shards = 2;
    o.workers = 1;
    o.block_size = 256;
    o.extra_flags = std::move(flags);
    auto c = Cluster::Start(o, dir_.path());
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    cluster_ = std::move(*c);
    shard1_address_ = cluster_->address(1);
  }
  std::unique_ptr<Client> ConnectWorker() {
    ClientOptions o;
    o.coordinator = cluster_->coordinator();
    o.staleness = -1;
    o.name = "reconnect test";
    o.connect_timeout_ms = 10000;
    o.join_timeout_ms = 20000;
    auto c = Client::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(*c) : nullptr;
  }
  // Shard 1 again, on its old address (an empty shard: the client defines
  // its tensors again).
  std::unique_ptr<Process> RestartShard1(int n) {
    auto p = Process::Start(
        {TETHER_SERVER_BIN, "--shard-id", "1", "--shards", "2", "--listen",
         shard1_address_, "--http", "127.0.0.1:0", "--coordinator",
         cluster_->coordinator()},
        dir_.path() + "/shard1-again" + std::to_string(n) + ".log");
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return p.ok() ? std::move(*p) : nullptr;
  }

  TempDir dir_;
  std::unique_ptr<Cluster> cluster_;
  std::string shard1_address_;
};

// Sends Push, Pull and Clock in a loop on its own thread; after a request
// fails with kUnavailable it waits for the shards, as tether-worker does.
class Sender {
 public:
  explicit Sender(Client& client) : client_(client) {
    thread_ = std::thread([this] { Run(); });
  }
  ~Sender() { Stop(); }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  uint64_t steps() const { return steps_; }
  // The error that ended the loop, if one did; "" while it runs.
  std::string unexpected() const {
    std::lock_guard lock(mu_);
    return unexpected_;
  }

 private:
  void Run() {
    std::vector<float> values(1000), grad(1000, 0.01f);
    while (!stop_) {
      Status s = client_.Push("w", grad);
      if (s.ok()) s = client_.Pull("w", values);
      if (s.ok()) s = client_.Clock();
      if (s.ok()) {
        ++steps_;
        continue;
      }
      if (s.code() != Code::kUnavailable) {
        return Fail(s);
      }
      // In short waits, so that Stop() is not held up.
      while (!stop_) {
        Status back = client_.AwaitShards(500);
        if (back.ok()) break;
        if (back.message().find("did not come back") == std::string::npos) {
          return Fail(back);
        }
      }
    }
  }

  void Fail(const Status& s) {
    std::lock_guard lock(mu_);
    unexpected_ = s.ToString();
  }

  Client& client_;
  mutable std::mutex mu_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> steps_{0};
  std::string unexpected_;  // guarded by mu_
  std::thread thread_;
};

TEST_F(Reconnect, ShardRestartedRepeatedlyWhileSendingThenClosedMidDial) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  std::unique_ptr<Client> client = ConnectWorker();
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->DefineTensor("w", {1000}).ok());
  Sender sender(*client);
  ASSERT_TRUE(Eventually([&] { return sender.steps() >= 20; }, 10000));

  Process* shard1 = &cluster_->shard(1);
  std::vector<std::unique_ptr<Process>> restarted;
  for (int round = 0; round < 4; ++round) {
    const uint64_t losses = client->shard_losses();
    shard1->Signal(SIGKILL);
    ASSERT_TRUE(shard1->Wait(5000).ok());
    ASSERT_TRUE(
        Eventually([&] { return client->shard_losses() > losses; }, 10000))
        << "round " << round << ": the loss went unnoticed";
    // Down for a while: some dials are refused before it is back.
    std::this_thread::sleep_for(milliseconds(100 + 150 * round));
    restarted.push_back(RestartShard1(round));
    ASSERT_NE(restarted.back(), nullptr);
    shard1 = restarted.back().get();
    const uint64_t steps = sender.steps();
    ASSERT_TRUE(Eventually([&] { return sender.steps() >= steps + 20; }, 30000))
        << "round " << round
        << ": no progress after the restart: " << sender.unexpected() << "\n"
        << Tail(shard1->Log(), 10);
    EXPECT_EQ(client->shard_losses(), losses + 1) << "round " << round;
  }

  // Lost once more, and closed while it dials the dead address.
  const uint64_t losses = client->shard_losses();
  shard1->Signal(SIGKILL);
  ASSERT_TRUE(shard1->Wait(5000).ok());
  ASSERT_TRUE(
      Eventually([&] { return client->shard_losses() > losses; }, 10000));
  sender.Stop();
  EXPECT_EQ(sender.unexpected(), "");
  EXPECT_FALSE(client->AwaitShards(300).ok());
  const auto closing = steady_clock::now();
  client.reset();
  EXPECT_LT(steady_clock::now() - closing, milliseconds(2000));
}

// A stopped shard accepts the new connection (the kernel does) but never
// answers its Hello: a client closed then does not wait out the handshake's
// deadline, and fails what was pending.
TEST_F(Reconnect, ClosedMidHandshakeWithoutWaitingForTheDeadline) {
  ASSERT_NO_FATAL_FAILURE(
      StartCluster({"--worker-timeout-ms", "1000", "--heartbeat-ms", "200"}));
  std::unique_ptr<Client> client = ConnectWorker();
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->DefineTensor("w", {1000}).ok());

  cluster_->shard(1).Signal(SIGSTOP);
  // Silent past the run's worker timeout: the client drops the connection
  // and dials again; the dial succeeds, the Hello waits.
  ASSERT_TRUE(Eventually([&] { return client->shard_losses() > 0; }, 10000));
  std::this_thread::sleep_for(milliseconds(500));
  // Its part for shard 1 waits on the new connection (or fails at once,
  // between dials): either way it has failed once the client is closed.
  std::vector<float> values(1000);
  std::promise<Status> pulled;
  client->PullAsync("w", values,
                    [&pulled](const Status& s) { pulled.set_value(s); });
  const auto closing = steady_clock::now();
  client.reset();
  EXPECT_LT(steady_clock::now() - closing, milliseconds(2000));
  auto result = pulled.get_future();
  ASSERT_EQ(result.wait_for(milliseconds(0)), std::future_status::ready);
  EXPECT_EQ(result.get().code(), Code::kUnavailable);
  cluster_->shard(1).Signal(SIGCONT);
}

}  // namespace
}  // namespace tether::testing

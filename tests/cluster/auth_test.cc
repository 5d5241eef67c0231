// Shared-key authentication between real processes over real TCP: a keyed
// cluster trains while peers with no key, a wrong key or a replayed Hello
// are refused with a clear log line, and a shard refuses to listen beyond
// loopback without a key.
#include "schema/auth.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "tests/support/cluster.h"
#include "tests/support/raw_peer.h"

namespace tether {
namespace {

using testing::Cluster;
using testing::ClusterOptions;
using testing::ConnectObserver;
using testing::Contains;
using testing::ErrorReply;
using testing::ExpectAllRunning;
using testing::ExpectRefused;
using testing::ExpectServing;
using testing::HelloFrame;
using testing::kReplyTimeoutMs;
using testing::ProcStatusKib;
using testing::RawPeer;
using testing::ReadError;
using testing::RunToExit;
using testing::TempDir;

constexpr char kRunKey[] = "tether-test-run-key-0123456789";

std::string WriteKey(const std::string& dir, const std::string& name,
                     const std::string& key) {
  const std::string path = dir + "/" + name;
  std::ofstream(path) << key << "\n";
  chmod(path.c_str(), 0600);
  return path;
}

// The frame a RawPeer read, as the message it carries (null when it failed).
const wire::Message* MessageOf(const Result<Frame>& frame) {
  EXPECT_TRUE(frame.ok()) << frame.status().ToString();
  return frame.ok() ? frame->message() : nullptr;
}

class Auth : public ::testing::Test {
 protected:
  void StartKeyedCluster(int shards, int workers) {
    key_file_ = WriteKey(dir_.path(), "run.key", kRunKey);
    ClusterOptions o;
    o.shards = shards;
    o.workers = workers;
    o.block_size = 16;
    o.shard_flags = {"--auth-key-file", key_file_};
    auto c = Cluster::Start(o, dir_.path());
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    cluster_ = std::move(*c);
  }

  TempDir dir_;
  std::string key_file_;
  std::unique_ptr<Cluster> cluster_;
};

TEST_F(Auth, KeyedClusterTrainsWhileOutsidersAreRefused) {
  ASSERT_NO_FATAL_FAILURE(StartKeyedCluster(2, 2));
  // Shard 1 registered with the coordinator through the same handshake.
  EXPECT_TRUE(cluster_->shard(1)
                  .WaitForLine("authentication: every peer proves the key",
                               kReplyTimeoutMs)
                  .ok());
  auto workers = testing::StartWorkers(
      cluster_->coordinator(), 2, dir_.path(),
      {"--model", "softmax", "--epochs", "1", "--batch", "100", "--staleness",
       "2", "--eval-every", "0", "--auth-key-file", key_file_});
  ASSERT_EQ(workers.size(), 2u);
  auto healthy = ConnectObserver(cluster_->coordinator(), key_file_);
  ASSERT_NE(healthy, nullptr);
  const int64_t rss_before = ProcStatusKib(cluster_->shard(0).pid(), "VmRSS");

  // No key: a Hello without a nonce.
  ErrorReply reply;
  ASSERT_NO_FATAL_FAILURE(ExpectRefused(
      cluster_->coordinator(), HelloFrame(kProtocolVersion), false, &reply));
  EXPECT_EQ(reply.code, wire::ErrorCode::AuthFailed);
  EXPECT_TRUE(Contains(reply.message, "requires authentication"));
  EXPECT_TRUE(
      cluster_->shard(0)
          .WaitForLine("this shard requires authentication", kReplyTimeoutMs)
          .ok());

  // A real tool without the key, and with a wrong one: each says why.
  std::string output;
  auto code = RunToExit(
      {TETHER_CLIENT_BIN, "stats", "--coordinator", cluster_->coordinator()},
      &output, 20000);
  ASSERT_TRUE(code.ok());
  EXPECT_NE(*code, 0);
  EXPECT_TRUE(Contains(output, "requires authentication")) << output;
  const std::string wrong =
      WriteKey(dir_.path(), "wrong.key", "not-the-run-key-0123456789");
  code = RunToExit({TETHER_CLIENT_BIN, "stats", "--coordinator",
                    cluster_->coordinator(), "--auth-key-file", wrong},
                   &output, 20000);
  ASSERT_TRUE(code.ok());
  EXPECT_NE(*code, 0);
  EXPECT_TRUE(Contains(output, "could not prove it holds the key")) << output;

  // A wrong key on the wire, from a peer that ignores the shard's proof.
  {
    auto peer = RawPeer::Connect(cluster_->coordinator());
    ASSERT_TRUE(peer.ok());
    HelloFields forged;
    forged.nonce = NewNonce();
    ASSERT_FALSE((*peer)->Send(testing::Bytes(*MakeHelloFrame(forged))));
    auto challenge = (*peer)->ReadFrame(kReplyTimeoutMs);
    const wire::Message* m = MessageOf(challenge);
    ASSERT_NE(m, nullptr);
    ASSERT_NE(m->body_as_Challenge(), nullptr);
    const auto* sn = m->body_as_Challenge()->nonce();
    forged.proof = HelloProof(
        AuthKey("not-the-run-key-0123456789"),
        std::string_view(reinterpret_cast<const char*>(sn->data()), sn->size()),
        forged.nonce, forged.role, forged.rank, forged.shard_id);
    ASSERT_FALSE((*peer)->Send(testing::Bytes(*MakeHelloFrame(forged))));
    auto error = ReadError(**peer);
    ASSERT_TRUE(error.ok()) << error.status().ToString();
    EXPECT_EQ(error->code, wire::ErrorCode::AuthFailed);
    EXPECT_TRUE(Contains(error->message, "a wrong --auth-key-file"));
    EXPECT_TRUE((*peer)->WaitForClose(kReplyTimeoutMs).ok());
    EXPECT_TRUE(cluster_->shard(0)
                    .WaitForLine("does not match this connection's challenge",
                                 kReplyTimeoutMs)
                    .ok());
  }

  // A replayed Hello: a genuine handshake is recorded on one connection,
  // then its frames are sent again on a new one.
  PeerAuth genuine(std::make_shared<const AuthKey>(std::string(kRunKey)));
  HelloFields observer;
  observer.name = "recorded observer";
  const std::vector<uint8_t> first = testing::Bytes(*genuine.First(observer));
  std::vector<uint8_t> second;
  {
    auto peer = RawPeer::Connect(cluster_->coordinator());
    ASSERT_TRUE(peer.ok());
    ASSERT_FALSE((*peer)->Send(first));
    auto challenge = (*peer)->ReadFrame(kReplyTimeoutMs);
    const wire::Message* m = MessageOf(challenge);
    ASSERT_NE(m, nullptr);
    ASSERT_NE(m->body_as_Challenge(), nullptr);
    auto answer = genuine.Answer(*m->body_as_Challenge(), "shard 0");
    ASSERT_TRUE(answer.ok()) << answer.status().ToString();
    second = testing::Bytes(**answer);
    ASSERT_FALSE((*peer)->Send(second));
    auto welcome = (*peer)->ReadFrame(kReplyTimeoutMs);
    m = MessageOf(welcome);
    ASSERT_NE(m, nullptr);
    EXPECT_NE(m->body_as_Welcome(), nullptr)
        << "the genuine handshake got " << wire::EnumNameBody(m->body_type());
  }
  {
    auto peer = RawPeer::Connect(cluster_->coordinator());
    ASSERT_TRUE(peer.ok());
    ASSERT_FALSE((*peer)->Send(first));
    auto challenge = (*peer)->ReadFrame(kReplyTimeoutMs);
    ASSERT_NE(MessageOf(challenge), nullptr);
    ASSERT_FALSE((*peer)->Send(second));
    auto error = ReadError(**peer);
    ASSERT_TRUE(error.ok()) << error.status().ToString();
    EXPECT_EQ(error->code, wire::ErrorCode::AuthFailed);
    EXPECT_TRUE(Contains(error->message, "a replayed Hello"));
    EXPECT_TRUE((*peer)->WaitForClose(kReplyTimeoutMs).ok());
  }
  ASSERT_NO_FATAL_FAILURE(
      ExpectRefused(cluster_->coordinator(), second, false, &reply));
  EXPECT_EQ(reply.code, wire::ErrorCode::AuthFailed);
  EXPECT_TRUE(Contains(reply.message, "no challenge of this connection"));

  // Many more refused handshakes cost the shard no memory to speak of.
  for (int i = 0; i < 200; ++i) {
    auto peer = RawPeer::Connect(cluster_->coordinator());
    ASSERT_TRUE(peer.ok());
    (void)(*peer)->Send(i % 2 == 0 ? HelloFrame(kProtocolVersion) : second);
    (void)ReadError(**peer);
  }
  ExpectAllRunning(*cluster_);
  ExpectServing(*healthy, "after_refused_peers", 0.1f);
  const int64_t rss_after = ProcStatusKib(cluster_->shard(0).pid(), "VmRSS");
  EXPECT_LT(rss_after, rss_before + 16 * 1024)
      << "RSS " << rss_before << " KiB -> " << rss_after << " KiB";

  // The keyed workers were never disturbed: both finish.
  for (size_t r = 0; r < workers.size(); ++r) {
    auto exit = workers[r]->Wait(120000);
    ASSERT_TRUE(exit.ok()) << "worker " << r << " did not finish";
    EXPECT_EQ(*exit, 0) << "worker " << r << ":\n"
                        << Tail(workers[r]->Log(), 10);
  }
  // No key bytes in any log.
  for (int i = 0; i < cluster_->num_shards(); ++i) {
    EXPECT_EQ(cluster_->shard(i).Log().find(kRunKey), std::string::npos);
  }
}

TEST_F(Auth, KeyedPeerRefusesAnUnkeyedShard) {
  ClusterOptions o;
  auto c = Cluster::Start(o, dir_.path());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const std::string key = WriteKey(dir_.path(), "run.key", kRunKey);
  std::string output;
  auto code = RunToExit({TETHER_CLIENT_BIN, "stats", "--coordinator",
                         (*c)->coordinator(), "--auth-key-file", key},
                        &output, 20000);
  ASSERT_TRUE(code.ok());
  EXPECT_NE(*code, 0);
  EXPECT_TRUE(Contains(output, "without --auth-key-file")) << output;
  EXPECT_TRUE((*c)->shard(0).WaitForLine("without --auth-key-file", 3000).ok());
}

TEST_F(Auth, ShardListensBeyondLoopbackOnlyWithAKeyOrInsecure) {
  std::string output;
  auto code =
      RunToExit({TETHER_SERVER_BIN, "--listen", "0.0.0.0:0", "--http", "off"},
                &output, 20000);
  ASSERT_TRUE(code.ok());
  EXPECT_NE(*code, 0);
  EXPECT_TRUE(Contains(output, "--listen 0.0.0.0:0 is not a loopback address"));
  EXPECT_TRUE(Contains(output, "--auth-key-file"));
  EXPECT_TRUE(Contains(output, "--insecure"));

  auto insecure = Process::Start({TETHER_SERVER_BIN, "--listen", "0.0.0.0:0",
                                  "--http", "off", "--insecure"},
                                 dir_.path() + "/insecure.log");
  ASSERT_TRUE(insecure.ok());
  EXPECT_TRUE(
      (*insecure)->WaitForLine("authentication: OFF (--insecure)", 10000).ok());
  EXPECT_TRUE((*insecure)->WaitForLine("listening on", 10000).ok());

  const std::string key = WriteKey(dir_.path(), "run.key", kRunKey);
  auto keyed = Process::Start({TETHER_SERVER_BIN, "--listen", "0.0.0.0:0",
                               "--http", "off", "--auth-key-file", key},
                              dir_.path() + "/keyed.log");
  ASSERT_TRUE(keyed.ok());
  EXPECT_TRUE((*keyed)->WaitForLine("listening on", 10000).ok());
  EXPECT_EQ((*keyed)->Log().find(kRunKey), std::string::npos);

  // A key file that is missing or too short stops the shard at start.
  code = RunToExit({TETHER_SERVER_BIN, "--auth-key-file",
                    dir_.path() + "/missing.key", "--http", "off"},
                   &output, 20000);
  ASSERT_TRUE(code.ok());
  EXPECT_NE(*code, 0);
  EXPECT_TRUE(
      Contains(output, "--auth-key-file " + dir_.path() + "/missing.key"));
}

// The dashboard follows the shard's rule: beyond loopback only with its
// token, or with --insecure and a loud warning.
TEST_F(Auth, DashboardServesBeyondLoopbackOnlyWithATokenOrInsecure) {
  std::string output;
  auto code = RunToExit(
      {TETHER_SERVER_BIN, "--listen", "127.0.0.1:0", "--http", "0.0.0.0:0"},
      &output, 20000);
  ASSERT_TRUE(code.ok());
  EXPECT_NE(*code, 0);
  EXPECT_TRUE(Contains(output, "--http 0.0.0.0:0 is not a loopback address"));
  EXPECT_TRUE(Contains(output, "--http-token-file"));
  EXPECT_TRUE(Contains(output, "--insecure"));
  EXPECT_FALSE(Contains(output, "dashboard at http://"));

  auto tokened = Process::Start(
      {TETHER_SERVER_BIN, "--listen", "127.0.0.1:0", "--http", "0.0.0.0:0",
       "--http-token-file", dir_.path() + "/dashboard.token"},
      dir_.path() + "/tokened.log");
  ASSERT_TRUE(tokened.ok());
  EXPECT_TRUE(
      (*tokened)->WaitForLine("dashboard at http://0.0.0.0:", 10000).ok())
      << (*tokened)->Log();

  auto insecure = Process::Start({TETHER_SERVER_BIN, "--listen", "127.0.0.1:0",
                                  "--http", "0.0.0.0:0", "--insecure"},
                                 dir_.path() + "/insecure.log");
  ASSERT_TRUE(insecure.ok());
  EXPECT_TRUE(
      (*insecure)->WaitForLine("dashboard at http://0.0.0.0:", 10000).ok())
      << (*insecure)->Log();
  EXPECT_TRUE(Contains((*insecure)->Log(),
                       "dashboard: no --http-token-file (--insecure): anyone "
                       "who reaches 0.0.0.0:"));
}

}  // namespace
}  // namespace tether

// TLS between real processes over real TCP (schema/tls.h): a cluster whose
// shards, workers and tools all speak TLS trains, while a peer without a
// client certificate, one whose certificate another CA signed, and one
// speaking plain TCP are refused, each with the reason in the shard's log;
// a TLS client that dials a plain shard says why it cannot; and a shard
// given a key that does not match its certificate refuses to start.
#include <gtest/gtest.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <memory>
#include <string>
#include <vector>

#include "schema/flags.h"
#include "tests/support/certs.h"
#include "tests/support/cluster.h"

namespace tether {
namespace {

using testing::Cluster;
using testing::ClusterOptions;
using testing::RunToExit;
using testing::TempDir;

constexpr int kLogTimeoutMs = 10000;

class Tls : public ::testing::Test {
 protected:
  void SetUp() override {
    auto made = testing::TestCerts::Make(dir_.path() + "/certs");
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    certs_ = *made;
  }

  void StartCluster(int shards, int workers,
                    const std::vector<std::string>& shard_flags) {
    ClusterOptions o;
    o.shards = shards;
    o.workers = workers;
    o.block_size = 64;
    o.shard_flags = shard_flags;
    auto c = Cluster::Start(o, dir_.path());
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    cluster_ = std::move(*c);
  }

  // Runs tether-client `command` against the cluster with `flags` added.
  int Client(const std::string& command, const std::vector<std::string>& flags,
             std::string* output) {
    std::vector<std::string> argv = {
        TETHER_CLIENT_BIN, command, "--coordinator", cluster_->coordinator(),
        "--shape",         "1000",  "--quiet"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    auto rc = RunToExit(argv, output, 60000);
    EXPECT_TRUE(rc.ok()) << rc.status().ToString();
    return rc.ok() ? *rc : -1;
  }

  TempDir dir_;
  testing::TestCerts certs_;
  std::unique_ptr<Cluster> cluster_;
};

TEST_F(Tls, TlsClusterTrainsAndSaysSo) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(2, 2, certs_.Flags()));
  // Shard 1 registered with the coordinator over TLS.
  EXPECT_TRUE(cluster_->shard(1)
                  .WaitForLine("TLS: every connection", kLogTimeoutMs)
                  .ok());
  // Two real workers train the MLP on Fashion-MNIST over TLS.
  std::vector<std::string> flags = certs_.Flags();
  flags.insert(flags.end(), {"--model", "softmax", "--epochs", "1", "--quiet",
                             "--eval-every", "0"});
  auto workers =
      testing::StartWorkers(cluster_->coordinator(), 2, dir_.path(), flags);
  for (size_t r = 0; r < workers.size(); ++r) {
    auto code = workers[r]->Wait(120000);
    ASSERT_TRUE(code.ok()) << code.status().ToString();
    EXPECT_EQ(*code, 0) << workers[r]->Log();
  }
  EXPECT_NE(workers[0]->Log().find("test accuracy"), std::string::npos)
      << workers[0]->Log();
  // An observer over TLS reads what they pushed.
  std::string out;
  EXPECT_EQ(Client("stats", certs_.Flags(), &out), 0) << out;
  EXPECT_NE(out.find("min_clock="), std::string::npos) << out;
}

TEST_F(Tls, PeersWithoutTheRunsCertificateAreRefusedWithAReason) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(1, 1, certs_.Flags()));
  Process& shard = cluster_->shard(0);
  std::string out;

  // Plain TCP to a TLS shard.
  EXPECT_NE(Client("stats", {"--connect-timeout-ms", "2000"}, &out), 0) << out;
  EXPECT_TRUE(
      shard.WaitForLine("failed: wrong version number", kLogTimeoutMs).ok())
      << shard.Log();

  // A certificate another CA signed (it trusts the run's CA itself).
  EXPECT_NE(
      Client("stats",
             {"--connect-timeout-ms", "2000", "--tls-cert",
              certs_.File("other.pem"), "--tls-key", certs_.File("other.key"),
              "--tls-ca", certs_.File("ca.pem")},
             &out),
      0)
      << out;
  EXPECT_TRUE(
      shard.WaitForLine("failed: certificate verify failed", kLogTimeoutMs)
          .ok())
      << shard.Log();

  // No client certificate at all: a TLS client that trusts the CA but
  // shows nothing.
  {
    namespace asio = boost::asio;
    namespace ssl = asio::ssl;
    asio::io_context io;
    ssl::context ctx(ssl::context::tls_client);
    ctx.load_verify_file(certs_.File("ca.pem"));
    ctx.set_verify_mode(ssl::verify_peer);
    ssl::stream<asio::ip::tcp::socket> stream(io, ctx);
    auto hp = ParseHostPort(cluster_->coordinator(), "coordinator");
    ASSERT_TRUE(hp.ok());
    asio::ip::tcp::resolver resolver(io);
    asio::connect(stream.next_layer(),
                  resolver.resolve(hp->host, std::to_string(hp->port)));
    boost::system::error_code ec;
    stream.handshake(ssl::stream_base::client, ec);
    // TLS 1.3 finishes the client's side before the server checks its
    // certificate: the refusal shows on the first read.
    if (!ec) {
      char byte;
      stream.read_some(asio::buffer(&byte, 1), ec);
    }
    EXPECT_TRUE(ec) << "a client without a certificate was served";
  }
  EXPECT_TRUE(shard
                  .WaitForLine("failed: peer did not return a certificate",
                               kLogTimeoutMs)
                  .ok())
      << shard.Log();

  // The shard still serves the run's own peers.
  EXPECT_EQ(Client("stats", certs_.Flags(), &out), 0) << out;
}

TEST_F(Tls, TlsClientToAPlainShardSaysWhy) {
  ASSERT_NO_FATAL_FAILURE(StartCluster(1, 1, {}));
  std::string out;
  std::vector<std::string> flags = certs_.Flags();
  flags.insert(flags.end(), {"--connect-timeout-ms", "3000"});
  EXPECT_NE(Client("stats", flags, &out), 0) << out;
  EXPECT_NE(out.find("TLS handshake with"), std::string::npos) << out;
}

TEST_F(Tls, KeyThatDoesNotMatchTheCertificateIsRefusedAtStart) {
  std::string out;
  auto rc =
      RunToExit({TETHER_SERVER_BIN, "--listen", "127.0.0.1:0", "--http", "off",
                 "--tls-cert", certs_.File("node.pem"), "--tls-key",
                 certs_.File("other.key"), "--tls-ca", certs_.File("ca.pem")},
                &out, 20000);
  ASSERT_TRUE(rc.ok()) << rc.status().ToString();
  EXPECT_NE(*rc, 0) << out;
  EXPECT_NE(out.find("--tls-key"), std::string::npos) << out;
  EXPECT_NE(out.find("does not match"), std::string::npos) << out;

  // Half a set is refused by the flag check, naming what is missing.
  rc = RunToExit(
      {TETHER_SERVER_BIN, "--check", "--tls-cert", certs_.File("node.pem")},
      &out, 20000);
  ASSERT_TRUE(rc.ok());
  EXPECT_EQ(*rc, 2) << out;
  EXPECT_NE(out.find("--tls-key: required"), std::string::npos) << out;
}

}  // namespace
}  // namespace tether

// What a cluster engine (Kubernetes) sees of real tether-server processes:
// GET /healthz and /readyz on shard 0's dashboard and on any shard's
// --health port (503 with the reason until the shard serves the run, 200
// after, 503 again once its coordinator is gone), and --check, which says
// what a shard would be from its flags and TETHER_* variables and starts
// nothing.
#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <memory>
#include <string>
#include <vector>

#include "tests/support/cluster.h"
#include "tools/http_client.h"

namespace tether {
namespace {

using testing::Eventually;
using testing::Process;
using testing::RunToExit;
using testing::TempDir;

constexpr int kTimeoutMs = 10000;

// A loopback port nobody listens on now.
int FreePort() {
  boost::asio::io_context io;
  boost::asio::ip::tcp::acceptor a(
      io, {boost::asio::ip::make_address("127.0.0.1"), 0});
  return a.local_endpoint().port();
}

std::string Local(int port) { return "127.0.0.1:" + std::to_string(port); }

// The status and body of GET `path` at `address`; status 0 when nothing
// answered.
HttpReply Probe(const std::string& address, const std::string& path) {
  auto reply = HttpFetch(address, "GET", path);
  return reply.ok() ? *reply : HttpReply{};
}

std::unique_ptr<Process> Start(const std::vector<std::string>& argv,
                               const std::string& log) {
  auto p = Process::Start(argv, log);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return p.ok() ? std::move(*p) : nullptr;
}

TEST(Probes, ReadyOnlyWhileTheShardServesTheRun) {
  TempDir dir;
  const int coordinator = FreePort();
  const int health0 = FreePort();
  const int health1 = FreePort();
  const int dashboard = FreePort();

  // Shard 1 first, as a pod can be: alive, not ready, and saying why.
  auto shard1 =
      Start({TETHER_SERVER_BIN, "--shard-id", "1", "--shards", "2", "--listen",
             "127.0.0.1:0", "--coordinator", Local(coordinator),
             "--connect-timeout-ms", "30000", "--health", Local(health1)},
            dir.path() + "/shard1.log");
  ASSERT_NE(shard1, nullptr);
  ASSERT_TRUE(Eventually(
      [&] { return Probe(Local(health1), "/healthz").status == 200; },
      kTimeoutMs))
      << shard1->Log();
  HttpReply r = Probe(Local(health1), "/readyz");
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_NE(
      r.body.find("registering with the coordinator at " + Local(coordinator)),
      std::string::npos)
      << r.body;

  // Shard 0 comes up: its dashboard and its health port answer too.
  auto shard0 =
      Start({TETHER_SERVER_BIN, "--shards", "2", "--listen", Local(coordinator),
             "--http", Local(dashboard), "--health", Local(health0)},
            dir.path() + "/shard0.log");
  ASSERT_NE(shard0, nullptr);
  for (const std::string& at : {Local(health0), Local(dashboard)}) {
    EXPECT_TRUE(Eventually([&] { return Probe(at, "/readyz").status == 200; },
                           kTimeoutMs))
        << at << ": " << Probe(at, "/readyz").body << shard0->Log();
    EXPECT_EQ(Probe(at, "/healthz").body, "ok\n");
  }
  EXPECT_TRUE(
      Eventually([&] { return Probe(Local(health1), "/readyz").status == 200; },
                 kTimeoutMs))
      << shard1->Log();
  // Only the probes live on the health port.
  EXPECT_EQ(Probe(Local(health1), "/api/config").status, 404);
  auto post = HttpFetch(Local(health1), "POST", "/readyz");
  ASSERT_TRUE(post.ok());
  EXPECT_EQ(post->status, 405);

  // The coordinator goes: shard 1 is alive but no longer ready.
  shard0.reset();  // SIGKILL
  EXPECT_TRUE(
      Eventually([&] { return Probe(Local(health1), "/readyz").status == 503; },
                 kTimeoutMs))
      << shard1->Log();
  EXPECT_NE(Probe(Local(health1), "/readyz").body.find("out of reach"),
            std::string::npos);
}

TEST(Probes, CheckSaysWhatTheShardWouldBeFromFlagsAndVariables) {
  const int port = FreePort();
  std::string out;
  auto rc = RunToExit(
      {"/usr/bin/env", "TETHER_SHARD_ID=1", "TETHER_SHARDS=3",
       "TETHER_COORDINATOR=tether-shard-0.tether-shard:7070", TETHER_SERVER_BIN,
       "--check", "--listen", Local(port), "--health", "0.0.0.0:8081"},
      &out, kTimeoutMs);
  ASSERT_TRUE(rc.ok()) << rc.status().ToString();
  EXPECT_EQ(*rc, 0) << out;
  EXPECT_NE(out.find("flags ok: shard 1 of 3, listening on " + Local(port)),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("coordinator tether-shard-0.tether-shard:7070"),
            std::string::npos)
      << out;
  // Nothing was started: the port is still free.
  boost::asio::io_context io;
  boost::system::error_code ec;
  boost::asio::ip::tcp::acceptor a(io);
  a.open(boost::asio::ip::tcp::v4());
  a.bind({boost::asio::ip::make_address("127.0.0.1"),
          static_cast<unsigned short>(port)},
         ec);
  EXPECT_FALSE(ec) << ec.message();

  // A bad variable is named, and so is the flag it stands for.
  rc = RunToExit(
      {"/usr/bin/env", "TETHER_SHARD_ID=one", TETHER_SERVER_BIN, "--check"},
      &out, kTimeoutMs);
  ASSERT_TRUE(rc.ok());
  EXPECT_EQ(*rc, 2) << out;
  EXPECT_NE(out.find("TETHER_SHARD_ID"), std::string::npos) << out;
  EXPECT_NE(out.find("--shard-id"), std::string::npos) << out;

  // A run-wide setting given to shard 1 through a variable is refused as
  // the flag would be.
  rc = RunToExit(
      {"/usr/bin/env", "TETHER_WORKERS=4", TETHER_SERVER_BIN, "--check",
       "--shard-id", "1", "--shards", "2", "--coordinator", "127.0.0.1:7070"},
      &out, kTimeoutMs);
  ASSERT_TRUE(rc.ok());
  EXPECT_EQ(*rc, 2) << out;
  EXPECT_NE(out.find("--workers: run-wide setting"), std::string::npos) << out;

  // The worker's --check: the same for a worker's variables.
  rc = RunToExit(
      {"/usr/bin/env", "TETHER_RANK=2", "TETHER_SLOWDOWN=3", TETHER_WORKER_BIN,
       "--check", "--coordinator", "tether-shard-0.tether-shard:7070"},
      &out, kTimeoutMs);
  ASSERT_TRUE(rc.ok());
  EXPECT_EQ(*rc, 0) << out;
  EXPECT_NE(out.find("rank 2"), std::string::npos) << out;
  EXPECT_NE(out.find("slowed 3x"), std::string::npos) << out;
  rc = RunToExit({TETHER_WORKER_BIN, "--check", "--model", "resnet"}, &out,
                 kTimeoutMs);
  ASSERT_TRUE(rc.ok());
  EXPECT_EQ(*rc, 2) << out;
  EXPECT_NE(out.find("--model: unknown 'resnet'"), std::string::npos) << out;
}

}  // namespace
}  // namespace tether

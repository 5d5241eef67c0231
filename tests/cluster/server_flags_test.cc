// tether-server run as a real process: bad flags and failed startups must
// exit non-zero with a message naming the flag (and address) at fault; a
// SIGTERM must stop a running shard cleanly.
#include <gtest/gtest.h>
#include <signal.h>

#include <boost/json/parse.hpp>
#include <chrono>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/cluster.h"
#include "tools/http_client.h"
#include "worker/client.h"

namespace tether {
namespace {

using testing::Process;
using testing::RunToExit;
using testing::TempDir;

constexpr int kExitTimeoutMs = 5000;

::testing::AssertionResult Contains(const std::string& text,
                                    const std::string& part) {
  if (text.find(part) != std::string::npos) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "output does not contain '" << part << "':\n"
         << text;
}

// Runs tether-server with `flags`; returns its exit code, fills `output`.
int RunServer(const std::vector<std::string>& flags, std::string* output) {
  // Never the default dashboard port: tests run side by side.
  std::vector<std::string> argv = {TETHER_SERVER_BIN, "--http", "127.0.0.1:0"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  auto code = RunToExit(argv, output, kExitTimeoutMs);
  EXPECT_TRUE(code.ok()) << code.status().ToString() << "\n" << *output;
  return code.ok() ? *code : -1;
}

// A coordinator on a free loopback port, logging to `dir`.
struct RunningShard {
  std::unique_ptr<Process> process;
  std::string address;
};

RunningShard StartCoordinator(const TempDir& dir,
                              std::vector<std::string> extra = {}) {
  const std::string ready_file = dir.path() + "/shard0.ready";
  std::vector<std::string> argv = {
      TETHER_SERVER_BIN, "--listen",     "127.0.0.1:0", "--http",
      "127.0.0.1:0",     "--ready-file", ready_file};
  argv.insert(argv.end(), extra.begin(), extra.end());
  auto process = Process::Start(argv, dir.path() + "/shard0.log");
  EXPECT_TRUE(process.ok()) << process.status().ToString();
  if (!process.ok()) return {};
  auto ready = (*process)->WaitForReady(ready_file, kExitTimeoutMs);
  EXPECT_TRUE(ready.ok()) << ready.status().ToString();
  if (!ready.ok()) return {};
  return {std::move(*process), ready->advertise};
}

TEST(ServerFlags, UnknownFlagNamed) {
  std::string output;
  EXPECT_EQ(RunServer({"--bogus", "1"}, &output), 2);
  EXPECT_TRUE(Contains(output, "--bogus"));
  EXPECT_TRUE(Contains(output, "unknown flag"));
}

TEST(ServerFlags, BadValueNamesFlag) {
  std::string output;
  EXPECT_EQ(RunServer({"--shards", "x"}, &output), 2);
  EXPECT_TRUE(Contains(output, "--shards"));
  EXPECT_TRUE(Contains(output, "'x'"));
}

TEST(ServerFlags, MissingValueNamesFlag) {
  std::string output;
  EXPECT_EQ(RunServer({"--listen"}, &output), 2);
  EXPECT_TRUE(Contains(output, "--listen"));
  EXPECT_TRUE(Contains(output, "missing value"));
}

TEST(ServerFlags, PerAddressCapMustBePositive) {
  std::string output;
  EXPECT_EQ(RunServer({"--http-max-clients-per-address", "0"}, &output), 2);
  EXPECT_TRUE(Contains(output, "--http-max-clients-per-address: must be >= 1"));
}

TEST(ServerFlags, PortInUseNamesAddress) {
  TempDir dir;
  RunningShard first = StartCoordinator(dir);
  ASSERT_NE(first.process, nullptr);
  ASSERT_FALSE(first.address.empty());
  std::string output;
  EXPECT_NE(RunServer({"--listen", first.address}, &output), 0);
  EXPECT_TRUE(Contains(output, "--listen"));
  EXPECT_TRUE(Contains(output, first.address));
  EXPECT_TRUE(first.process->Running()) << "the first shard was disturbed";
}

TEST(ServerFlags, UnreachableCoordinatorNamed) {
  std::string output;
  EXPECT_EQ(
      RunServer({"--shard-id", "1", "--shards", "2", "--listen", "127.0.0.1:0",
                 "--coordinator", "127.0.0.1:1", "--connect-timeout-ms", "500"},
                &output),
      1);
  EXPECT_TRUE(Contains(output, "coordinator"));
  EXPECT_TRUE(Contains(output, "127.0.0.1:1"));
}

TEST(ServerFlags, RunWideFlagsOnlyOnShardZero) {
  std::string output;
  EXPECT_EQ(
      RunServer({"--shard-id", "1", "--shards", "2", "--listen", "127.0.0.1:0",
                 "--coordinator", "127.0.0.1:1", "--lr", "0.5"},
                &output),
      2);
  EXPECT_TRUE(Contains(output, "--lr"));
  EXPECT_TRUE(Contains(output, "shard 0"));
}

TEST(ServerFlags, HelpListsEveryFlag) {
  std::string output;
  EXPECT_EQ(RunServer({"--help"}, &output), 0);
  for (const char* flag : {"--shard-id",
                           "--shards",
                           "--listen",
                           "--advertise",
                           "--coordinator",
                           "--data-dir",
                           "--workers",
                           "--max-staleness",
                           "--reject-staleness",
                           "--block-size",
                           "--seed",
                           "--optimizer",
                           "--lr",
                           "--momentum",
                           "--beta1",
                           "--beta2",
                           "--epsilon",
                           "--threads",
                           "--max-frame-bytes",
                           "--connect-timeout-ms",
                           "--verbose",
                           "--ready-file",
                           "-h, --help"}) {
    // Each flag heads its own line: "  --name VALUE", or "  --name" alone.
    const std::string head = std::string("\n  ") + flag;
    EXPECT_TRUE(Contains(output, head + " VALUE\n") ||
                Contains(output, head + "\n"))
        << flag << " is not listed:\n"
        << output;
  }
  EXPECT_TRUE(Contains(output, "(default: 65536)"));  // --block-size
}

TEST(ServerFlags, ShardCountMismatchRefused) {
  TempDir dir;
  RunningShard coordinator = StartCoordinator(dir, {"--shards", "2"});
  ASSERT_NE(coordinator.process, nullptr);
  std::string output;
  EXPECT_NE(RunServer({"--shard-id", "1", "--shards", "3", "--listen",
                       "127.0.0.1:0", "--coordinator", coordinator.address,
                       "--connect-timeout-ms", "2000"},
                      &output),
            0);
  EXPECT_TRUE(Contains(output, "--shards"));
  EXPECT_TRUE(Contains(output, "3"));
  EXPECT_TRUE(Contains(output, "2"));
  EXPECT_TRUE(coordinator.process->Running());
}

// Reads `path` as soon as it exists (polling every millisecond, so that a
// file written in pieces would be caught half done); "" after `timeout_ms`.
std::string FirstSight(const std::string& path, int timeout_ms) {
  const auto end =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < end) {
    if (std::ifstream in(path); in) {
      std::stringstream text;
      text << in.rdbuf();
      return text.str();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return "";
}

// --ready-file: JSON, whole the moment it appears, saying where shard 0
// listens and serves its dashboard (the addresses its log names, port 0
// resolved), and shard 1 with no dashboard; a stale file is not taken for
// the shard's.
TEST(ServerFlags, ReadyFileIsWholeAndSaysWhereTheShardListens) {
  TempDir dir;
  const std::string ready0 = dir.path() + "/shard0.ready";
  auto shard0 = Process::Start(
      {TETHER_SERVER_BIN, "--shards", "2", "--listen", "127.0.0.1:0", "--http",
       "127.0.0.1:0", "--ready-file", ready0},
      dir.path() + "/shard0.log");
  ASSERT_TRUE(shard0.ok()) << shard0.status().ToString();
  const std::string text = FirstSight(ready0, 10000);
  ASSERT_NE(text, "") << (*shard0)->Log();
  auto ready = ParseShardReady(text);
  ASSERT_TRUE(ready.ok()) << ready.status().ToString() << ": " << text;
  EXPECT_EQ(ready->shard_id, 0);
  EXPECT_EQ(ready->pid, (*shard0)->pid());
  EXPECT_EQ(ready->listen.rfind("127.0.0.1:", 0), 0u) << text;
  EXPECT_NE(ready->listen, "127.0.0.1:0") << text;
  EXPECT_EQ(ready->advertise, ready->listen);
  const std::string log = (*shard0)->Log();
  EXPECT_TRUE(Contains(log, "listening on " + ready->listen));
  EXPECT_TRUE(Contains(log, "dashboard at " + ready->dashboard));
  // Both answer already.
  ASSERT_EQ(ready->dashboard.rfind("http://127.0.0.1:", 0), 0u) << text;
  const std::string http = ready->dashboard.substr(
      7, ready->dashboard.size() - 8);  // without http:// and the last /
  auto status = HttpFetch(http, "GET", "/api/status");
  ASSERT_TRUE(status.ok()) << status.status().ToString();
  EXPECT_EQ(status->status, 200);

  const std::string ready1 = dir.path() + "/shard1.ready";
  {
    std::ofstream stale(ready1);
    stale << "{\"left\": \"by an earlier run\"}";
  }
  auto shard1 =
      Process::Start({TETHER_SERVER_BIN, "--shard-id", "1", "--shards", "2",
                      "--listen", "127.0.0.1:0", "--coordinator",
                      ready->advertise, "--ready-file", ready1},
                     dir.path() + "/shard1.log");
  ASSERT_TRUE(shard1.ok()) << shard1.status().ToString();
  auto second = (*shard1)->WaitForReady(ready1, 10000);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(second->shard_id, 1);
  EXPECT_NE(second->listen, ready->listen);
  EXPECT_EQ(second->dashboard, "");
  std::ifstream in(ready1);
  std::stringstream text1;
  text1 << in.rdbuf();
  EXPECT_TRUE(boost::json::parse(text1.str()).at("dashboard").is_null())
      << text1.str();
  EXPECT_TRUE((*shard0)->WaitForLine("shard 1 registered", 5000).ok());
}

TEST(ServerFlags, UnwritableReadyFileStopsTheShardNamingIt) {
  TempDir dir;
  std::string output;
  EXPECT_EQ(RunServer({"--listen", "127.0.0.1:0", "--ready-file",
                       dir.path() + "/no/such/dir/shard0.ready"},
                      &output),
            1);
  EXPECT_TRUE(Contains(output, "--ready-file"));
  EXPECT_TRUE(Contains(output, dir.path() + "/no/such/dir/shard0.ready"));
}

TEST(ServerShutdown, SigtermStopsCleanly) {
  TempDir dir;
  RunningShard shard = StartCoordinator(dir);
  ASSERT_NE(shard.process, nullptr);
  {
    // An open session must not hold the shard up.
    ClientOptions o;
    o.coordinator = shard.address;
    o.observer = true;
    o.connect_timeout_ms = 5000;
    o.join_timeout_ms = 5000;
    auto client = Client::Connect(o);
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    ASSERT_TRUE((*client)->DefineTensor("w", {8}).ok());
    shard.process->Signal(SIGTERM);
    auto code = shard.process->Wait(kExitTimeoutMs);
    ASSERT_TRUE(code.ok()) << code.status().ToString() << "\n"
                           << shard.process->Log();
    EXPECT_EQ(*code, 0) << shard.process->Log();
  }
  std::string log = shard.process->Log();
  EXPECT_TRUE(Contains(log, "signal 15"));
  EXPECT_TRUE(Contains(log, "stopped"));
}

}  // namespace
}  // namespace tether

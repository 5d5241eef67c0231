// tether-server run as a real process: bad flags and failed startups must
// exit non-zero with a message naming the flag (and address) at fault; a
// SIGTERM must stop a running shard cleanly.
#include <gtest/gtest.h>
#include <signal.h>

#include <memory>
#include <string>
#include <vector>

#include "tests/cluster.h"
#include "worker/client.h"

namespace tether {
namespace {

using testing::AddressFromLine;
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
  std::vector<std::string> argv = {TETHER_SERVER_BIN, "--listen", "127.0.0.1:0",
                                   "--http", "127.0.0.1:0"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  auto process = Process::Start(argv, dir.path() + "/shard0.log");
  EXPECT_TRUE(process.ok()) << process.status().ToString();
  if (!process.ok()) return {};
  auto line = (*process)->WaitForLine("listening on", kExitTimeoutMs);
  EXPECT_TRUE(line.ok()) << line.status().ToString();
  if (!line.ok()) return {};
  return {std::move(*process), AddressFromLine(*line)};
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

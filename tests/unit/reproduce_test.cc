// The command lines that start a run again (server/reproduce.h), shell
// quoting (schema/flags.h), and the config's list of every process.
#include "server/reproduce.h"

#include <gtest/gtest.h>

#include <boost/json.hpp>
#include <sstream>

#include "schema/flags.h"
#include "server/monitor.h"

namespace tether {
namespace {

namespace json = boost::json;

TEST(ShellCommand, QuotesOnlyWordsAShellWouldSplitOrExpand) {
  EXPECT_EQ(ShellQuote("--lr"), "--lr");
  EXPECT_EQ(ShellQuote("127.0.0.1:7070"), "127.0.0.1:7070");
  EXPECT_EQ(ShellQuote("/data/run_1/x=y,z@2%"), "/data/run_1/x=y,z@2%");
  EXPECT_EQ(ShellQuote(""), "''");
  EXPECT_EQ(ShellQuote("two words"), "'two words'");
  EXPECT_EQ(ShellQuote("$HOME"), "'$HOME'");
  EXPECT_EQ(ShellQuote("{\"hidden\": 64}"), "'{\"hidden\": 64}'");
  EXPECT_EQ(ShellQuote("it's"), "'it'\\''s'");
  const char* argv[] = {"tether-worker", "--model-args", "{\"a\": 1}", "--data",
                        "my data"};
  EXPECT_EQ(ShellCommand(5, argv),
            "tether-worker --model-args '{\"a\": 1}' --data 'my data'");
}

// `text` split at its spaces.
std::vector<std::string> Words(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string word; in >> word;) out.push_back(word);
  return out;
}

RunSettings Settings() {
  RunSettings s;
  s.num_shards = 2;
  s.num_workers = 3;
  s.seed = 42;
  s.optimizer.kind = OptimizerKind::kAdam;
  s.optimizer.lr = 0.001f;
  s.max_staleness = 3;
  return s;
}

TEST(ShardCommand, ShardZeroTakesTheRunSettingsAndKeepsItsOwnFlags) {
  // Started to resume, with a flag that the round overrode: the copy
  // starts the run afresh with the settings it runs with.
  const std::vector<std::string> argv = Words(
      "/opt/tether/bin/tether-server --shard-id 0 --shards 2 --workers 3 "
      "--seed=42 --lr 0.5 --staleness-lr --listen 127.0.0.1:0 --data-dir "
      "/data/run(1) --resume latest --auth-key-file /keys/run.key --insecure "
      "--http=127.0.0.1:0");
  const RunSettings s = Settings();
  const std::string command = ShardCommand(argv, "127.0.0.1:41000", &s);
  EXPECT_EQ(command.rfind("/opt/tether/bin/tether-server --shard-id 0 "
                          "--shards 2 --workers 3 --seed 42 ",
                          0),
            0u)
      << command;
  for (const char* part :
       {" --lr 0.001 ", " --optimizer adam ", " --max-staleness 3 ",
        " --listen 127.0.0.1:41000 ", " --data-dir '/data/run(1)' ",
        " --auth-key-file /keys/run.key ", " --insecure ",
        " --http=127.0.0.1:0"}) {
    EXPECT_NE(command.find(part), std::string::npos) << part << ": " << command;
  }
  for (const char* gone :
       {"--resume", "latest", "0.5", "--staleness-lr", "--seed=", ":0 "}) {
    EXPECT_EQ(command.find(gone), std::string::npos) << gone << ": " << command;
  }
  // Without its command line, the settings alone.
  EXPECT_EQ(ShardCommand({}, "", &s), ReproduceCommand(s));
}

TEST(ShardCommand, OtherShardsKeepTheirCommandLessResume) {
  const std::vector<std::string> argv = Words(
      "tether-server --shard-id 1 --shards 2 --listen=0.0.0.0:0 "
      "--coordinator 10.0.0.1:7070 --resume 3 --verbose");
  EXPECT_EQ(ShardCommand(argv, "0.0.0.0:40001"),
            "tether-server --shard-id 1 --shards 2 --listen 0.0.0.0:40001 "
            "--coordinator 10.0.0.1:7070 --verbose");
  // A port it chose itself stays as given.
  EXPECT_EQ(
      ShardCommand({"tether-server", "--listen", "[::1]:7071"}, "[::1]:7071"),
      "tether-server --listen '[::1]:7071'");
}

TEST(RunScript, StartsEveryProcessThenWaits) {
  EXPECT_EQ(RunScript({{"shard 0", "tether-server --shard-id 0"},
                       {"shard 1", ""},
                       {"worker 0", "tether-worker --rank 0"}}),
            "tether-server --shard-id 0 &\n"
            "# shard 1: command not known (not joined yet, or its client "
            "does not say)\n"
            "tether-worker --rank 0 &\n"
            "wait");
}

json::value Config(Monitor& monitor) {
  return json::parse(*monitor.Document("config"));
}

TEST(Monitor, ConfigListsEveryProcessAndItsCommand) {
  const RunSettings s = Settings();
  Monitor monitor(s);
  monitor.Tick();
  monitor.OnShardCommand(0, "tether-server --shard-id 0 --seed 42");
  monitor.OnShardCommand(1, "tether-server --shard-id 1");
  monitor.OnWorkerCommand(0, "tether-worker --rank 0");
  monitor.OnWorkerCommand(2, "tether-worker --rank 2 --slowdown 3");
  // Ranks may go beyond --workers, but not past the most a run can have.
  monitor.OnWorkerCommand(kMaxRanks, "out of range");  // ignored
  monitor.OnShardCommand(-1, "out of range");          // ignored
  json::value config = Config(monitor);
  const json::array& commands = config.at("commands").as_array();
  ASSERT_EQ(commands.size(), 5u) << config;
  const char* processes[] = {"shard 0", "shard 1", "worker 0", "worker 1",
                             "worker 2"};
  for (size_t i = 0; i < commands.size(); ++i) {
    EXPECT_EQ(commands[i].at("process"), processes[i]);
  }
  EXPECT_EQ(commands[1].at("command"), "tether-server --shard-id 1");
  EXPECT_TRUE(commands[3].at("command").is_null()) << "worker 1 never said";
  EXPECT_EQ(commands[4].at("command"), "tether-worker --rank 2 --slowdown 3");
  EXPECT_EQ(std::string(config.at("command").as_string()),
            "tether-server --shard-id 0 --seed 42 &\n"
            "tether-server --shard-id 1 &\n"
            "tether-worker --rank 0 &\n"
            "# worker 1: command not known (not joined yet, or its client "
            "does not say)\n"
            "tether-worker --rank 2 --slowdown 3 &\n"
            "wait");

  // The next update carries the changed config, the one after does not.
  EXPECT_TRUE(json::parse(monitor.Tick()).as_object().contains("config"));
  EXPECT_FALSE(json::parse(monitor.Tick()).as_object().contains("config"));
  monitor.OnWorkerCommand(2, "tether-worker --rank 2 --slowdown 3");  // same
  EXPECT_FALSE(json::parse(monitor.Tick()).as_object().contains("config"));
  monitor.OnWorkerCommand(1, "tether-worker --rank 1");
  json::value update = json::parse(monitor.Tick());
  ASSERT_TRUE(update.as_object().contains("config"));
  EXPECT_EQ(update.at("config").at("commands").at(3).at("command"),
            "tether-worker --rank 1");
}

TEST(Monitor, AnOversizedCommandIsNotKept) {
  Monitor monitor(Settings());
  monitor.OnWorkerCommand(
      0, "tether-worker " + std::string(Monitor::kMaxCommandBytes, 'x'));
  const std::string kept(
      Config(monitor).at("commands").at(2).at("command").as_string());
  EXPECT_LT(kept.size(), 200u);
  EXPECT_EQ(kept.rfind("# ", 0), 0u) << kept;
}

}  // namespace
}  // namespace tether
